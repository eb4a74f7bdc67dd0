"""Registered multilingual Transformer configurations.

Names are ``mt.<ClassName>`` (Lingvo's registry):

* T(L, H, A): L encoder and L decoder layers, feed-forward H, A heads, model
  dimension 1024, vocabulary 64k (the paper's multilingual NMT models):
  ``mt.T6_8192_16`` (400M), ``mt.T24_8192_16`` (1.3B, 4 stages),
  ``mt.T12_16384_32`` (1.3B, 2 stages), ``mt.T32_16384_32`` (3B, 8 stages),
  ``mt.T64_16384_32`` (6B, 128 layers, 16 stages). They read
  ``ted_multi_translate`` (tfds: prepare it with ``tfds build``, see the
  README's "Training on real data") with temperature T=5
  sampling of the language pairs. Deep models scale the feed-forward init by
  1/L and clip logits, the paper's trainability fixes.
* Transformer-L (Table 1): decoder-only language models with d_model 2048,
  ffn 8192, 32 heads, vocabulary 32k, sequence 1024, batch 32:
  ``mt.TransformerL_3`` ... ``mt.TransformerL_1663`` (282.2M ... 83.9B) and
  ``mt.Transformer48`` (Table 2's throughput model).
* ``mt.NumbersSmall``: the offline default, a small T(3, 512, 4) with
  d_model 128 on the num2words corpus in 10 languages (90 pairs),
  2 stages x 4 micro-batches, trains on a CPU; ``mt.NumbersTiny`` the same
  at d_model 32 for tests.

Parameter counts (trainable, from the built layer graphs, see
tasks/mt/stack.py and tests/mt_params_test.py):
T6_8192_16 408.2M; T24_8192_16 1.24B; T12_16384_32 1.09B; T32_16384_32 2.68B;
T64_16384_32 5.23B; TransformerL 3/13/103/415/1663: 282.2M / 785.8M / 5.32B /
21.03B / 83.88B.

``mt.NumbersSmall`` builds its missing vocabulary from the number corpus on
first use (at tasks/mt/vocab.py's NUMBERS_VOCAB, vocabulary VOCAB_SIZE). The
tfds configurations need theirs built from the training text before training,
with ``.venv/bin/python -m tools.build_vocab --corpus=text ...``.
"""

import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import optimizer
from lingvo.core import schedule
from lingvo.core import tshape
from tasks.mt import corpus
from tasks.mt import inputs
from tasks.mt import model
from tasks.mt import stack
from tasks.mt import vocab


