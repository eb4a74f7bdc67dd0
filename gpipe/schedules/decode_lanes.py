"""Decoding lanes: the schedule of a pipelined autoregressive decoder.

An autoregressive decoder makes one token per step, and step t+1 of a
sequence needs the token step t chose at the last stage. A whole batch going
through K stages one step at a time would keep K-1 devices idle. So the batch
(beams x examples) is split into M lanes: lane m's step t goes through the
stages like a micro-batch, its token goes back to the first stage for step
t+1, and while stage k runs lane m's step t, stage k+1 runs lane m-1's. A
task is ``LaneTask(stage, lane, step)``; it needs the same lane's step at the
previous stage, and stage 0 needs the lane's previous step at the last stage
(``Dependencies``).

Each device runs its tasks step by step; within a step in the order of
``(lane + stage, stage)``, the tick at which one stage per device would run
them (``StepOrders``). Drawn with unit costs, lanes as letters and steps as
numbers (``Render(2, 3, 3)``: K=2, M=3, T=3 and ``Render(3, 2, 3)``)::

    d0 | a0 b0 c0 a1 b1 c1 a2 b2 c2 .
    d1 | .  a0 b0 c0 a1 b1 c1 a2 b2 c2

    d0 | a0 b0 .  a1 b1 .  a2 b2 .  .
    d1 | .  a0 b0 .  a1 b1 .  a2 b2 .
    d2 | .  .  a0 b0 .  a1 b1 .  a2 b2

With M >= K lanes a device is busy from its first task to its last: only the
fill (K-1 ticks at the start) and the drain (K-1 at the end) are idle, a
bubble of (K-1)/(TM+K-1). With M < K a lane's token takes K ticks to come
back, so each step takes K ticks for M tasks: a bubble of about 1 - M/K
(``BubbleFraction``). A device holding several stages runs all of its step
t before its step t+1.
"""

import collections

from gpipe.schedules import render
from gpipe.schedules import simulate

LaneTask = collections.namedtuple('LaneTask', ['stage', 'lane', 'step'])


def Label(task):
  """'b3': lane 1 (a letter; 'l27.' past z), step 3."""
  lane = (chr(ord('a') + task.lane) if task.lane < 26 else
          'l%d.' % task.lane)
  return '%s%d' % (lane, task.step)


def _CheckSizes(num_stages, num_lanes, num_steps=1):
  if num_stages < 1 or num_lanes < 1 or num_steps < 1:
    raise ValueError('decoding lanes need >= 1 stage, lane and step; got %d '
                     'stages, %d lanes, %d steps' %
                     (num_stages, num_lanes, num_steps))


def Dependencies(task, num_stages):
  """The tasks whose outputs `task` reads.

  Args:
    task: a LaneTask.
    num_stages: K.

  Returns:
    A list of LaneTasks: the lane's step at the previous stage, or at
    stage 0 the lane's previous step at the last stage (its token).
  """
  if task.stage > 0:
    return [LaneTask(task.stage - 1, task.lane, task.step)]
  if task.step > 0:
    return [LaneTask(num_stages - 1, task.lane, task.step - 1)]
  return []


def _Placement(stage_devices):
  """(distinct devices in order of first use, stage -> device index)."""
  if isinstance(stage_devices, int):
    stage_devices = list(range(stage_devices))
  devices = list(collections.OrderedDict.fromkeys(stage_devices))
  index = {d: i for i, d in enumerate(devices)}
  return devices, [index[d] for d in stage_devices]


def StepOrders(stage_devices, num_lanes):
  """The (stage, lane) pairs each device runs within one step, in order.

  Sorted by (lane + stage, stage): the tick of one stage per device, stages
  first on a device that holds several. Every device runs the same order in
  every step.

  Args:
    stage_devices: the device (any hashable name) of each stage; or an int K
      for one stage per device.
    num_lanes: M.

  Returns:
    (devices, orders): the distinct devices in order of first use, and per
    device a list of (stage, lane).
  """
  devices, where = _Placement(stage_devices)
  _CheckSizes(len(where), num_lanes)
  orders = []
  for d in range(len(devices)):
    pairs = [(s, m) for s in range(len(where)) if where[s] == d
             for m in range(num_lanes)]
    orders.append(sorted(pairs, key=lambda x: (x[0] + x[1], x[0])))
  return devices, orders


def DeviceOrders(stage_devices, num_lanes, num_steps):
  """Per device, its LaneTasks of all `num_steps` steps in run order.

  Args:
    stage_devices: as for ``StepOrders``.
    num_lanes: M.
    num_steps: T.

  Returns:
    (devices, orders): as ``StepOrders``, with LaneTasks step after step.
  """
  _CheckSizes(1, num_lanes, num_steps)
  devices, step_orders = StepOrders(stage_devices, num_lanes)
  return devices, [[LaneTask(s, m, t) for t in range(num_steps)
                    for s, m in order] for order in step_orders]


