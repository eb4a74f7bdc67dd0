"""Lingvo's GPipeTransformerStack as a benchmark model, on both executors.

The model a Lingvo GPipe user already has: ``layers_with_gpipe.
GPipeTransformerStack`` (embeddings, encoder and decoder Transformer layers,
softmax and cross-entropy), time-major as Lingvo builds it. ``Build`` makes
the same params run on Lingvo's executor (impl 'lingvo') or, through the
one line ``gpipe.FromLingvo(p)``, on ours (impl 'gpipe'): same variables,
same layers, only the executor differs.
"""

import contextlib

from absl import flags
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import gpipe
import numpy as np
from lingvo import compat as tf
from lingvo.core import layers_with_gpipe
from lingvo.core import py_utils

MODEL = 'lingvo_stack'
VOCAB = 1024
LENGTH = 32


def StackParams(num_layers, width, num_stages, num_micro_batches):
  """GPipeTransformerStack params: L/2 encoder and L/2 decoder layers."""
  p = layers_with_gpipe.GPipeTransformerStack.Params().Set(
      name='stack', model_dim=width, num_encoder_layers=num_layers // 2,
      num_decoder_layers=num_layers - num_layers // 2, splits=num_stages,
      num_micro_batches=num_micro_batches, state_dtype=tf.float32,
      random_seed=1)
  p.emb_tpl.token_emb.Set(vocab_size=VOCAB, embedding_dim=width)
  p.emb_tpl.position_emb.embedding_dim = width
  p.emb_tpl.input_dropout_prob = 0.0
  p.softmax_tpl.Set(num_classes=VOCAB, input_dim=width, num_shards=1)
  for t in (p.encoder_tpl, p.decoder_tpl):
    t.source_dim = width
    t.tr_atten_tpl.num_attention_heads = max(1, width // 64)
    t.tr_atten_tpl.residual_dropout_prob = 0.0
    t.tr_atten_tpl.atten_dropout_prob = 0.0
    t.tr_fflayer_tpl.hidden_dim = 4 * width
    t.tr_fflayer_tpl.residual_dropout_prob = 0.0
    t.tr_fflayer_tpl.relu_dropout_prob = 0.0
  return p


def Build(config, devices, lingvo_cluster):
  """The stack's loss on one executor.

  Args:
    config: a runner.Config with model 'lingvo_stack', impl 'gpipe' or
      'lingvo'.
    devices: the stage devices.
    lingvo_cluster: function(devices) -> the Lingvo cluster context whose
      model split is `devices` (Lingvo's executor places cells by it).

  Returns:
    (layer, loss).
  """
  c = config
  if not flags.FLAGS.is_parsed():
    # Lingvo's layers read absl flags (--tflite_compatible); this binary
    # parses its own arguments: take the defaults.
    flags.FLAGS.mark_as_parsed()
  p = StackParams(c.num_layers, c.width, c.num_stages, c.num_micro_batches)
  rng = np.random.RandomState(0)
  with tf.device(devices[0]):
    ids = [tf.constant(rng.randint(1, VOCAB, (LENGTH, c.batch)), tf.int32)
           for _ in range(3)]
    paddings = tf.zeros((LENGTH, c.batch))
  if c.impl == 'gpipe':
    p = gpipe.FromLingvo(p).Set(stage_devices=list(devices), remat=c.remat)
    context = contextlib.nullcontext()
  elif c.impl == 'lingvo':
    context = lingvo_cluster(devices)
  else:
    raise ValueError("%s runs on impl 'gpipe' or 'lingvo', not %r" %
                     (MODEL, c.impl))
  with context:
    py_utils.GetOrCreateGlobalStepVar()
    net = p.Instantiate()
    xent, _ = net.FProp(net.theta, ids[0], paddings, ids[1], paddings,
                        labels=ids[2], label_weights=1.0 - paddings)
  with tf.device(devices[-1]):
    loss = tf.reduce_mean(xent)
  return net, loss
