"""Inference schedules: forward tasks only, and decoding lanes.

A pipeline that computes no gradients (evaluation, inference, the encoder of
a pipelined decoder) runs the forward-only schedule: each device runs the F
tasks of its stages, micro-batch after micro-batch, with nothing kept for a
backward pass (no re-materialization, no activations beyond the hand-over to
the next stage). ``gpipe.PipeliningLayer`` runs it whenever the layer is in
eval mode (Lingvo's ``do_eval``), whatever training ``schedule`` it has. K=3,
M=4 (``Render(3, 4)``)::

    d0 | F0 F1 F2 F3 .  .
    d1 | .  F0 F1 F2 F3 .
    d2 | .  .  F0 F1 F2 F3

Several stages per device loop breadth-first, as fill-drain's forward half
(``orders.DeviceOrders``). Autoregressive decoding runs in lanes instead
(``gpipe.schedules.decode_lanes``). ``MarkdownTable()`` lists both.
"""

import collections

from gpipe.schedules import decode_lanes
from gpipe.schedules import orders as orders_lib
from gpipe.schedules import render
from gpipe.schedules import simulate

FORWARD_ONLY = 'forward_only'
DECODE_LANES = 'decode_lanes'


def ForwardOrders(stage_devices, num_micro_batches):
  """The forward-only task order of every device.

  Args:
    stage_devices: the device (any hashable name) of each stage; or an int
      K for one stage per device.
    num_micro_batches: M.

  Returns:
    (devices, orders): the distinct devices in order of first use, and for
    each a list of its F Tasks in run order.
  """
  if isinstance(stage_devices, int):
    stage_devices = list(range(stage_devices))
  ticks = orders_lib.GPipeClockCycles(len(stage_devices), num_micro_batches,
                                      backward=False)
  return orders_lib.DeviceOrders(ticks, stage_devices)


def ForwardBubble(num_devices, stages_per_device, num_micro_batches):
  """The idle fraction of the forward-only schedule, equal task costs."""
  return simulate.LoopedBubbleFraction(num_devices, stages_per_device,
                                       num_micro_batches)


def Render(stage_devices, num_micro_batches):
  """The forward-only schedule drawn as devices x ticks."""
  devices, orders = ForwardOrders(stage_devices, num_micro_batches)
  k = stage_devices if isinstance(stage_devices, int) else len(stage_devices)
  lanes = simulate.Simulate(orders, k, num_micro_batches)
  return render.RenderDevices(lanes, ['d%d' % i for i in range(len(devices))])


InferenceSchedule = collections.namedtuple(
    'InferenceSchedule', ['name', 'used_by', 'bubble_text', 'description'])

SCHEDULES = (
    InferenceSchedule(
        FORWARD_ONLY, 'eval mode of every pipeline (trainer `--mode=eval`, '
        'the encoder of pipelined decoding)', '(D-1)/(vM+D-1)',
        'F tasks only, micro-batch after micro-batch on each device; no '
        'backward, no re-materialization'),
    InferenceSchedule(
        DECODE_LANES, 'pipelined decoding (trainer `--mode=decode`)',
        decode_lanes.BUBBLE_TEXT,
        'M lanes of the batch through the stages one step at a time: while '
        'stage k runs lane m, stage k+1 runs lane m-1; a lane\'s token '
        'goes back to the first stage for its next step'),
)


def MarkdownTable():
  """The inference schedules as a Markdown table."""
  rows = ['| schedule | used by | bubble (equal task costs) | what it is |',
          '|---|---|---|---|']
  for s in SCHEDULES:
    rows.append('| `%s` | %s | %s | %s |' % (s.name, s.used_by,
                                              s.bubble_text, s.description))
  return '\n'.join(rows) + '\n'