class TransformerMTBase(base_model_params.SingleTaskModelParams):
  """An encoder-decoder Transformer T(L, H, A) on ted_multi_translate.

  Subclasses set the class attributes below.
  """
  VOCAB_SIZE = 64000
  VOCAB_PATH = os.path.join(vocab.DATA_DIR, 'mt', 'ted_spm64k.model')
  MODEL_DIM = 1024
  HIDDEN_DIM = 8192
  NUM_HEADS = 16
  NUM_LAYERS = 6
  NUM_STAGES = 2
  NUM_MICRO_BATCHES = 8
  BATCH_SIZE = 64
  SRC_LEN = 128
  TGT_LEN = 128
  DROPOUT = 0.1
  LABEL_SMOOTHING = 0.1
  LOGITS_ABS_MAX = 0.0
  SCALE_FFN_INIT = False
  TEMPERATURE = 5.0
  LANGUAGES = ('en', 'de', 'fr', 'es', 'it', 'pt', 'ru', 'ja', 'ko', 'zh-cn')
  LEARNING_RATE = 1.0
  WARMUP_STEPS = 4000
  MAX_STEPS = 500000
  BEAM_SIZE = 4

  def _Input(self, split, is_training):
    pairs = corpus.LanguagePairs(self.LANGUAGES)
    return inputs.TfdsTranslationInput.Params().Set(
        dataset_name='ted_multi_translate', split=split,
        language_pairs=pairs, vocab_path=self.VOCAB_PATH,
        max_vocab_size=self.VOCAB_SIZE,
        src_len=self.SRC_LEN, tgt_len=self.TGT_LEN,
        temperature=self.TEMPERATURE, batch_size=self.BATCH_SIZE,
        repeat=is_training, shuffle_buffer=10000 if is_training else 0)

  def Train(self):
    return self._Input('train', True)

  def Test(self):
    return self._Input('test', False)

  def Layers(self):
    """The flat list of the network's layer params."""
    return stack.EncoderDecoderLayers(
        vocab_size=self.VOCAB_SIZE, model_dim=self.MODEL_DIM,
        hidden_dim=self.HIDDEN_DIM, num_heads=self.NUM_HEADS,
        num_layers=self.NUM_LAYERS, dropout_prob=self.DROPOUT,
        label_smoothing=self.LABEL_SMOOTHING,
        logits_abs_max=self.LOGITS_ABS_MAX,
        scale_ffn_init_by_num_layers=self.SCALE_FFN_INIT)

  def InputShapes(self):
    """Shapes of one micro-batch of the network input (for flops costs).

    Returns:
      A one-element list (the network has one input): a dict of shapes.
    """
    micro = self.BATCH_SIZE // self.NUM_MICRO_BATCHES
    src = tshape.Shape([micro, self.SRC_LEN])
    tgt = tshape.Shape([micro, self.TGT_LEN])
    shapes = dict(tgt_ids=tgt, tgt_paddings=tgt, tgt_labels=tgt,
                  tgt_weights=tgt)
    if self.Layers()[0].has_source:
      shapes.update(src_ids=src, src_paddings=src)
    return [shapes]

  def Pipeline(self):
    """The PipeliningLayer over `Layers()`, cut by flops."""
    return pipeline.PipeliningLayer.Params().Set(
        name='network', layers=self.Layers(), num_stages=self.NUM_STAGES,
        num_micro_batches=self.NUM_MICRO_BATCHES, partition_cost='flops',
        input_shapes=self.InputShapes())

  def _Optimize(self, p):
    tp = p.train
    tp.optimizer = optimizer.Adam.Params().Set(beta1=0.9, beta2=0.98,
                                               epsilon=1e-9)
    tp.learning_rate = self.LEARNING_RATE
    tp.lr_schedule = schedule.TransformerSchedule.Params().Set(
        warmup_steps=self.WARMUP_STEPS, model_dim=self.MODEL_DIM)
    tp.clip_gradient_norm_to_value = 1.0
    tp.max_steps = self.MAX_STEPS
    return p

  def Task(self):
    p = model.TransformerMTTask.Params().Set(
        name='mt', network=self.Pipeline(), vocab_path=self.VOCAB_PATH,
        max_decode_len=self.TGT_LEN, beam_size=self.BEAM_SIZE)
    return self._Optimize(p)


@model_registry.RegisterSingleTaskModel
class T6_8192_16(TransformerMTBase):  # pylint: disable=invalid-name
  """T(6, 8192, 16): ~400M parameters (408.2M counted), 2 stages."""


class _DeepTransformerMT(TransformerMTBase):
  """Deep T(L, H, A): the paper's trainability fixes switched on."""
  SCALE_FFN_INIT = True
  LOGITS_ABS_MAX = 20.0


@model_registry.RegisterSingleTaskModel
class T24_8192_16(_DeepTransformerMT):  # pylint: disable=invalid-name
  """T(24, 8192, 16): "1.3B" in the paper (1.24B counted), 4 stages."""
  NUM_LAYERS = 24
  NUM_STAGES = 4
  NUM_MICRO_BATCHES = 16


@model_registry.RegisterSingleTaskModel
class T12_16384_32(_DeepTransformerMT):  # pylint: disable=invalid-name
  """T(12, 16384, 32): "1.3B" in the paper (1.09B counted), 2 stages."""
  HIDDEN_DIM = 16384
  NUM_HEADS = 32
  NUM_LAYERS = 12
  NUM_STAGES = 2


