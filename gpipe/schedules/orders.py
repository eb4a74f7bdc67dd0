"""The task orders of each schedule: small pure functions, no TensorFlow.

Each function gives, for K stages (or D devices) and M micro-batches, every
device's list of ``pipeline_tasks.Task`` in run order; each is drawn in its
docstring (devices x ticks, unit-cost tasks, '.' idle). The registry
(``gpipe.schedules.registry``) looks them up by name and checks the
placement and M; the executor chains each device's tasks in this order.
"""

import collections

from gpipe.schedules import pipeline_tasks
from gpipe.schedules import simulate

Task = pipeline_tasks.Task
FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT


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
  simulate.CheckSizes(num_stages, num_micro_batches)
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
  simulate.CheckSizes(num_stages, num_micro_batches)
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
  simulate.CheckSizes(d_count * v, m)
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
    costs: ticks per phase (default 1 each) or per task
      (``simulate.TaskCost``). With re-materialization a B also recomputes
      the forward: ``simulate.RematCosts`` places the W's where the real
      devices would idle.

  Returns:
    Per device, its Tasks in run order.

  Raises:
    ValueError: if the limits leave every device without a runnable task.
  """
  num_stages = len(stage_devices)
  m = num_micro_batches
  devices = sorted(set(stage_devices))
  stages = {d: [s for s, x in enumerate(stage_devices) if x == d]
            for d in devices}
  # Each stage runs its F's, B's and W's in micro-batch order (a task's
  # inputs are ready no later than those of the next micro-batch's, and
  # the oldest ready one goes first): only the next of each can be chosen.
  next_index = {(s, p): 0 for s in range(num_stages)
                for p in (FORWARD, BACKWARD, WEIGHT)}
  left = {d: 3 * m * len(stages[d]) for d in devices}
  finish = {}
  last_finish = {d: 0 for d in devices}
  free = {d: 0 for d in devices}
  held = {d: 0 for d in devices}  # Between F and B.
  held_w = {d: 0 for d in devices}  # Between F and W.
  orders = {d: [] for d in devices}

  def Ready(task, t):
    deps = pipeline_tasks.Dependencies(task, num_stages, m, True)
    return all(dep in finish and finish[dep] <= t for dep in deps)

  while any(left.values()):
    t = min(free[d] for d in devices if left[d])
    idle = []
    started = False
    for d in devices:
      if free[d] > t or not left[d]:
        continue
      heads = [Task(s, next_index[s, p], p) for s in stages[d]
               for p in (FORWARD, BACKWARD, WEIGHT) if next_index[s, p] < m]
      ready = [task for task in heads if Ready(task, t)]
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
      next_index[task.stage, task.phase] += 1
      left[d] -= 1
      started = True
      orders[d].append(task)
      finish[task] = free[d] = last_finish[d] = (
          t + simulate.TaskCost(costs, task))
      if task.phase == FORWARD:
        held[d] += 1
        held_w[d] += 1
      elif task.phase == BACKWARD:
        held[d] -= 1
      else:
        held_w[d] -= 1
    # Idle devices wait for the next task anywhere to finish (every task
    # started by t: only a device's last one can end later).
    later = [x for x in last_finish.values() if x > t]
    if idle and not later:
      if started:
        # A task of no cost (a stage without weights has W of none) that
        # ended at t may have readied one an idle device examined before
        # it started: look again at t.
        continue
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
  simulate.CheckSizes(num_stages, num_micro_batches)
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
  simulate.CheckSizes(k, num_micro_batches)
  return _GreedyOrders(VPlacement(k), num_micro_batches,
                       {d: k for d in range(num_devices)},
                       {d: 2 * k for d in range(num_devices)}, costs)



def VPlacement(num_stages):
  """ZB-V's placement: stage s on device min(s, K-1-s), K = 2D stages."""
  return [min(s, num_stages - 1 - s) for s in range(num_stages)]


def RoundRobinPlacement(num_stages, num_devices):
  """Looped / interleaved placement: stage s on device s mod D."""
  return [s % num_devices for s in range(num_stages)]

