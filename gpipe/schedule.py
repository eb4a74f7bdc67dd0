"""Pipeline schedules as small pure functions.

A schedule says, for every clock tick, which (stage, micro-batch, phase) tasks
run. Phases: ``'F'`` forward, ``'B'`` backward (with re-materialization the
backward task first recomputes the stage's forward pass). The executor in
``pipeline.py`` only needs the *order of tasks on each stage*
(``StageOrders``): it chains each stage's tasks with control dependencies, and
the dataflow between stages does the rest. A new schedule is a new function
here, not a change to the layer.

GPipe's fill-drain schedule for K=3 stages, M=4 micro-batches (``Render``)::

  stage 0 | F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
  stage 1 | .  F0 F1 F2 F3 .  .  B3 B2 B1 B0 .
  stage 2 | .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .

(each task drawn one tick long; the idle '.' cells are the bubble, a fraction
(K-1)/(M+K-1) of each stage's time when all tasks cost the same).
"""

import collections

Task = collections.namedtuple('Task', ['stage', 'micro_batch', 'phase'])

FORWARD = 'F'
BACKWARD = 'B'


def _CheckSizes(num_stages, num_micro_batches):
  if num_stages < 1 or num_micro_batches < 1:
    raise ValueError('a schedule needs >= 1 stage and >= 1 micro-batch, got '
                     '%d stages and %d micro-batches' %
                     (num_stages, num_micro_batches))


def GPipeClockCycles(num_stages, num_micro_batches, backward=True):
  """GPipe's fill-drain schedule.

  Forward: at tick t, stage k runs micro-batch t - k. Backward mirrors it in
  reverse micro-batch order, starting at the last stage.

  Args:
    num_stages: K.
    num_micro_batches: M.
    backward: include the backward ticks.

  Returns:
    A list of ticks; each tick is a list of Tasks that run concurrently.
  """
  _CheckSizes(num_stages, num_micro_batches)
  k, m = num_stages, num_micro_batches
  ticks = []
  for t in range(m + k - 1):
    ticks.append([
        Task(s, t - s, FORWARD) for s in range(k) if 0 <= t - s < m
    ])
  if backward:
    for t in range(m + k - 1):
      ticks.append([
          Task(s, m - 1 - (t - (k - 1 - s)), BACKWARD)
          for s in reversed(range(k))
          if 0 <= t - (k - 1 - s) < m
      ])
  return ticks


SCHEDULES = {
    'gpipe': GPipeClockCycles,
}


def ClockCycles(name, num_stages, num_micro_batches, backward=True):
  """The ticks of the schedule called `name` (see SCHEDULES)."""
  if name not in SCHEDULES:
    raise ValueError('unknown schedule %r; known schedules: %s' %
                     (name, ', '.join(sorted(SCHEDULES))))
  return SCHEDULES[name](num_stages, num_micro_batches, backward=backward)


def StageOrders(ticks, num_stages):
  """The order of tasks on each stage: a list (per stage) of Tasks."""
  orders = [[] for _ in range(num_stages)]
  for tick in ticks:
    for task in tick:
      orders[task.stage].append(task)
  return orders


def BubbleFraction(num_stages, num_micro_batches):
  """The idle fraction of fill-drain with equal task costs: (K-1)/(M+K-1)."""
  _CheckSizes(num_stages, num_micro_batches)
  return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def Render(ticks, num_stages):
  """An ASCII timeline (stages x ticks) of a schedule."""
  width = max(2, max(len('%s%d' % (t.phase, t.micro_batch))
                     for tick in ticks for t in tick))
  rows = []
  for s in range(num_stages):
    cells = []
    for tick in ticks:
      task = [t for t in tick if t.stage == s]
      cell = '%s%d' % (task[0].phase, task[0].micro_batch) if task else '.'
      cells.append(cell.ljust(width))
    rows.append('stage %d | %s' % (s, ' '.join(cells).rstrip()))
  return '\n'.join(rows)
