"""Simulating task orders: task times, idle time, activations in flight.

Runs each device's order (``gpipe.schedules.orders``) with every task as
early as its order and its inputs allow, for given task costs: per phase
(``{'F': 1, 'B': 2, 'W': 1}``) or per task (a function of the Task), so a
stage that re-materializes and one that does not cost what they cost when
they run (``RematCosts``).
"""

from gpipe.schedules import pipeline_tasks

Task = pipeline_tasks.Task
FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT

UNIT_COSTS = {FORWARD: 1, BACKWARD: 1, WEIGHT: 1}


def TaskCost(costs, task):
  """The ticks of `task` under `costs` (None, a phase dict or a function)."""
  if callable(costs):
    return costs(task)
  return dict(UNIT_COSTS, **(costs or {}))[task.phase]


def RematCosts(remat, num_stages=None):
  """Relative task costs: with re-materialization B recomputes the forward.

  Args:
    remat: True/False, or a remat mode: 'always', 'never' or 'except_last'
      (every stage recomputes but the last one, which keeps its
      activations).
    num_stages: K, needed for 'except_last'.

  Returns:
    A phase dict, or for 'except_last' a function of the Task.
  """
  if remat == 'except_last':
    if num_stages is None:
      raise ValueError("RematCosts('except_last') needs num_stages")
    return lambda task: (2 if task.phase == BACKWARD and
                         pipeline_tasks.RematerializesStage(
                             remat, task.stage, num_stages) else 1)
  on = remat if isinstance(remat, bool) else remat == 'always'
  return {FORWARD: 1, BACKWARD: 2 if on else 1, WEIGHT: 1}


def CostsOf(split_backward, forward=1, backward=1, weight=1):
  """Ticks per phase: without a split backward, B also does W's work.

  Args:
    split_backward: whether the schedule has W tasks.
    forward: T_F.
    backward: T_B (input gradient).
    weight: T_W (weight gradient).

  Returns:
    A phase dict.
  """
  if split_backward:
    return {FORWARD: forward, BACKWARD: backward, WEIGHT: weight}
  return {FORWARD: forward, BACKWARD: backward + weight, WEIGHT: 0}


def TaskTimes(orders, num_stages, num_micro_batches,
              per_micro_batch_loss=False, costs=None, delay=None,
              dependencies=None):
  """Runs device task orders, each task as early as its order allows.

  Args:
    orders: per device, its Tasks in run order (``Orders``).
    num_stages: K (stages, not devices).
    num_micro_batches: M.
    per_micro_batch_loss: the last stage's B of micro-batch m needs only its
      own forward (the loss inside the pipeline), not every forward.
    costs: ticks per phase, {'F': 1, 'B': 1, 'W': 1} by default, or a
      function of the Task (``TaskCost``). A schedule without W tasks does
      the weight gradient inside B: give B the cost of both to compare it
      with a split one (``CostsOf``).
    delay: optional function(dependency, task) -> the time from the end of
      `dependency` until `task` can read its output (a hand-over between
      devices, 0 on one device); None: outputs are there at once.
    dependencies: optional function(task) -> the tasks it waits for; by
      default the training dataflow (``pipeline_tasks.Dependencies``). Other
      task vocabularies (decoding lanes) bring their own.

  Returns:
    Per device, a list of (task, start, end) in run order.

  Raises:
    ValueError: if the orders deadlock (a device waits on a task that a
      device can only run after it).
  """
  if dependencies is None:
    dependencies = lambda task: pipeline_tasks.Dependencies(
        task, num_stages, num_micro_batches, per_micro_batch_loss)
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
        deps = dependencies(task)
        if any(dep not in finish for dep in deps):
          break
        start = max([free[d]] + [
            finish[dep] + (delay(dep, task) if delay else 0) for dep in deps])
        end = start + TaskCost(costs, task)
        finish[task] = free[d] = end
        out[d].append((task, start, end))
        pos[d] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      waiting = [_Label(o[p]) for o, p in zip(orders, pos) if p < len(o)]
      raise ValueError('the task orders deadlock: every device waits (next '
                       'tasks %s)' % ', '.join(waiting))
  return out


def _Label(task):
  """'F3s1' for a pipeline task, else the task's own text."""
  return (pipeline_tasks.Label(task) if isinstance(task, Task) else
          str(task))


def Simulate(orders, num_stages, num_micro_batches,
             per_micro_batch_loss=False, costs=None, dependencies=None):
  """``TaskTimes`` as lanes of ticks.

  Args:
    orders: per device, its Tasks in run order (``Orders``).
    num_stages: K (stages, not devices).
    num_micro_batches: M.
    per_micro_batch_loss: see ``TaskTimes``.
    costs: see ``TaskTimes``.
    dependencies: see ``TaskTimes``.

  Returns:
    Per device, a list over ticks of the Task it runs (None when idle); a
    task of cost c fills c ticks.
  """
  times = TaskTimes(orders, num_stages, num_micro_batches,
                    per_micro_batch_loss, costs, dependencies=dependencies)
  # Whole ticks: costs such as 2.0 (``timed.StageCosts``) draw as 2 cells.
  span = int(round(max([end for lane in times for _, _, end in lane] or [0])))
  lanes = []
  for lane in times:
    cells = [None] * span
    for task, start, end in lane:
      start, end = int(round(start)), int(round(end))
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


def PeakInFlight(orders):
  """Per device, the most micro-batch stages between their F and their B.

  That is the activations a device holds at once (in stage-sized units,
  1/v of a stage-per-device pipeline's with v stages per device), whatever
  the task costs: a device runs its order one task at a time.

  Args:
    orders: per device, its Tasks in run order.

  Returns:
    A list of ints, one per device.
  """
  peaks = []
  for order in orders:
    held = peak = 0
    for task in order:
      if task.phase == FORWARD:
        held += 1
        peak = max(peak, held)
      elif task.phase == BACKWARD:
        held -= 1
    peaks.append(peak)
  return peaks


def CheckSizes(num_stages, num_micro_batches):
  """Refuses fewer than one stage or one micro-batch."""
  if num_stages < 1 or num_micro_batches < 1:
    raise ValueError('a schedule needs >= 1 stage and >= 1 micro-batch, got '
                     '%d stages and %d micro-batches' %
                     (num_stages, num_micro_batches))


def BubbleFraction(num_stages, num_micro_batches):
  """The idle fraction of fill-drain with equal task costs: (K-1)/(M+K-1)."""
  CheckSizes(num_stages, num_micro_batches)
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
  CheckSizes(num_devices, num_micro_batches)
  if stages_per_device < 1:
    raise ValueError('stages_per_device must be >= 1, got %r'
                     % (stages_per_device,))
  d, v, m = num_devices, stages_per_device, num_micro_batches
  span = (v - 1) * max(m, d) + m + d - 1
  return 1.0 - float(v * m) / span

