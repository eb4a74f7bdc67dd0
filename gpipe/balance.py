"""The exact balanced cut: per-layer costs into K stages (pure Python).

``PartitionByCost`` minimizes the cost of the most expensive stage (every
stage waits for the slowest one each tick), by dynamic programming over
prefix sums; the inner search is a binary search because the cost of the
first k stages only grows as more layers are given to them, so a 1663-layer,
128-stage cut takes seconds. With a factor per stage (a slower device,
``stage_factors``) that no longer holds and every start is tried: fine for
the hundreds of layers of the registered models.

The pipeline (``gpipe.partition``, with the layers' costs) and the planner
(``gpipe.plan.search``, with measured costs) both cut with it; it imports no
TensorFlow, so the planner's search does not either.
"""

import numpy as np


def CheckStageCount(num_layers, num_stages):
  """Raises a clear error when `num_stages` cannot hold `num_layers`."""
  if num_stages < 1:
    raise ValueError('num_stages must be >= 1, got %d' % num_stages)
  if num_layers < num_stages:
    raise ValueError(
        'cannot cut %d layers into %d stages: each stage needs at least one '
        'layer; use at most %d stages or split the layers finer' %
        (num_layers, num_stages, num_layers))


def PartitionByCost(costs, num_stages, stage_factors=None):
  """Stage sizes (layers per stage) minimizing the most expensive stage.

  Args:
    costs: a list of non-negative per-layer costs, in layer order.
    num_stages: K, the number of consecutive stages.
    stage_factors: optional K positive factors: stage k's cost is its
      layers' costs times factor k (a device that runs its work 1.5 times
      as long as the others: 1.5). Default: all 1.

  Returns:
    A list of K positive ints summing to len(costs).
  """
  n = len(costs)
  CheckStageCount(n, num_stages)
  costs = np.asarray(costs, dtype=np.float64)
  if np.any(costs < 0) or not np.all(np.isfinite(costs)):
    raise ValueError('layer costs must be finite and >= 0, got %s' % costs)
  if stage_factors is None:
    factors = [1.0] * num_stages
  else:
    factors = [float(f) for f in stage_factors]
    if len(factors) != num_stages or min(factors) <= 0 or not all(
        np.isfinite(factors)):
      raise ValueError('stage_factors must be %d finite factors > 0, got %s'
                       % (num_stages, stage_factors))
  prefix = np.concatenate([[0.0], np.cumsum(costs)])
  inf = float('inf')
  # best[k][j]: the smallest bottleneck putting the first j layers in k+1
  # stages; cut[k][j]: where the last of those stages starts.
  best = [[inf] * (n + 1) for _ in range(num_stages)]
  cut = [[0] * (n + 1) for _ in range(num_stages)]
  for j in range(1, n + 1):
    best[0][j] = factors[0] * prefix[j]
  uniform = len(set(factors)) == 1
  for k in range(1, num_stages):
    prev = best[k - 1]
    f = factors[k]
    for j in range(k + 1, n + 1):
      if not uniform:
        # With other factors per stage prev[i] need not grow with i (the
        # last of its stages must keep a layer): try every start.
        value, choice = min((max(prev[i], f * (prefix[j] - prefix[i])), i)
                            for i in range(k, j))
        best[k][j], cut[k][j] = value, choice
        continue
      # The last stage holds layers [i, j) with k <= i <= j - 1. prev[i] grows
      # with i and the last stage's cost shrinks: binary search the crossing.
      lo, hi = k, j - 1
      while lo < hi:
        mid = (lo + hi) // 2
        if prev[mid] < f * (prefix[j] - prefix[mid]):
          lo = mid + 1
        else:
          hi = mid
      choice, value = lo, max(prev[lo], f * (prefix[j] - prefix[lo]))
      if lo - 1 >= k:
        other = max(prev[lo - 1], f * (prefix[j] - prefix[lo - 1]))
        if other < value:
          choice, value = lo - 1, other
      best[k][j], cut[k][j] = value, choice
  sizes = []
  j = n
  for k in reversed(range(num_stages)):
    i = cut[k][j] if k > 0 else 0
    sizes.append(j - i)
    j = i
  return list(reversed(sizes))
