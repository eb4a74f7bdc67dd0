"""The offline many-to-many number corpus and temperature sampling of pairs.

The default multilingual task needs no download: it translates numbers
spelled out by `num2words` (real language rules: agreement, irregular tens,
conjunctions) between every ordered pair of languages, e.g.::

  source: "<2ru> trois cent quarante-deux"   target: "триста сорок два"

The source starts with a target-language tag ``<2xx>``, as in the paper's
single multilingual model. Train and test use disjoint sets of numbers, so the
test measures generalization to unseen numbers.

`PairSamplingProbs` implements temperature-based sampling of language pairs:
p(pair) is proportional to (n_pair / N)^(1/T); T=1 samples in proportion to
data size, larger T flattens towards uniform (helping low-resource pairs).
"""

import collections

from num2words import num2words
import numpy as np

# Languages whose num2words output separates number words by spaces, which
# keeps word-level BLEU meaningful (German, Italian, Turkish... write a number
# as one compound word).
DEFAULT_LANGUAGES = ('en', 'fr', 'es', 'pt', 'ru', 'pl', 'cs', 'id', 'ro',
                     'lt')


def LanguageTag(language):
  """The target-language tag token put in front of the source, e.g. <2de>."""
  return '<2%s>' % language


def SplitNumbers(max_number, test_fraction=0.1, seed=0):
  """Disjoint train and test numbers from [0, max_number).

  Args:
    max_number: numbers are drawn from range(max_number).
    test_fraction: the fraction held out for test.
    seed: seed of the (deterministic) split.

  Returns:
    (train_numbers, test_numbers): two sorted lists of ints, disjoint.

  Raises:
    ValueError: the split leaves train or test empty.
  """
  order = np.random.RandomState(seed).permutation(max_number)
  num_test = int(round(max_number * test_fraction))
  if num_test < 1 or num_test >= max_number:
    raise ValueError(
        'test_fraction %s of %d numbers leaves an empty train or test set; '
        'use 0 < test_fraction < 1 and a larger max_number' %
        (test_fraction, max_number))
  return sorted(order[num_test:].tolist()), sorted(order[:num_test].tolist())


def Spell(number, language):
  """`number` in words in `language` (a num2words language code)."""
  try:
    return num2words(number, lang=language)
  except NotImplementedError as e:
    raise ValueError('num2words cannot spell numbers in language %r; pick '
                     'one of its supported codes (en, fr, ru, ...)' %
                     language) from e


def LanguagePairs(languages):
  """All ordered (source, target) pairs of distinct languages."""
  return [(s, t) for s in languages for t in languages if s != t]


def NumberPairs(numbers, languages):
  """The many-to-many parallel corpus of `numbers`.

  Args:
    numbers: an iterable of ints.
    languages: num2words language codes.

  Returns:
    An OrderedDict {(src_lang, tgt_lang): list of (source, target, number)},
    where source already carries the target-language tag.
  """
  numbers = list(numbers)
  spelled = {
      lang: [Spell(n, lang) for n in numbers] for lang in languages
  }
  corpus = collections.OrderedDict()
  for src, tgt in LanguagePairs(languages):
    corpus[(src, tgt)] = [
        ('%s %s' % (LanguageTag(tgt), s), t, n)
        for s, t, n in zip(spelled[src], spelled[tgt], numbers)
    ]
  return corpus


def TrainingText(numbers, languages):
  """Sentences to train the vocabulary on: each number in each language."""
  return [Spell(n, lang) for lang in languages for n in numbers]


def PairSamplingProbs(pair_sizes, temperature):
  """Temperature-based sampling probabilities of language pairs.

  Args:
    pair_sizes: {pair: number of training examples}.
    temperature: T >= 1 (any T > 0 works): 1 = proportional to size, larger
      = flatter, infinity = uniform.

  Returns:
    An OrderedDict {pair: probability} summing to 1, in `pair_sizes` order.

  Raises:
    ValueError: on a non-positive temperature or an empty or all-zero corpus.
  """
  if temperature <= 0:
    raise ValueError('sampling temperature must be > 0, got %s' % temperature)
  sizes = np.array([float(n) for n in pair_sizes.values()])
  if not len(sizes) or sizes.sum() <= 0:
    raise ValueError('no training examples in any language pair: %s' %
                     dict(pair_sizes))
  weights = (sizes / sizes.sum())**(1.0 / temperature)
  weights /= weights.sum()
  return collections.OrderedDict(zip(pair_sizes.keys(), weights.tolist()))
