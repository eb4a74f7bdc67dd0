"""Drawing schedules: ASCII timelines of devices (or stages) x ticks.

``RenderSchedule('zb_h1', 3, 6)`` draws a registered schedule with unit task
costs (a B without a split backward draws twice as long, since it also does
W's work); the drawings in ``gpipe.schedules.orders`` come from here.
"""

from gpipe.schedules import orders as orders_lib
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import registry
from gpipe.schedules import simulate

FORWARD = pipeline_tasks.FORWARD


def ClockCycles(name, num_stages, num_micro_batches, backward=True):
  """The ticks of schedule `name` with one stage per device, unit costs.

  Args:
    name: a registered schedule.
    num_stages: K.
    num_micro_batches: M.
    backward: include the backward (B and W) tasks.

  Returns:
    A list of ticks; each tick is a list of Tasks that run concurrently.
  """
  if name == 'gpipe':
    return orders_lib.GPipeClockCycles(num_stages, num_micro_batches,
                                       backward=backward)
  _, orders = registry.Orders(name, num_stages, num_micro_batches)
  lanes = simulate.Simulate(orders, num_stages, num_micro_batches,
                            registry.Get(name).per_micro_batch_loss)
  ticks = [[lane[t] for lane in lanes if lane[t] is not None]
           for t in range(len(lanes[0]))]
  if not backward:
    ticks = [[x for x in tick if x.phase == FORWARD] for tick in ticks]
    ticks = [tick for tick in ticks if tick]
  return ticks


def RenderDevices(lanes, devices=None, label=None):
  """An ASCII timeline (devices x ticks) of ``Simulate``'s result.

  Each cell is phase, micro-batch and stage, e.g. ``F3s2``; just ``F3``
  when every device holds one stage.

  Args:
    lanes: per device, the task of each tick (None: idle).
    devices: the row names (default 'device d').
    label: optional function(task) -> its cell text (for other task
      vocabularies, e.g. decoding lanes).

  Returns:
    A multi-line string.
  """
  names = devices or ['device %d' % d for d in range(len(lanes))]
  one_stage = all(len({t.stage for t in lane if t}) <= 1 for lane in lanes)
  # One stage per device: 'B3' says it all; else 'B3s2' (stage 2).
  if label is None:
    label = (lambda t: '%s%d' % (t.phase, t.micro_batch)) if one_stage else (
        pipeline_tasks.Label)
  cells = [[label(t) if t else '.' for t in lane] for lane in lanes]
  width = max(len(c) for row in cells for c in row)
  name_width = max(len(str(n)) for n in names)
  return '\n'.join('%s | %s' % (str(n).ljust(name_width),
                                 ' '.join(c.ljust(width) for c in row).rstrip())
                    for n, row in zip(names, cells))



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


def RenderSchedule(name, stage_devices, num_micro_batches, costs=None):
  """The ASCII drawing (devices x ticks) of schedule `name`.

  Args:
    name: a schedule.
    stage_devices: as for ``Orders`` (an int K: one stage per device).
    num_micro_batches: M.
    costs: ticks per phase or per task (default ``registry.Costs(name)``: a
      B without a split draws twice as long); the schedules that order
      tasks by cost are ordered by them too.

  Returns:
    A multi-line string, one row per device; cells like ``B3s1``.
  """
  devices, orders = registry.Orders(name, stage_devices, num_micro_batches,
                                    costs)
  k = stage_devices if isinstance(stage_devices, int) else len(stage_devices)
  lanes = simulate.Simulate(orders, k, num_micro_batches,
                            registry.Get(name).per_micro_batch_loss,
                            costs or registry.Costs(name))
  return RenderDevices(lanes, ['d%d' % i for i in range(len(devices))])
