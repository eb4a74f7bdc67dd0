"""Pipeline schedules as small pure functions.

A schedule says which task (``gpipe.pipeline_tasks``: phase F, B or W of one
stage on one micro-batch) each device runs, in which order. The executor in
``pipeline.py`` only needs that *order of tasks on each device*
(``Orders``): it chains each device's tasks with control dependencies, and
the dataflow between stages does the rest. A new schedule is a new function
here, not a change to the layer.

The schedules (``SCHEDULES``), each drawn in its function's docstring by
``Render`` (devices x ticks, unit-cost tasks; '.' is idle, the bubble):

* ``'gpipe'``: fill-drain (GPipe). All forwards, then all backwards. Holds
  all M micro-batches' activations; bubble (K-1)/(M+K-1). With several
  stages per device, breadth-first looping (``DeviceOrders``).
* ``'1f1b'``: one forward, one backward (PipeDream-flush). Same bubble, but
  stage s holds at most K-s micro-batches. See ``OneFOneBOrders``.
* ``'interleaved_1f1b'``: v stages per device, round-robin (Megatron-LM).
  Bubble (D-1)/(vM+D-1) on D devices. See ``InterleavedOrders``.
* ``'zb_h1'``: zero bubble H1. The backward split into B (input gradient)
  and W (weight gradient); W waits to fill bubbles. 1F1B's activations
  between F and B, about a third of its bubble. See ``ZeroBubbleH1Orders``.
* ``'zb_v'``: zero bubble V. Two stages per device in a V (device d holds
  stages d and K-1-d), split backward: about no bubble. See
  ``ZeroBubbleVOrders``.

Every schedule except ``'gpipe'`` starts micro-batch m's backward on the
last stage right after its forward, so it needs each micro-batch's loss
computed inside the pipeline (``PipeliningLayer``'s ``loss_tpl``, or a last
layer that returns per-example losses).
"""

import collections

from gpipe import pipeline_tasks

Task = pipeline_tasks.Task
FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT


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


def ClockCycles(name, num_stages, num_micro_batches, backward=True):
  """The ticks of schedule `name` with one stage per device, unit costs.

  Args:
    name: a key of SCHEDULES.
    num_stages: K.
    num_micro_batches: M.
    backward: include the backward (B and W) tasks.

  Returns:
    A list of ticks; each tick is a list of Tasks that run concurrently.
  """
  if name == 'gpipe':
    return GPipeClockCycles(num_stages, num_micro_batches, backward=backward)
  _, orders = Orders(name, num_stages, num_micro_batches)
  lanes = Simulate(orders, num_stages, num_micro_batches,
                   Spec(name).per_micro_batch_loss)
  ticks = [[lane[t] for lane in lanes if lane[t] is not None]
           for t in range(len(lanes[0]))]
  if not backward:
    ticks = [[x for x in tick if x.phase == FORWARD] for tick in ticks]
    ticks = [tick for tick in ticks if tick]
  return ticks


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


def _Dependencies(task, num_stages, num_micro_batches, per_micro_batch_loss):
  """The tasks whose outputs `task` consumes."""
  s, m = task.stage, task.micro_batch
  if task.phase == FORWARD:
    return [Task(s - 1, m, FORWARD)] if s else []
  if task.phase == WEIGHT:
    return [Task(s, m, BACKWARD)]
  if s < num_stages - 1:
    return [Task(s + 1, m, BACKWARD), Task(s, m, FORWARD)]
  if per_micro_batch_loss:
    return [Task(s, m, FORWARD)]
  # The loss needs the whole mini-batch: every last-stage forward.
  return [Task(s, j, FORWARD) for j in range(num_micro_batches)]