def Simulate(stage_devices, num_lanes, num_steps, costs=None):
  """Each device's task per tick, every task as early as its order allows.

  Args:
    stage_devices: as for ``StepOrders``.
    num_lanes: M.
    num_steps: T.
    costs: ticks of a task (a function of the LaneTask); 1 each by default.

  Returns:
    Per device, a list over ticks of its LaneTask (None when idle).
  """
  num_stages = (stage_devices if isinstance(stage_devices, int) else
                len(stage_devices))
  _, orders = DeviceOrders(stage_devices, num_lanes, num_steps)
  return simulate.Simulate(
      orders, num_stages, num_lanes, costs=costs or (lambda task: 1),
      dependencies=lambda task: Dependencies(task, num_stages))


def SimulatedBubble(stage_devices, num_lanes, num_steps, costs=None):
  """The idle fraction of the devices in ``Simulate``."""
  lanes = Simulate(stage_devices, num_lanes, num_steps, costs)
  idle = sum(t is None for lane in lanes for t in lane)
  return idle / float(sum(len(lane) for lane in lanes))


def BubbleFraction(num_stages, num_lanes, num_steps):
  """The idle fraction with one stage per device and unit task costs.

  A device runs T x M tasks in (T-1) max(M, K) + M + K - 1 ticks: each step
  takes M ticks once M >= K (the token of lane m is back at stage 0 when
  the device is done with the other lanes), K ticks otherwise.

  Args:
    num_stages: K.
    num_lanes: M.
    num_steps: T.

  Returns:
    1 - TM / ((T-1) max(M, K) + M + K - 1); (K-1)/(TM+K-1) for M >= K.
  """
  _CheckSizes(num_stages, num_lanes, num_steps)
  k, m, t = num_stages, num_lanes, num_steps
  return 1.0 - float(t * m) / ((t - 1) * max(m, k) + m + k - 1)


BUBBLE_TEXT = '1 - TM/((T-1)max(M,K)+M+K-1): (K-1)/(TM+K-1) for M >= K'


def DefaultNumLanes(num_stages, batch):
  """M when none is given: K lanes (at most one per example), 1 for K=1.

  M = K is the fewest lanes that keep every stage busy in steady state (the
  bubble is (K-1)/(TM+K-1)). More lanes only add calls: each lane's step
  pays every stage's fixed cost (its small ops, its weights read again by
  each matmul), and fewer rows per lane make the matmuls less efficient (2K
  and 4K lanes ran no faster: docs/BENCHMARKS.md, pipelined decoding).
  M = K assumes a hand-over much shorter than a stage's step: each lane's
  token goes through every stage and back, so a device idles for the
  hand-overs of a round (more lanes hide them, at the calls' cost; give
  more where links are slow).

  Args:
    num_stages: K, the stages of the decoding loop (one per device in a
      row).
    batch: examples decoded together.

  Returns:
    M.
  """
  return max(1, min(batch, num_stages))


def EncoderMicroBatches(num_devices, batch, num_lanes):
  """How many micro-batches a decoder's encoder runs in, before the lanes.

  The encoder runs once, forward-only, before the decoding loop; its own
  pipeline over D devices leaves a bubble of (D-1)/(E+D-1) with E
  micro-batches (``gpipe.schedules.inference``), so it gets more of them
  than the loop has lanes: the fewest multiple of M dividing the batch that
  is >= 4D (the largest dividing it if none), and each lane's rows are
  whole micro-batches. One device: 1, as lanes there only cost calls.

  Args:
    num_devices: D, the devices the encoder's stages are on.
    batch: examples decoded together.
    num_lanes: M (dividing `batch`).

  Returns:
    E, a multiple of M dividing `batch` (1 for one device).

  Raises:
    ValueError: M does not divide `batch`.
  """
  _CheckSizes(max(num_devices, 1), num_lanes)
  if batch < 1 or batch % num_lanes:
    raise ValueError('the encoder\'s micro-batches are whole lanes: %d lanes '
                     'must divide the batch of %d' % (num_lanes, batch))
  if num_devices <= 1:
    return 1
  fits = [e for e in range(num_lanes, batch + 1, num_lanes) if batch % e == 0]
  enough = [e for e in fits if e >= 4 * num_devices]
  return enough[0] if enough else fits[-1]


def Render(stage_devices, num_lanes, num_steps, costs=None):
  """The ASCII drawing (devices x ticks) of the lanes, e.g. ``a0 b0 .``."""
  devices, where = _Placement(stage_devices)
  lanes = Simulate(stage_devices, num_lanes, num_steps, costs)
  label = Label
  if len(set(where)) < len(where):
    # Several stages on a device: 'a0s3' says which.
    label = lambda task: '%ss%d' % (Label(task), task.stage)
  return render.RenderDevices(lanes, ['d%d' % i for i in range(len(devices))],
                              label=label)