@model_registry.RegisterSingleTaskModel
class T32_16384_32(_DeepTransformerMT):  # pylint: disable=invalid-name
  """T(32, 16384, 32): "3B" in the paper (2.68B counted), 8 stages."""
  HIDDEN_DIM = 16384
  NUM_HEADS = 32
  NUM_LAYERS = 32
  NUM_STAGES = 8
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class T64_16384_32(_DeepTransformerMT):  # pylint: disable=invalid-name
  """T(64, 16384, 32): "6B", 128 Transformer layers (5.23B counted), 16 stages."""
  HIDDEN_DIM = 16384
  NUM_HEADS = 32
  NUM_LAYERS = 64
  NUM_STAGES = 16
  NUM_MICRO_BATCHES = 64
  BATCH_SIZE = 256


class TransformerLBase(TransformerMTBase):
  """Table 1's Transformer-L: a decoder-only LM (separate emb. and softmax).

  d_model 2048, ffn 8192, 32 heads, vocab 32k, sequence 1024, batch 32. It
  reads the target side of the translation input as language-model text.
  """
  VOCAB_SIZE = 32000
  VOCAB_PATH = os.path.join(vocab.DATA_DIR, 'mt', 'ted_spm32k.model')
  MODEL_DIM = 2048
  HIDDEN_DIM = 8192
  NUM_HEADS = 32
  SRC_LEN = 1
  TGT_LEN = 1024
  BATCH_SIZE = 32
  NUM_STAGES = 1
  NUM_MICRO_BATCHES = 1
  DROPOUT = 0.0
  LABEL_SMOOTHING = 0.0

  def Layers(self):
    return stack.DecoderOnlyLayers(
        vocab_size=self.VOCAB_SIZE, model_dim=self.MODEL_DIM,
        hidden_dim=self.HIDDEN_DIM, num_heads=self.NUM_HEADS,
        num_layers=self.NUM_LAYERS, dropout_prob=self.DROPOUT,
        label_smoothing=self.LABEL_SMOOTHING,
        logits_abs_max=self.LOGITS_ABS_MAX,
        scale_ffn_init_by_num_layers=self.SCALE_FFN_INIT)


def _TransformerL(num_layers, num_stages, micro_batches):
  """A registered Transformer-L config class."""

  class _Config(TransformerLBase):
    NUM_LAYERS = num_layers
    NUM_STAGES = num_stages
    NUM_MICRO_BATCHES = micro_batches

  _Config.__name__ = _Config.__qualname__ = 'TransformerL_%d' % num_layers
  _Config.__doc__ = ('Table 1 Transformer-L, L=%d, on %d stage(s), M=%d.' %
                     (num_layers, num_stages, micro_batches))
  return model_registry.RegisterSingleTaskModel(_Config)


# Table 1: Naive-1, Pipeline-1, -8, -32, -128 (M = 32 for K > 1).
TransformerL_3 = _TransformerL(3, 1, 1)
TransformerL_13 = _TransformerL(13, 1, 1)
TransformerL_103 = _TransformerL(103, 8, 32)
TransformerL_415 = _TransformerL(415, 32, 32)
TransformerL_1663 = _TransformerL(1663, 128, 32)


@model_registry.RegisterSingleTaskModel
class Transformer48(TransformerLBase):
  """Table 2's Transformer-48 (d_model 2048): K=8, M=32 by default."""
  NUM_LAYERS = 48
  NUM_STAGES = 8
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class NumbersSmall(TransformerMTBase):
  """The offline default: T(3, 512, 4), d_model 128, on the number corpus.

  Numbers 0-999 spelled out by num2words in 10 languages, all 90 ordered
  pairs, 10% of the numbers held out for test; 2 stages x 4 micro-batches.
  """
  VOCAB_SIZE = 512
  VOCAB_PATH = vocab.NUMBERS_VOCAB
  MODEL_DIM = 128
  HIDDEN_DIM = 512
  NUM_HEADS = 4
  NUM_LAYERS = 3
  NUM_STAGES = 2
  NUM_MICRO_BATCHES = 4
  BATCH_SIZE = 64
  SRC_LEN = 14
  TGT_LEN = 14
  DROPOUT = 0.1
  LABEL_SMOOTHING = 0.1
  LEARNING_RATE = 1.0
  WARMUP_STEPS = 400
  MAX_STEPS = 3000
  BEAM_SIZE = 1
  TEST_EXAMPLES_PER_PAIR = 20

  def _Input(self, split, is_training):
    return inputs.NumberTranslationInput.Params().Set(
        split=split, vocab_path=self.VOCAB_PATH, src_len=self.SRC_LEN,
        max_vocab_size=self.VOCAB_SIZE,
        tgt_len=self.TGT_LEN, temperature=self.TEMPERATURE,
        batch_size=self.BATCH_SIZE, repeat=is_training,
        shuffle_buffer=10000 if is_training else 0,
        max_examples_per_pair=0 if is_training else
        self.TEST_EXAMPLES_PER_PAIR)

  def Train(self):
    return self._Input('train', True)

  def Test(self):
    return self._Input('test', False)


