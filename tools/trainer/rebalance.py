"""A slow device gets fewer layers (``--elastic``'s rebalancing).

The cut of a pipeline balances its layers' costs (the pipeline's
``partition_cost``, or the planner's measured times) over devices assumed
equally fast. A throttled, shared or degraded host breaks that: its stage
takes longer than its share of the cost says, and every step waits for it.

``Rebalancer`` watches the traced steps: each stage's busy seconds over its
layers' cost is the device's *seconds per unit of cost*. A stage whose
figure is more than ``THRESHOLD`` (25%) above the median of the others' in
each of ``TRACES`` traced steps in a row is slow; then the devices' factors
(their figures over the fastest one's, the median of those traced steps) cut
the layers again (``gpipe.balance.PartitionByCost`` with a factor per stage),
and when the new cut's predicted bottleneck is at least ``GAIN`` (10%)
below the current one, ``Observe`` proposes it. The math of a step does not
depend on the cut, so a move to it keeps the losses.

The costs are the cut's own model of the layers, and a crude one (e.g.
'uniform') can make a fast stage of cheap layers look slow after a move. So
the traced steps' spans are kept for every cut the run has had: a cut is
not proposed again once it was measured no faster than the current one.

Pure Python: no TensorFlow.
"""

import dataclasses

import numpy as np

from gpipe import balance

THRESHOLD = 0.25
TRACES = 3
GAIN = 0.10


@dataclasses.dataclass(frozen=True)
class Proposal:
  """A new cut for slow devices.

  Attributes:
    sizes: the new layers per stage.
    old_sizes: the current ones.
    factors: each stage's seconds per unit of cost over the fastest's.
    slow: the stages found slow.
    gain: the current cut's predicted bottleneck over the new one's.
  """
  sizes: tuple
  old_sizes: tuple
  factors: tuple
  slow: tuple
  gain: float

  def Describe(self):
    return ('stage(s) %s slower than their share of the cost (seconds per '
            'unit of cost %s times the fastest device\'s): cut %s -> %s, '
            'predicted %.2fx as fast' % (
                ', '.join(str(k) for k in self.slow),
                ', '.join('%.2f' % f for f in self.factors),
                list(self.old_sizes), list(self.sizes), self.gain))


def StageCosts(layer_costs, sizes):
  """Each stage's cost: the sum of its layers'."""
  bounds = np.cumsum([0] + list(sizes))
  return [float(sum(layer_costs[a:b])) for a, b in zip(bounds, bounds[1:])]


def Bottleneck(layer_costs, sizes, factors):
  """The most expensive stage's cost times its device's factor."""
  return max(f * c for f, c in zip(factors, StageCosts(layer_costs, sizes)))


class Rebalancer:
  """Watches traced steps for a slow stage; proposes a new cut."""

  def __init__(self, layer_costs, sizes, threshold=THRESHOLD, traces=TRACES,
               gain=GAIN):
    """Constructor.

    Args:
      layer_costs: the pipeline's per-layer costs (> 0 where a stage sums
        them; a stage of zero cost is never judged).
      sizes: the current layers per stage.
      threshold: how far above the others' median a stage's seconds per
        cost must be to count as slow (0.25: 25%).
      traces: traced steps in a row a stage must be slow in.
      gain: the least predicted speed-up worth a move (0.1: 10%).
    """
    self.layer_costs = [float(c) for c in layer_costs]
    self.sizes = tuple(sizes)
    self._threshold = threshold
    self._traces = traces
    self._gain = gain
    self._streak = []
    # {cut: [traced step spans]} of every cut this shape has had.
    self._spans = {}

  def UseCut(self, sizes):
    """The pipeline now runs with cut `sizes` (a move); the spans are kept."""
    self.sizes = tuple(sizes)
    self._streak = []

  def _MeasuredNoFaster(self, sizes):
    """Whether cut `sizes` was traced and no faster than the current one."""
    theirs, ours = self._spans.get(sizes), self._spans.get(self.sizes)
    return bool(theirs and ours and np.median(theirs) >= np.median(ours))

  def Observe(self, stage_seconds, span=None):
    """One traced step's busy seconds per stage; a Proposal or None.

    Args:
      stage_seconds: each stage's busy seconds (the slowest replica's).
      span: the traced step's seconds from its first task to its last.
    """
    if span is not None:
      self._spans.setdefault(self.sizes, []).append(float(span))
    costs = StageCosts(self.layer_costs, self.sizes)
    if len(stage_seconds) != len(costs) or len(costs) < 2:
      return None
    per_cost = [s / c if c > 0 else None for s, c in zip(stage_seconds, costs)]
    slow = []
    for k, figure in enumerate(per_cost):
      others = [f for j, f in enumerate(per_cost) if j != k and f]
      if figure and others and figure > (1 + self._threshold) * float(
          np.median(others)):
        slow.append(k)
    if not slow or any(f is None for f in per_cost):
      self._streak = []
      return None
    # The same stage must stay slow through a streak; another starts anew.
    still = [k for k in slow if self._streak and k in self._streak[-1][0]]
    if not still:
      self._streak = []
    self._streak.append((tuple(still or slow), per_cost))
    if len(self._streak) < self._traces:
      return None
    figures = np.median([p for _, p in self._streak[-self._traces:]], axis=0)
    factors = tuple(float(f) for f in figures / figures.min())
    sizes = tuple(balance.PartitionByCost(self.layer_costs, len(costs),
                                          stage_factors=factors))
    gain = (Bottleneck(self.layer_costs, self.sizes, factors) /
            Bottleneck(self.layer_costs, sizes, factors))
    if (sizes == self.sizes or gain < 1 + self._gain or
        self._MeasuredNoFaster(sizes)):
      return None
    slow = self._streak[-1][0]
    self._streak = []
    return Proposal(sizes, self.sizes, factors, slow, gain)
