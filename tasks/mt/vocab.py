"""A sentencepiece vocabulary: training from text and encoding/decoding.

The vocabulary is trained from the training text by the tool command::

  .venv/bin/python -m tools.build_vocab --corpus=numbers \\
      --output_prefix=/tmp/gpipe_data/mt/numbers_spm --vocab_size=512

Ids 0..3 are fixed: pad, unk, bos (<s>), eos (</s>). Target-language tags
(``<2de>``...) are user-defined symbols, so each is always one token.
"""

import os

from gpipe import lingvo_import  # pylint: disable=unused-import
import sentencepiece as spm
from tasks.mt import corpus

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

DATA_DIR = os.environ.get('GPIPE_DATA_DIR', '/tmp/gpipe_data')
NUMBERS_VOCAB = os.path.join(DATA_DIR, 'mt', 'numbers_spm.model')


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
          'text first: .venv/bin/python -m tools.build_vocab --corpus=numbers '
          '--output_prefix=%s (see tasks/mt/vocab.py)' %
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
