"""Corpus BLEU with sacrebleu, overall and per language pair.

BLEU uses sacrebleu's default 13a tokenization and 4-gram order with
``effective_order=True``: n-gram orders that no hypothesis and reference of
the corpus contain are left out of the geometric mean. That matters for short
outputs: Russian, Polish and Czech spell every number below 1000 in at most
three words, so a corpus of them has no 4-grams and plain BLEU is 0 even for
perfect translations. When every order occurs, the score is the standard one.
"""

import collections

from sacrebleu import metrics as sacrebleu_metrics
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo.core import metrics


def CorpusBleu(hypotheses, references):
  """sacrebleu corpus BLEU (0-100) of parallel lists of strings."""
  if not hypotheses:
    return 0.0
  scorer = sacrebleu_metrics.BLEU(effective_order=True)
  return float(scorer.corpus_score(list(hypotheses),
                                   [list(references)]).score)


def BleuByPair(hypotheses, references, pairs):
  """Overall BLEU and BLEU per language pair.

  Args:
    hypotheses: decoded strings.
    references: reference strings, parallel to `hypotheses`.
    pairs: language-pair names (e.g. 'fr-ru'), parallel to `hypotheses`.

  Returns:
    An OrderedDict {'overall': bleu, '<pair>': bleu, ...}, pairs sorted.
  """
  grouped = collections.defaultdict(lambda: ([], []))
  for hyp, ref, pair in zip(hypotheses, references, pairs):
    grouped[pair][0].append(hyp)
    grouped[pair][1].append(ref)
  result = collections.OrderedDict(
      overall=CorpusBleu(hypotheses, references))
  for pair in sorted(grouped):
    result[pair] = CorpusBleu(*grouped[pair])
  return result


class SacreBleuMetric(metrics.BaseMetric):
  """A Lingvo decoder metric accumulating sentences for sacrebleu BLEU."""

  def __init__(self):
    self._hypotheses = []
    self._references = []

  def Update(self, reference, hypothesis):
    """Adds one sentence pair."""
    self._references.append(reference)
    self._hypotheses.append(hypothesis)

  @property
  def value(self):
    return CorpusBleu(self._hypotheses, self._references)
