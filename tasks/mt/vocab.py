"""A sentencepiece vocabulary: training from text and encoding/decoding.

The vocabulary is trained from the training text by the tool command::

  .venv/bin/python -m tools.build_vocab --corpus=numbers \\
      --output_prefix=/tmp/gpipe_data/mt/numbers_spm --vocab_size=512

The number corpus's model at `NUMBERS_VOCAB` needs no such step: its input
builds it on first use (`BuildNumbersModel`, a second or so).

Ids 0..3 are fixed: pad, unk, bos (<s>), eos (</s>). Target-language tags
(``<2de>``...) are user-defined symbols, so each is always one token.
"""

import os
import shutil
import sys
import tempfile
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import sentencepiece as spm
from tasks.mt import corpus

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

DATA_DIR = os.environ.get('GPIPE_DATA_DIR', '/tmp/gpipe_data')
NUMBERS_VOCAB = os.path.join(DATA_DIR, 'mt', 'numbers_spm.model')
# The size built when the input states none (tools.build_vocab's default,
# mt.NumbersSmall's VOCAB_SIZE).
NUMBERS_VOCAB_SIZE = 512


def Train(sentences, output_prefix, vocab_size, languages=(),
          model_type='unigram'):
  """Trains a sentencepiece model on `sentences`.

  Args:
    sentences: an iterable of training sentences (str).
    output_prefix: writes `<output_prefix>.model` and `.vocab`.
    vocab_size: the vocabulary size, including special and tag tokens.
    languages: target languages whose ``<2xx>`` tags become single tokens.
    model_type: 'unigram', 'bpe', 'char' or 'word'.

  Returns:
    The path of the trained `.model` file.
  """
  directory = os.path.dirname(output_prefix)
  if directory:
    os.makedirs(directory, exist_ok=True)
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(list(sentences)),
      model_prefix=output_prefix,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=1.0,
      pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
      user_defined_symbols=[corpus.LanguageTag(l) for l in languages],
      hard_vocab_limit=False,
      minloglevel=2)
  return output_prefix + '.model'


def IsNumbersModel(model_path):
  """Whether `model_path` names the number corpus's model, `NUMBERS_VOCAB`."""
  return os.path.abspath(model_path) == os.path.abspath(NUMBERS_VOCAB)


def _PublishOnce(built, model_path):
  """Moves `built` to `model_path` unless another process got there first.

  Returns:
    False if `model_path` already existed (it is left as it is, so every
    process ends up loading the same model).
  """
  try:
    # A hard link creates the name atomically and fails if it exists.
    os.link(built, model_path)
    return True
  except FileExistsError:
    return False
  except OSError:
    # A filesystem without hard links: a rename is still atomic, but the last
    # of two concurrent builds wins.
    os.replace(built, model_path)
    return True


def BuildNumbersModel(model_path, vocab_size,
                      languages=corpus.DEFAULT_LANGUAGES, max_number=1000,
                      test_fraction=0.1, split_seed=0):
  """Trains the number corpus's sentencepiece model and writes it to model_path.

  Only the training numbers are used (never the held-out ones), as by
  ``tools.build_vocab --corpus=numbers``. Prints a line to stderr before and
  after, since it runs inside a training or evaluation job. Safe when several
  processes build at once: each trains under a temporary name in the same
  directory and the first to finish publishes its model; the others use it.

  Args:
    model_path: the `.model` file to write (its `.vocab` is written too).
    vocab_size: the vocabulary size, including special and tag tokens.
    languages: the corpus's languages (their ``<2xx>`` tags become tokens).
    max_number: numbers come from [0, max_number).
    test_fraction: the held-out fraction of the numbers, left out.
    split_seed: seed of the train/test number split.

  Returns:
    `model_path`.

  Raises:
    ValueError: `model_path` does not end in '.model'.
  """
  if not model_path.endswith('.model'):
    raise ValueError('a sentencepiece model path ends in .model, got %s' %
                     model_path)
  print('building the sentencepiece model %s from the numbers corpus (vocab '
        '%d); once' % (model_path, vocab_size), file=sys.stderr, flush=True)
  start = time.time()
  train, _ = corpus.SplitNumbers(max_number, test_fraction, split_seed)
  directory = os.path.dirname(os.path.abspath(model_path))
  os.makedirs(directory, exist_ok=True)
  name = os.path.basename(model_path)[:-len('.model')]
  # In the same directory, so publishing is a link or rename, never a copy.
  scratch = tempfile.mkdtemp(prefix='.%s.building.' % name, dir=directory)
  try:
    built = Train(corpus.TrainingText(train, languages),
                  os.path.join(scratch, name), vocab_size, languages)
    if _PublishOnce(built, model_path):
      os.replace(built[:-len('.model')] + '.vocab',
                 model_path[:-len('.model')] + '.vocab')
      done = 'built %s in %.1f s' % (model_path, time.time() - start)
    else:
      done = ('%s was built by another process meanwhile; using it (%.1f s)' %
              (model_path, time.time() - start))
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  print(done, file=sys.stderr, flush=True)
  return model_path


class Vocab:
  """A loaded sentencepiece model with the project's id conventions."""

  def __init__(self, model_path):
    """Loads `model_path`.

    Args:
      model_path: a `.model` file written by `Train` / tools.build_vocab.

    Raises:
      FileNotFoundError: with the command that builds the file.
    """
    if not os.path.exists(model_path):
      raise FileNotFoundError(
          'sentencepiece model %s does not exist. Build it from the training '
          'text first: .venv/bin/python -m tools.build_vocab --output_prefix=%s'
          ' --vocab_size=<the model\'s> with --corpus=numbers (the number '
          'corpus) or --corpus=tfds --tfds_name=<corpus> --data_dir=<dir> (a '
          'prepared tfds corpus); see tools/build_vocab.py' %
          (model_path, model_path[:-len('.model')]
           if model_path.endswith('.model') else model_path))
    self.path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)
    if (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id()) != (
        PAD_ID, BOS_ID, EOS_ID):
      raise ValueError('%s was not trained with pad/bos/eos ids %d/%d/%d; '
                       'rebuild it with tools.build_vocab' %
                       (model_path, PAD_ID, BOS_ID, EOS_ID))

  @property
  def size(self):
    """The number of tokens."""
    return self._sp.get_piece_size()

  def PieceToId(self, piece):
    """The id of one vocabulary piece (UNK_ID if it is not a piece)."""
    return self._sp.piece_to_id(piece)

  def Encode(self, text):
    """Token ids of `text` (no bos/eos)."""
    return self._sp.encode(text)

  def Decode(self, ids):
    """Text of `ids`, stopping at the first eos and skipping pad/bos.

    Ids at or above `size` are skipped too: a model whose softmax is wider than
    the vocabulary (vocab_size rounded up) can emit them while untrained.
    """
    kept = []
    size = self.size
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID) and 0 <= i < size:
        kept.append(i)
    return self._sp.decode(kept)
