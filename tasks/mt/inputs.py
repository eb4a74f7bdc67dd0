"""Multilingual translation inputs: the offline number corpus and tfds corpora.

Every input yields examples with static shapes (see `EncodePair`)::

  src_ids [src_len] int32      '<2xx>' tag + source tokens, 0-padded
  src_paddings [src_len]       1.0 at padding
  tgt_ids [tgt_len] int32      <s> + target tokens (decoder input)
  tgt_labels [tgt_len] int32   target tokens + </s> (what to predict)
  tgt_paddings, tgt_weights [tgt_len]
  tgt_text, pair               scalar strings: reference text, e.g. 'fr-ru'

Language pairs are mixed by temperature-based sampling
(`corpus.PairSamplingProbs`) in training, and concatenated pair by pair in
evaluation (so BLEU can be reported per pair).
"""

import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from lingvo import compat as tf
from tasks import dataset_input
from tasks.mt import corpus
from tasks.mt import vocab as vocab_lib


def EncodePair(vocab, source, target, src_len, tgt_len):
  """Numpy arrays of one example (see the module docstring), truncated.

  Args:
    vocab: a `vocab.Vocab`.
    source: source text (with its target-language tag).
    target: target text.
    src_len: static source length.
    tgt_len: static target length (including <s> / </s>).

  Returns:
    A dict of numpy arrays: src_ids, src_paddings, tgt_ids, tgt_labels,
    tgt_paddings, tgt_weights.
  """
  src = vocab.Encode(source)[:src_len]
  tgt = vocab.Encode(target)[:tgt_len - 1]
  ex = {
      'src_ids': np.zeros([src_len], np.int32),
      'src_paddings': np.ones([src_len], np.float32),
      'tgt_ids': np.zeros([tgt_len], np.int32),
      'tgt_labels': np.zeros([tgt_len], np.int32),
      'tgt_paddings': np.ones([tgt_len], np.float32),
  }
  ex['src_ids'][:len(src)] = src
  ex['src_paddings'][:len(src)] = 0.0
  ex['tgt_ids'][:len(tgt) + 1] = [vocab_lib.BOS_ID] + tgt
  ex['tgt_labels'][:len(tgt) + 1] = tgt + [vocab_lib.EOS_ID]
  ex['tgt_paddings'][:len(tgt) + 1] = 0.0
  ex['tgt_weights'] = 1.0 - ex['tgt_paddings']
  return ex


def _MixPairs(per_pair, pair_sizes, temperature, repeat, seed):
  """Temperature-sampled mixture (training) or concatenation (evaluation)."""
  if not repeat:
    ds = per_pair[0]
    for d in per_pair[1:]:
      ds = ds.concatenate(d)
    return ds
  probs = corpus.PairSamplingProbs(pair_sizes, temperature)
  return tf.data.Dataset.sample_from_datasets(
      [d.repeat() for d in per_pair], weights=list(probs.values()), seed=seed)


