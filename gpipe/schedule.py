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


def DeviceOrders(ticks, stage_devices):
  """The order of tasks on each device, when devices hold several stages.

  With ``stage_devices`` such as [d0, d1, d0, d1] (v stages per device in a
  loop, as in breadth-first or interleaved pipelines) a device runs its
  stages' tasks breadth-first: the forward tasks of its first stage for every
  micro-batch, then those of its next stage, ...; then the backward tasks,
  last stage first. Each stage keeps its own order from the schedule. The
  bubble then shrinks with v: the first forward task of a device's second
  stage is ready as soon as the stages before it have run micro-batch 0.
  With one stage per device this is ``StageOrders``.

  Args:
    ticks: the schedule (e.g. ``GPipeClockCycles``).
    stage_devices: the device (any hashable name) of each stage.

  Returns:
    (devices, orders): the distinct devices in order of first use, and for
    each a list of its Tasks in run order.
  """
  num_stages = len(stage_devices)
  stage_orders = StageOrders(ticks, num_stages)
  devices = list(collections.OrderedDict.fromkeys(stage_devices))
  orders = []
  for d in devices:
    stages = [s for s in range(num_stages) if stage_devices[s] == d]
    forward = [t for s in stages for t in stage_orders[s]
               if t.phase == FORWARD]
    backward = [t for s in reversed(stages) for t in stage_orders[s]
                if t.phase == BACKWARD]
    orders.append(forward + backward)
  return devices, orders


def _Ready(task, done, num_stages, num_micro_batches):
  """Whether `task`'s inputs exist, given the set of finished tasks."""
  s, m = task.stage, task.micro_batch
  if task.phase == FORWARD:
    return s == 0 or Task(s - 1, m, FORWARD) in done
  if s == num_stages - 1:
    # The loss needs the whole mini-batch: every last-stage forward.
    return all(Task(s, j, FORWARD) in done for j in range(num_micro_batches))
  return Task(s + 1, m, BACKWARD) in done


def Simulate(orders, num_stages, num_micro_batches):
  """Runs device task orders with one tick per task, as early as possible.

  Args:
    orders: per device, its Tasks in run order (``DeviceOrders``).
    num_stages: K (stages, not devices).
    num_micro_batches: M.

  Returns:
    Per device, a list over ticks of the Task it runs (None when idle).

  Raises:
    ValueError: if the orders deadlock (a device waits on a task that a
      device can only run after it).
  """
  pos = [0] * len(orders)
  done = set()
  lanes = [[] for _ in orders]
  while any(p < len(o) for p, o in zip(pos, orders)):
    ran = []
    for d, order in enumerate(orders):
      task = order[pos[d]] if pos[d] < len(order) else None
      if task is not None and _Ready(task, done, num_stages,
                                     num_micro_batches):
        ran.append(task)
        pos[d] += 1
      else:
        task = None
      lanes[d].append(task)
    if not ran:
      raise ValueError('the task orders deadlock at tick %d' % len(lanes[0]))
    done.update(ran)
  return lanes


def SimulatedBubble(orders, num_stages, num_micro_batches):
  """The idle fraction of the devices in ``Simulate`` (unit task costs)."""
  lanes = Simulate(orders, num_stages, num_micro_batches)
  idle = sum(t is None for lane in lanes for t in lane)
  return idle / float(sum(len(lane) for lane in lanes))


def RenderDevices(lanes, devices=None):
  """An ASCII timeline (devices x ticks) of ``Simulate``'s result.

  Each cell is phase, micro-batch and stage, e.g. ``F3s2``.
  """
  names = devices or ['device %d' % d for d in range(len(lanes))]
  cells = [['%s%ds%d' % (t.phase, t.micro_batch, t.stage) if t else '.'
            for t in lane] for lane in lanes]
  width = max(len(c) for row in cells for c in row)
  label = max(len(str(n)) for n in names)
  return '\n'.join('%s | %s' % (str(n).ljust(label),
                                 ' '.join(c.ljust(width) for c in row).rstrip())
                    for n, row in zip(names, cells))


def BubbleFraction(num_stages, num_micro_batches):
  """The idle fraction of fill-drain with equal task costs: (K-1)/(M+K-1)."""
  _CheckSizes(num_stages, num_micro_batches)
  return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def LoopedBubbleFraction(num_devices, stages_per_device, num_micro_batches):
  """The idle fraction of breadth-first looping (``DeviceOrders``).

  D devices hold v stages each (stage s on device s mod D), every task costs
  1/v of one stage-per-device task. Per phase a device runs v*M tasks; it
  waits between its loops only while the pipeline is shorter than the ring
  (M < D): each of the first v-1 loops takes max(M, D) ticks, the last
  M + D - 1. So the bubble is 1 - vM / ((v-1) max(M, D) + M + D - 1), which
  is (D-1)/(vM+D-1) once M >= D, and (D-1)/D, no gain at all, at M = 1.

  Args:
    num_devices: D.
    stages_per_device: v (1 is plain fill-drain, ``BubbleFraction``).
    num_micro_batches: M.

  Returns:
    The idle fraction in [0, 1).
  """
  _CheckSizes(num_devices, num_micro_batches)
  if stages_per_device < 1:
    raise ValueError('stages_per_device must be >= 1, got %r'
                     % (stages_per_device,))
  d, v, m = num_devices, stages_per_device, num_micro_batches
  span = (v - 1) * max(m, d) + m + d - 1
  return 1.0 - float(v * m) / span


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