def TaskTimes(orders, num_stages, num_micro_batches,
              per_micro_batch_loss=False, costs=None):
  """Runs device task orders, each task as early as its order allows.

  Args:
    orders: per device, its Tasks in run order (``Orders``).
    num_stages: K (stages, not devices).
    num_micro_batches: M.
    per_micro_batch_loss: the last stage's B of micro-batch m needs only its
      own forward (the loss inside the pipeline), not every forward.
    costs: ticks per phase, {'F': 1, 'B': 1, 'W': 1} by default. A schedule
      without W tasks does the weight gradient inside B: give B the cost of
      both to compare it with a split one.

  Returns:
    Per device, a list of (task, start, end) in run order.

  Raises:
    ValueError: if the orders deadlock (a device waits on a task that a
      device can only run after it).
  """
  costs = dict({FORWARD: 1, BACKWARD: 1, WEIGHT: 1}, **(costs or {}))
  finish = {}
  pos = [0] * len(orders)
  free = [0] * len(orders)
  out = [[] for _ in orders]
  remaining = sum(len(o) for o in orders)
  while remaining:
    progressed = False
    for d, order in enumerate(orders):
      while pos[d] < len(order):
        task = order[pos[d]]
        deps = _Dependencies(task, num_stages, num_micro_batches,
                             per_micro_batch_loss)
        if any(dep not in finish for dep in deps):
          break
        start = max([free[d]] + [finish[dep] for dep in deps])
        end = start + costs[task.phase]
        finish[task] = free[d] = end
        out[d].append((task, start, end))
        pos[d] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      waiting = [pipeline_tasks.Label(o[p]) for o, p in zip(orders, pos)
                 if p < len(o)]
      raise ValueError('the task orders deadlock: every device waits (next '
                       'tasks %s)' % ', '.join(waiting))
  return out


def Simulate(orders, num_stages, num_micro_batches,
             per_micro_batch_loss=False, costs=None):
  """``TaskTimes`` as lanes of ticks.

  Args:
    orders: per device, its Tasks in run order (``Orders``).
    num_stages: K (stages, not devices).
    num_micro_batches: M.
    per_micro_batch_loss: see ``TaskTimes``.
    costs: see ``TaskTimes``.

  Returns:
    Per device, a list over ticks of the Task it runs (None when idle); a
    task of cost c fills c ticks.
  """
  times = TaskTimes(orders, num_stages, num_micro_batches,
                    per_micro_batch_loss, costs)
  span = max([end for lane in times for _, _, end in lane] or [0])
  lanes = []
  for lane in times:
    cells = [None] * span
    for task, start, end in lane:
      cells[start:end] = [task] * (end - start)
    lanes.append(cells)
  return lanes


def SimulatedBubble(orders, num_stages, num_micro_batches,
                    per_micro_batch_loss=False, costs=None):
  """The idle fraction of the devices in ``Simulate``."""
  lanes = Simulate(orders, num_stages, num_micro_batches,
                   per_micro_batch_loss, costs)
  idle = sum(t is None for lane in lanes for t in lane)
  return idle / float(sum(len(lane) for lane in lanes))