@model_registry.RegisterSingleTaskModel
class NumbersTiny(NumbersSmall):
  """``mt.NumbersSmall`` at a size tests train in seconds: T(2, 64, 2).

  d_model 32 on the same corpus and vocabulary, batch 32, 2 stages x 2
  micro-batches; decoded pipelined in 4 lanes by default (the trainer's
  tests of evaluation and pipelined decoding).
  """
  MODEL_DIM = 32
  HIDDEN_DIM = 64
  NUM_HEADS = 2
  NUM_LAYERS = 2
  NUM_MICRO_BATCHES = 2
  BATCH_SIZE = 32
  DROPOUT = 0.0
  LEARNING_RATE = 3.0
  WARMUP_STEPS = 50
  MAX_STEPS = 100
  TEST_EXAMPLES_PER_PAIR = 2


@model_registry.RegisterSingleTaskModel
class T64Structure_Numbers(NumbersSmall):  # pylint: disable=invalid-name
  """The structure of ``T64_16384_32`` at a width a 2-core CPU can train.

  64 encoder + 64 decoder layers (128 Transformer layers), 16 stages, 32
  micro-batches and the deep-model fixes of T64_16384_32 (feed-forward init
  scaled by 1/L, clipped logits), but d_model 32, feed-forward 64, 2 heads on
  the offline number corpus: the pipeline's shape at scale (16 worker
  processes, 16 x 32 stage calls per pass) without its 5.23B parameters::

    .venv/bin/python -m tools.trainer --model=mt.T64Structure_Numbers \\
        --logdir=/tmp/t64 --worker_processes=16 --max_steps=3 \\
        --log_every_n_steps=1 --eval_after_train=false \\
        --step_timeout_secs=2400 --trace_every_n_steps=0

  (Measured in docs/BENCHMARKS.md, "Start-up": about 5 minutes from the
  trainer's start to the end of its first step; worker 0, the session's
  master, peaks at about 3.6 GB and the trainer at about 4.8 GB. "Scale": a
  traced step needs more than 23 GB.)
  """
  MODEL_DIM = 32
  HIDDEN_DIM = 64
  NUM_HEADS = 2
  NUM_LAYERS = 64
  NUM_STAGES = 16
  NUM_MICRO_BATCHES = 32
  BATCH_SIZE = 64
  SCALE_FFN_INIT = True
  LOGITS_ABS_MAX = 20.0


@model_registry.RegisterSingleTaskModel
class T64Structure_Tiny(T64Structure_Numbers):  # pylint: disable=invalid-name
  """The suite's stand-in for the 16-worker scale run (``//tests:scale_test``).

  The same pipeline shape as ``T64Structure_Numbers`` (16 stages on 16 worker
  processes, the deep-model fixes) with 8 + 8 Transformer layers at d_model 16
  and 16 micro-batches, so it builds and trains a few steps in minutes on a
  2-core CPU.
  """
  MODEL_DIM = 16
  HIDDEN_DIM = 32
  NUM_LAYERS = 8
  NUM_MICRO_BATCHES = 16
  BATCH_SIZE = 32