class _TranslationInputBase(dataset_input.DatasetInput):
  """Params shared by the translation inputs."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_path', vocab_lib.NUMBERS_VOCAB,
             'sentencepiece .model file (built by tools.build_vocab; the '
             'number corpus input builds a missing NUMBERS_VOCAB itself).')
    p.Define('src_len', 16, 'Static source length in tokens (truncated).')
    p.Define('tgt_len', 16, 'Static target length in tokens (truncated).')
    p.Define('temperature', 5.0,
             'Language-pair sampling temperature T (1 = by data size).')
    p.Define('max_vocab_size', 0,
             "The model's vocabulary size: a vocabulary with more pieces is "
             'refused (its ids would not fit the embedding). 0: no check.')
    return p

  def ExampleSpecs(self):
    """One example as Examples() yields it (for p.stand_in)."""
    p = self.params
    src, tgt = [p.src_len], [p.tgt_len]
    return {
        'src_ids': tf.TensorSpec(src, tf.int32),
        'src_paddings': tf.TensorSpec(src, tf.float32),
        'tgt_ids': tf.TensorSpec(tgt, tf.int32),
        'tgt_labels': tf.TensorSpec(tgt, tf.int32),
        'tgt_paddings': tf.TensorSpec(tgt, tf.float32),
        'tgt_weights': tf.TensorSpec(tgt, tf.float32),
        'tgt_text': tf.TensorSpec([], tf.string),
        'pair': tf.TensorSpec([], tf.string),
    }

  def _BuildMissingVocab(self):
    """Builds a missing `vocab_path` if this input can; by default it cannot."""

  def _Vocab(self):
    if not hasattr(self, '_vocab'):
      p = self.params
      self._BuildMissingVocab()
      vocab = vocab_lib.Vocab(p.vocab_path)
      if p.max_vocab_size and vocab.size > p.max_vocab_size:
        raise ValueError(
            '%s: the vocabulary %s has %d pieces but the model embeds only '
            '%d ids; rebuild it with tools.build_vocab --vocab_size=%d (or '
            'raise the model\'s vocab_size)' %
            (p.name, p.vocab_path, vocab.size, p.max_vocab_size,
             p.max_vocab_size))
      self._vocab = vocab
    return self._vocab


class NumberTranslationInput(_TranslationInputBase):
  """The offline many-to-many corpus of spelled-out numbers (see corpus.py)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('languages', corpus.DEFAULT_LANGUAGES, 'num2words languages.')
    p.Define('max_number', 1000, 'Numbers come from [0, max_number).')
    p.Define('test_fraction', 0.1, 'Fraction of numbers held out for test.')
    p.Define('split_seed', 0, 'Seed of the train/test number split.')
    p.Define('split', 'train', "'train' or 'test' numbers.")
    p.Define('max_examples_per_pair', 0,
             'If > 0, keep only this many numbers per pair (a deterministic '
             'subset, e.g. for a fast evaluation).')
    return p

  def Pairs(self):
    """{(src_lang, tgt_lang): [(source, target, number)]} of this split."""
    p = self.params
    if p.split not in ('train', 'test'):
      raise ValueError("%s: split must be 'train' or 'test', got %r" %
                       (p.name, p.split))
    train, test = corpus.SplitNumbers(p.max_number, p.test_fraction,
                                      p.split_seed)
    numbers = train if p.split == 'train' else test
    pairs = corpus.NumberPairs(numbers, p.languages)
    if p.max_examples_per_pair > 0:
      rng = np.random.RandomState(p.split_seed + 1)
      for key, examples in pairs.items():
        keep = sorted(rng.permutation(len(examples))[:p.max_examples_per_pair])
        pairs[key] = [examples[i] for i in keep]
    return pairs

  def _BuildMissingVocab(self):
    """Trains a missing `vocab_lib.NUMBERS_VOCAB` on this corpus's text."""
    p = self.params
    if os.path.exists(p.vocab_path) or not vocab_lib.IsNumbersModel(
        p.vocab_path):
      return  # Another missing path fails in Vocab, saying how to build it.
    vocab_lib.BuildNumbersModel(
        p.vocab_path, p.max_vocab_size or vocab_lib.NUMBERS_VOCAB_SIZE,
        p.languages, p.max_number, p.test_fraction, p.split_seed)

  def Examples(self):
    p = self.params
    vocab = self._Vocab()
    pairs = self.Pairs()
    per_pair = []
    for (src, tgt), examples in pairs.items():
      encoded = [EncodePair(vocab, s, t, p.src_len, p.tgt_len)
                 for s, t, _ in examples]
      columns = {k: np.stack([e[k] for e in encoded]) for k in encoded[0]}
      columns['tgt_text'] = np.array([t for _, t, _ in examples], dtype=object)
      columns['pair'] = np.array(['%s-%s' % (src, tgt)] * len(examples),
                                 dtype=object)
      per_pair.append(tf.data.Dataset.from_tensor_slices(columns))
    sizes = {key: len(examples) for key, examples in pairs.items()}
    return _MixPairs(per_pair, sizes, p.temperature, p.repeat, p.seed)