def RenderDevices(lanes, devices=None):
  """An ASCII timeline (devices x ticks) of ``Simulate``'s result.

  Each cell is phase, micro-batch and stage, e.g. ``F3s2``; just ``F3``
  when every device holds one stage.
  """
  names = devices or ['device %d' % d for d in range(len(lanes))]
  one_stage = all(len({t.stage for t in lane if t}) <= 1 for lane in lanes)
  # One stage per device: 'B3' says it all; else 'B3s2' (stage 2).
  label = (lambda t: '%s%d' % (t.phase, t.micro_batch)) if one_stage else (
      pipeline_tasks.Label)
  cells = [[label(t) if t else '.' for t in lane] for lane in lanes]
  width = max(len(c) for row in cells for c in row)
  name_width = max(len(str(n)) for n in names)
  return '\n'.join('%s | %s' % (str(n).ljust(name_width),
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


def Render(ticks, num_stages, num_micro_batches=None):
  """An ASCII timeline of a schedule.

  ``Render(ticks, K)`` draws ticks (``ClockCycles``) as stages x ticks;
  ``Render(name, stage_devices, M)`` draws schedule `name` as devices x
  ticks (``RenderSchedule``).

  Args:
    ticks: a list of ticks, or a schedule name.
    num_stages: K; with a name, the stage devices (or K).
    num_micro_batches: M, with a name.

  Returns:
    A multi-line string.
  """
  if isinstance(ticks, str):
    return RenderSchedule(ticks, num_stages, num_micro_batches)
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


# Schedules since GPipe. Each is a pure function giving every device's task
# order; ``Orders`` checks the placement and looks them up by name.


def OneFOneBOrders(num_stages, num_micro_batches):
  """1F1B (PipeDream-flush): one forward, one backward, one stage per device.

  Stage s first runs K-1-s forwards (the warm-up), then alternates one
  forward and one backward, then drains the remaining backwards. A
  micro-batch's backward starts as soon as its forward reached the loss, so
  stage s never holds more than K-s micro-batches' activations (GPipe holds
  M); the bubble is GPipe's, (K-1)/(M+K-1). K=3, M=6 (``Render('1f1b', 3,
  6)``; a B draws 2 ticks, input and weight gradient)::

    d0 | F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 F4 B2 B2 F5 B3 B3 .  B4 B4 .  B5 B5
    d1 | .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 .  B5 B5 .  .
    d2 | .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 .  .  .  .

  Args:
    num_stages: K, one per device.
    num_micro_batches: M >= K.

  Returns:
    Per stage (= device), its Tasks in run order.
  """
  _CheckSizes(num_stages, num_micro_batches)
  k, m = num_stages, num_micro_batches
  orders = []
  for s in range(k):
    warmup = min(k - 1 - s, m)
    order = [Task(s, i, FORWARD) for i in range(warmup)]
    for i in range(m - warmup):
      order += [Task(s, warmup + i, FORWARD), Task(s, i, BACKWARD)]
    order += [Task(s, i, BACKWARD) for i in range(m - warmup, m)]
    orders.append(order)
  return orders


def InterleavedOrders(num_devices, stages_per_device, num_micro_batches):
  """Interleaved 1F1B (Megatron-LM): v stages per device, round-robin.

  Device d holds stages d, d+D, ..., d+(v-1)D. Micro-batches go through in
  groups of D: a device runs the forwards of D micro-batches on its first
  stage, then on its second, ...; its warm-up is 2(D-1-d) + (v-1)D
  forwards, then it alternates one forward and one backward (backwards
  visit its stages in reverse). Each task is 1/v of a stage-per-device
  task, so the bubble shrinks v times, to (D-1)/(vM+D-1), for v times the
  hand-overs. D=2, v=2 (stages 0,2 on d0; 1,3 on d1), M=2 (``Render(
  'interleaved_1f1b', [0, 1, 0, 1], 2)``; a B draws 2 ticks)::

    d0 | F0s0 F1s0 F0s2 F1s2 .    .    B0s2 B0s2 .    B1s2 B1s2 B0s0 B0s0 B1s0 B1s0
    d1 | .    F0s1 F1s1 F0s3 B0s3 B0s3 F1s3 B1s3 B1s3 B0s1 B0s1 B1s1 B1s1 .    .

  Args:
    num_devices: D.
    stages_per_device: v (K = vD stages, stage s on device s mod D).
    num_micro_batches: M, a multiple of D when v > 1.

  Returns:
    Per device, its Tasks in run order.
  """
  d_count, v, m = num_devices, stages_per_device, num_micro_batches
  _CheckSizes(d_count * v, m)
  total = m * v

  def Chunk(i, backward):
    c = (i // d_count) % v
    return v - 1 - c if backward else c

  def MicroBatch(i):
    return (i // (d_count * v)) * d_count + i % d_count

  orders = []
  for d in range(d_count):
    if v == 1:
      warmup = min(d_count - 1 - d, m)
    else:
      warmup = min(2 * (d_count - 1 - d) + (v - 1) * d_count, total)
    fwd = [Task(Chunk(i, False) * d_count + d, MicroBatch(i), FORWARD)
           for i in range(total)]
    bwd = [Task(Chunk(i, True) * d_count + d, MicroBatch(i), BACKWARD)
           for i in range(total)]
    order = fwd[:warmup]
    for i in range(total - warmup):
      order += [fwd[warmup + i], bwd[i]]
    order += bwd[total - warmup:]
    orders.append(order)
  return orders


def _GreedyOrders(stage_devices, num_micro_batches, limits, w_limits,
                  costs=None):
  """Task orders of a split-backward schedule, by list scheduling.

  Runs a simulation in which each device, whenever it is free, starts the
  first ready task by priority: a B (the critical path; oldest micro-batch
  first), else an F if the device is under both its memory limits (later
  stages first, to finish micro-batches), else the oldest pending W (weight
  gradients fill what would be bubbles). The loss is inside the pipeline.

  Two memory counts bound the forwards: micro-batches between F and B hold
  a stage's full activations (``limits``); between F and W they hold what W
  needs, the inputs of the weights' ops and their output gradients
  (``w_limits``).

  Args:
    stage_devices: the device (an index) of each stage.
    num_micro_batches: M.
    limits: per device, the most micro-batch stages between F and B.
    w_limits: per device, the most micro-batch stages between F and W.
    costs: ticks per phase (default 1 each). With re-materialization a B
      also recomputes the forward: {'F': 1, 'B': 2, 'W': 1} places the W's
      where the real devices would idle.

  Returns:
    Per device, its Tasks in run order.

  Raises:
    ValueError: if the limits leave every device without a runnable task.
  """
  num_stages = len(stage_devices)
  m = num_micro_batches
  devices = sorted(set(stage_devices))
  pending = {d: set() for d in devices}
  for s, d in enumerate(stage_devices):
    for i in range(m):
      pending[d].update(Task(s, i, p) for p in (FORWARD, BACKWARD, WEIGHT))
  finish = {}
  free = {d: 0 for d in devices}
  held = {d: 0 for d in devices}  # Between F and B.
  held_w = {d: 0 for d in devices}  # Between F and W.
  orders = {d: [] for d in devices}
  costs = dict({FORWARD: 1, BACKWARD: 1, WEIGHT: 1}, **(costs or {}))

  def Ready(task, t):
    deps = _Dependencies(task, num_stages, m, True)
    return all(dep in finish and finish[dep] <= t for dep in deps)

  while any(pending.values()):
    t = min(free[d] for d in devices if pending[d])
    idle = []
    for d in devices:
      if free[d] > t or not pending[d]:
        continue
      ready = [task for task in pending[d] if Ready(task, t)]
      b = sorted((x for x in ready if x.phase == BACKWARD),
                 key=lambda x: (x.micro_batch, -x.stage))
      f = sorted((x for x in ready if x.phase == FORWARD),
                 key=lambda x: (-x.stage, x.micro_batch))
      w = sorted((x for x in ready if x.phase == WEIGHT),
                 key=lambda x: (x.micro_batch, -x.stage))
      if b:
        task = b[0]
      elif f and held[d] < limits[d] and held_w[d] < w_limits[d]:
        task = f[0]
      elif w:
        task = w[0]
      else:
        idle.append(d)
        continue
      pending[d].discard(task)
      orders[d].append(task)
      finish[task] = free[d] = t + costs[task.phase]
      if task.phase == FORWARD:
        held[d] += 1
        held_w[d] += 1
      elif task.phase == BACKWARD:
        held[d] -= 1
      else:
        held_w[d] -= 1
    # Idle devices wait for the next task anywhere to finish.
    later = [x for x in finish.values() if x > t]
    if idle and not later:
      raise ValueError('the memory limits %s / %s leave no task to run at '
                       'tick %d' % (limits, w_limits, t))
    for d in idle:
      free[d] = min(later)
  return [orders[d] for d in devices]


def ZeroBubbleH1Orders(num_stages, num_micro_batches, costs=None):
  """ZB-H1 (zero bubble, arXiv 2401.10241): 1F1B with a split backward.

  Each stage's backward is two tasks: B, the gradient of its input (which
  the previous stage waits for), and W, the gradient of its weights (which
  nothing waits for). B runs as soon as it can, W when the device would
  otherwise idle, so W fills most of 1F1B's bubble: with equal task costs
  it shrinks from (K-1)(T_F+T_B+T_W) to (K-1)(T_F+T_B-T_W) per device, a
  third. Stage s holds at most K-s micro-batches' full activations (F done,
  B not yet), as in 1F1B, and at most 2K-s micro-batches awaiting their W
  (which keeps the inputs of the weights' ops and their output gradients:
  with remat, more than the boundary input GPipe keeps). K=3, M=6
  (``Render('zb_h1', 3, 6)``)::

    d0 | F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 W0 W1 B4 W2 W3 B5 W4 W5
    d1 | .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 W0 F5 B4 W1 W2 B5 W3 W4 W5
    d2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5

  Args:
    num_stages: K, one per device.
    num_micro_batches: M >= K.
    costs: ticks per phase for placing the W's (see ``_GreedyOrders``).

  Returns:
    Per stage (= device), its Tasks in run order.
  """
  _CheckSizes(num_stages, num_micro_batches)
  k = num_stages
  return _GreedyOrders(list(range(k)), num_micro_batches,
                       {s: k - s for s in range(k)},
                       {s: 2 * k - s for s in range(k)}, costs)


def ZeroBubbleVOrders(num_devices, num_micro_batches, costs=None):
  """ZB-V (zero bubble, arXiv 2401.10241): two stages per device in a V.

  K = 2D stages; device d holds stage d and stage K-1-d, so the first and
  the last stage share device 0: a micro-batch goes down the devices and
  back up, and its loss and backward start where its input came in. With
  the split backward (B, then W whenever the device would idle), each device
  holding at most K half-size stage activations between F and B (1F1B's
  memory) and 2K awaiting their W, the bubble is only the fill of the first
  forward. D=2 (stages 0,3 on d0;
  1,2 on d1), M=2 (``Render('zb_v', [0, 1, 1, 0], 2)``)::

    d0 | F0s0 F1s0 .    F0s3 B0s3 F1s3 B1s3 B0s0 W0s3 B1s0 W0s0 W1s3 W1s0
    d1 | .    F0s1 F0s2 F1s1 F1s2 B0s2 B0s1 B1s2 B1s1 W0s2 W0s1 W1s2 W1s1

  Args:
    num_devices: D (K = 2D stages).
    num_micro_batches: M.
    costs: ticks per phase for placing the W's (see ``_GreedyOrders``).

  Returns:
    Per device, its Tasks in run order.
  """
  k = 2 * num_devices
  _CheckSizes(k, num_micro_batches)
  return _GreedyOrders(VPlacement(k), num_micro_batches,
                       {d: k for d in range(num_devices)},
                       {d: 2 * k for d in range(num_devices)}, costs)


ScheduleSpec = collections.namedtuple(
    'ScheduleSpec', ['split_backward', 'per_micro_batch_loss'])

SCHEDULES = collections.OrderedDict([
    ('gpipe', ScheduleSpec(split_backward=False, per_micro_batch_loss=False)),
    ('1f1b', ScheduleSpec(split_backward=False, per_micro_batch_loss=True)),
    ('interleaved_1f1b', ScheduleSpec(split_backward=False,
                                      per_micro_batch_loss=True)),
    ('zb_h1', ScheduleSpec(split_backward=True, per_micro_batch_loss=True)),
    ('zb_v', ScheduleSpec(split_backward=True, per_micro_batch_loss=True)),
])


def Spec(name):
  """The ScheduleSpec of schedule `name` (a clear error if unknown)."""
  if name not in SCHEDULES:
    raise ValueError('unknown schedule %r; known schedules: %s' %
                     (name, ', '.join(SCHEDULES)))
  return SCHEDULES[name]


def VPlacement(num_stages):
  """ZB-V's placement: stage s on device min(s, K-1-s), K = 2D stages."""
  return [min(s, num_stages - 1 - s) for s in range(num_stages)]


def RoundRobinPlacement(num_stages, num_devices):
  """Looped / interleaved placement: stage s on device s mod D."""
  return [s % num_devices for s in range(num_stages)]


def _Placement(stage_devices):
  """(distinct devices in order of first use, stage -> device index)."""
  devices = list(collections.OrderedDict.fromkeys(stage_devices))
  index = {d: i for i, d in enumerate(devices)}
  return devices, [index[d] for d in stage_devices]


def Orders(name, stage_devices, num_micro_batches, costs=None):
  """The task order of every device under schedule `name`.

  Args:
    name: a key of SCHEDULES.
    stage_devices: the device (any hashable name) of each stage, K entries;
      or an int K for one stage per device.
    num_micro_batches: M.
    costs: the zero-bubble schedules' relative task costs, {'F': 1, 'B': 1,
      'W': 1} by default (``RematCosts`` with re-materialization); they
      decide where the W tasks go.

  Returns:
    (devices, orders): the distinct devices in order of first use, and for
    each a list of its Tasks in run order.

  Raises:
    ValueError: an unknown schedule, or a placement or M it cannot run,
      saying what to change.
  """
  Spec(name)
  if isinstance(stage_devices, int):
    stage_devices = list(range(stage_devices))
  k, m = len(stage_devices), num_micro_batches
  _CheckSizes(k, m)
  devices, where = _Placement(stage_devices)
  d = len(devices)
  if name == 'gpipe':
    return DeviceOrders(GPipeClockCycles(k, m), stage_devices)
  if name in ('1f1b', 'zb_h1'):
    if d != k:
      raise ValueError(
          "schedule %r runs one stage per device, but the %d stages share %d "
          "devices (%s): give each stage its own device, or use "
          "'interleaved_1f1b' (stage s on device s mod D) or 'zb_v' (a V: "
          'devices d0, d1, ..., d1, d0) for several stages per device' %
          (name, k, d, list(stage_devices)))
    if m < k:
      raise ValueError(
          'schedule %r needs at least as many micro-batches as stages: M=%d '
          '< K=%d. Use num_micro_batches >= %d (or schedule gpipe)' %
          (name, m, k, k))
    if name == '1f1b':
      return devices, OneFOneBOrders(k, m)
    return devices, ZeroBubbleH1Orders(k, m, costs)
  if name == 'interleaved_1f1b':
    v = k // d
    if k % d or where != RoundRobinPlacement(k, d):
      raise ValueError(
          "schedule 'interleaved_1f1b' needs the stages round-robin over the "
          'devices, the same number on each (stage s on device s mod D), '
          'e.g. stage_devices [d0, d1, d0, d1]; got %s' % list(stage_devices))
    if v > 1 and m % d:
      raise ValueError(
          "schedule 'interleaved_1f1b' needs M a multiple of the %d devices "
          '(micro-batches go through in groups of D); got M=%d: use %d or %d'
          % (d, m, max(d, m - m % d), m + d - m % d))
    if m < (d if v > 1 else k):
      raise ValueError(
          "schedule 'interleaved_1f1b' needs M >= %d micro-batches here; got "
          '%d' % (d if v > 1 else k, m))
    return devices, [
        [Task(t.stage, t.micro_batch, t.phase) for t in order]
        for order in InterleavedOrders(d, v, m)]
  # zb_v
  if k % 2 or where != VPlacement(k):
    raise ValueError(
        "schedule 'zb_v' needs two stages per device in a V: K=2D stages on "
        'D devices, stage_devices [d0, d1, ..., d(D-1), d(D-1), ..., d1, d0] '
        '(device d holds stages d and K-1-d); got %s. With one stage per '
        "device use 'zb_h1'" % list(stage_devices))
  return devices, ZeroBubbleVOrders(d, m, costs)


def RematCosts(remat):
  """Relative task costs: with re-materialization B recomputes the forward."""
  return {FORWARD: 1, BACKWARD: 2 if remat else 1, WEIGHT: 1}


def CostsOf(name, forward=1, backward=1, weight=1):
  """Ticks per phase for simulating `name`: B includes W without a split."""
  if Spec(name).split_backward:
    return {FORWARD: forward, BACKWARD: backward, WEIGHT: weight}
  return {FORWARD: forward, BACKWARD: backward + weight, WEIGHT: 0}


def BubbleFormula(name, num_devices, stages_per_device, num_micro_batches):
  """The published idle fraction of `name` with T_F = T_B = T_W.

  Args:
    name: a schedule.
    num_devices: D.
    stages_per_device: v (1 for gpipe/1f1b/zb_h1, 2 for zb_v).
    num_micro_batches: M.

  Returns:
    gpipe and 1f1b: (D-1)/(vM+D-1) (looping for v > 1); interleaved 1F1B:
    the same with its v; ZB-H1: (D-1)(T_F+T_B-T_W) idle per device over a
    3M-tick step, (D-1)/(3M+D-1); ZB-V: the paper's (D-1)(T_F+T_B-2T_W)
    is 0, which leaves the fill of the first forward, D-1 half-stage ticks
    over a 6M-tick step: (D-1)/(6M+D-1).
  """
  d, v, m = num_devices, stages_per_device, num_micro_batches
  if name in ('gpipe', '1f1b', 'interleaved_1f1b'):
    return LoopedBubbleFraction(d, v, m) if name == 'gpipe' else (
        (d - 1.0) / (v * m + d - 1))
  if name == 'zb_h1':
    return (d - 1.0) / (3 * m + d - 1)
  Spec(name)
  return (d - 1.0) / (6 * m + d - 1)


def RenderSchedule(name, stage_devices, num_micro_batches, costs=None):
  """The ASCII drawing (devices x ticks) of schedule `name`.

  Args:
    name: a schedule.
    stage_devices: as for ``Orders`` (an int K: one stage per device).
    num_micro_batches: M.
    costs: ticks per phase (default ``CostsOf(name)``: a B without a split
      draws twice as long).

  Returns:
    A multi-line string, one row per device; cells like ``B3s1``.
  """
  devices, orders = Orders(name, stage_devices, num_micro_batches)
  k = stage_devices if isinstance(stage_devices, int) else len(stage_devices)
  lanes = Simulate(orders, k, num_micro_batches,
                   Spec(name).per_micro_batch_loss, costs or CostsOf(name))
  return RenderDevices(lanes, ['d%d' % i for i in range(len(devices))])