class TfdsTranslationInput(_TranslationInputBase):
  """A tensorflow-datasets translation corpus, one or many language pairs.

  Supports both tfds layouts: one feature per language (``wmt14_translate/
  de-en``: {'de': text, 'en': text}) and ``ted_multi_translate``'s
  ``translations`` {'language': [...], 'translation': [...]} (each talk in
  many languages; every requested pair present in an example yields one
  example).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dataset_name', 'ted_multi_translate', 'tfds name (with config).')
    p.Define('split', 'train', 'tfds split.')
    p.Define('data_dir', None, 'tfds data_dir (None: tfds default).')
    p.Define('download', False,
             'Let tfds download and prepare a missing corpus into data_dir '
             '(needs network access). False: it must be prepared already '
             '(`tfds build`).')
    p.Define('language_pairs', [('de', 'en'), ('en', 'de')],
             'The (source, target) language pairs to read.')
    p.Define('pair_sizes', None,
             'Optional {(src, tgt): number of examples} for temperature '
             'sampling; None samples the pairs uniformly.')
    return p

  def _PairTexts(self, ds, src, tgt):
    """(source, target) text dataset of one pair."""
    if 'translations' in ds.element_spec:

      def _Has(ex):
        langs = ex['translations']['language']
        return tf.logical_and(
            tf.reduce_any(tf.equal(langs, src)),
            tf.reduce_any(tf.equal(langs, tgt)))

      def _Pick(ex):
        langs = ex['translations']['language']
        texts = ex['translations']['translation']
        index = lambda l: tf.argmax(tf.cast(tf.equal(langs, l), tf.int32))
        return tf.gather(texts, index(src)), tf.gather(texts, index(tgt))

      return ds.filter(_Has).map(_Pick)
    missing = [l for l in (src, tgt) if l not in ds.element_spec]
    if missing:
      raise ValueError('%s: %s has no language(s) %s; its features are %s' %
                       (self.params.name, self.params.dataset_name, missing,
                        sorted(ds.element_spec)))
    return ds.map(lambda ex: (ex[src], ex[tgt]))

  def Examples(self):
    p = self.params
    vocab = self._Vocab()
    ds = dataset_input.LoadTfds(p.dataset_name, p.split, p.data_dir,
                                download=p.download)
    keys = ('src_ids', 'src_paddings', 'tgt_ids', 'tgt_labels',
            'tgt_paddings', 'tgt_weights')
    dtypes = (tf.int32, tf.float32, tf.int32, tf.int32, tf.float32, tf.float32)
    lengths = (p.src_len, p.src_len, p.tgt_len, p.tgt_len, p.tgt_len,
               p.tgt_len)

    def _MakeEncoder(src, tgt):
      tag = corpus.LanguageTag(tgt)

      def _Encode(source, target):
        ex = EncodePair(vocab, '%s %s' % (tag, source.decode('utf-8')),
                        target.decode('utf-8'), p.src_len, p.tgt_len)
        return tuple(ex[k] for k in keys)

      def _Map(source, target):
        arrays = tf.numpy_function(_Encode, [source, target], list(dtypes))
        ex = {
            k: tf.ensure_shape(a, [n])
            for k, a, n in zip(keys, arrays, lengths)
        }
        ex['tgt_text'] = target
        ex['pair'] = tf.constant('%s-%s' % (src, tgt))
        return ex

      return _Map

    per_pair = [
        self._PairTexts(ds, src, tgt).map(_MakeEncoder(src, tgt))
        for src, tgt in p.language_pairs
    ]
    sizes = p.pair_sizes or {tuple(pair): 1 for pair in p.language_pairs}
    sizes = {tuple(pair): sizes[tuple(pair)] for pair in p.language_pairs}
    return _MixPairs(per_pair, sizes, p.temperature, p.repeat, p.seed)


def TfdsSentences(dataset_name, languages, split='train', data_dir=None,
                  max_sentences=0):
  """The texts in `languages` of a prepared tfds translation corpus.

  The training text of a vocabulary (``tools.build_vocab --corpus=tfds``).
  Reads both layouts of `TfdsTranslationInput`.

  Args:
    dataset_name: the tfds name, e.g. 'ted_multi_translate' or
      'wmt14_translate/de-en'.
    languages: the language codes to keep, e.g. ['en', 'de'].
    split: the tfds split.
    data_dir: where the prepared corpus is (None: tfds's default).
    max_sentences: stop after this many sentences (0: read all).

  Returns:
    A list of str.

  Raises:
    ValueError: the corpus is not prepared (see dataset_input.LoadTfds), or
      it has none of `languages`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  wanted = set(languages)
  sentences = []
  ds = dataset_input.LoadTfds(dataset_name, split, data_dir)
  # tfds.as_numpy reads in graph mode too (Lingvo's).
  for ex in tfds.as_numpy(ds):
    if 'translations' in ex:
      texts = zip(ex['translations']['language'],
                  ex['translations']['translation'])
    else:
      texts = [(l.encode(), ex[l]) for l in languages if l in ex]
    for language, text in texts:
      if language.decode() in wanted:
        sentences.append(text.decode('utf-8'))
        if len(sentences) == max_sentences:
          return sentences
  if not sentences:
    raise ValueError('%s (split %r) has no text in the languages %s' %
                     (dataset_name, split, ', '.join(languages)))
  return sentences
