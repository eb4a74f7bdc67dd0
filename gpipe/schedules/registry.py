"""The schedule registry: every schedule, its rules and its costs, by name.

One entry per schedule (``Schedule``) holds everything the rest of the
project needs to know about it: the function giving each device's task
order (``gpipe.schedules.orders``), where it puts the stages (one per
device, round-robin, a V), which K and M it runs (with the error that says
what to change), whether it splits the backward into B and W, whether it
needs the loss per micro-batch, its bubble with equal task costs, the
activations its first device holds, and a one-line description. The
executor, the layer params' docs, the trainer's ``--schedule`` flag, the
benchmarks and the README's table all read it, so adding a schedule is one
``Register(Schedule(...))`` call plus its orders function::

  Register(Schedule(
      name='my_schedule', description='...', placement=ONE_PER_DEVICE,
      orders=lambda k, d, m, where, costs: MyOrders(k, m),
      split_backward=False, per_micro_batch_loss=True,
      bubble=lambda d, v, m: ..., bubble_text='...',
      activations=lambda d, v, m: ..., activations_text='...',
      check=None, micro_batches_text='any', stages_per_device=1))

Units: D devices, v stages per device (K = vD stages), M micro-batches.
``bubble(d, v, m)`` is the idle fraction of a step with T_F = T_B = T_W;
``activations(d, v, m)`` is the most micro-batch stages the first device
holds between their F and their B (in stage-sized units: 1/v of a
one-stage-per-device pipeline's), checked against the orders by
``simulate.PeakInFlight`` in the tests.
"""

import collections

from gpipe.schedules import orders as orders_lib
from gpipe.schedules import simulate
from gpipe.schedules import timed

# Placement rules: where stage s goes among D devices.
ANY = 'any'  # Any placement; several stages per device run breadth-first.
ONE_PER_DEVICE = 'one_per_device'  # K = D, stage s on device s.
ROUND_ROBIN = 'round_robin'  # Stage s on device s mod D, v = K / D each.
V_SHAPE = 'v'  # K = 2D, stage s on device min(s, K-1-s).

PLACEMENT_TEXT = {
    ANY: 'any (several stages per device: breadth-first loop)',
    ONE_PER_DEVICE: 'one stage per device',
    ROUND_ROBIN: 'round-robin: stage s on device s mod D',
    V_SHAPE: 'a V: device d holds stages d and K-1-d',
}


class Schedule(
    collections.namedtuple('Schedule', [
        'name', 'description', 'placement', 'orders', 'split_backward',
        'per_micro_batch_loss', 'bubble', 'bubble_text', 'activations',
        'activations_text', 'check', 'micro_batches_text', 'stages_per_device'
    ])):
  """One pipeline schedule.

  Attributes:
    name: the key users write (``p.schedule``, ``--schedule``).
    description: one line.
    placement: ANY, ONE_PER_DEVICE, ROUND_ROBIN or V_SHAPE.
    orders: function(k, d, m, where, costs) -> per device, its Tasks in run
      order; `where` is each stage's device index, `costs` the relative task
      costs (``simulate.TaskCost``) for schedules that place tasks by them.
    split_backward: whether the backward is two tasks, B and W.
    per_micro_batch_loss: whether micro-batch m's backward starts right after
      its forward (the loss computed inside the pipeline).
    bubble: function(d, v, m) -> idle fraction with equal task costs.
    bubble_text: that formula, for docs.
    activations: function(d, v, m) -> the most micro-batch stages the first
      device holds between F and B.
    activations_text: that bound, for docs.
    check: function(k, d, m) -> None or an error text saying what to change,
      beyond the placement rule.
    micro_batches_text: the M it runs, for docs.
    stages_per_device: the v benchmarks and defaults use (1, or 2 for the
      schedules made for several stages per device).
  """

  __slots__ = ()


_REGISTRY = collections.OrderedDict()


def Register(schedule):
  """Adds `schedule` (a Schedule) to the registry; its name must be new."""
  if schedule.name in _REGISTRY:
    raise ValueError('schedule %r is already registered' % schedule.name)
  if schedule.placement not in PLACEMENT_TEXT:
    raise ValueError('schedule %r: unknown placement %r; use one of %s' %
                     (schedule.name, schedule.placement,
                      ', '.join(PLACEMENT_TEXT)))
  _REGISTRY[schedule.name] = schedule
  return schedule


def Names():
  """The registered schedule names, in registration order."""
  return list(_REGISTRY)


def Get(name):
  """The Schedule called `name`; a clear error naming the known ones."""
  if name not in _REGISTRY:
    raise ValueError('unknown schedule %r; known schedules: %s' %
                     (name, ', '.join(_REGISTRY)))
  return _REGISTRY[name]


def Placement(name, num_stages, num_devices):
  """Each stage's device index under `name`'s placement rule.

  Args:
    name: a schedule.
    num_stages: K.
    num_devices: D.

  Returns:
    A list of K device indices in [0, D).

  Raises:
    ValueError: K and D that the rule cannot lay out, saying why.
  """
  rule = Get(name).placement
  if rule == V_SHAPE:
    if num_stages % 2:
      raise ValueError('schedule %r places two stages per device in a V: K '
                       'must be even, got K=%d' % (name, num_stages))
    if num_stages != 2 * num_devices:
      raise ValueError(
          'schedule %r places two stages per device in a V: K=%d stages need '
          '%d devices, not %d' % (name, num_stages, num_stages // 2,
                                  num_devices))
    return orders_lib.VPlacement(num_stages)
  if rule == ONE_PER_DEVICE and num_stages != num_devices:
    raise ValueError(
        'schedule %r runs one stage per device: K=%d stages need %d devices, '
        'not %d' % (name, num_stages, num_stages, num_devices))
  if num_stages % num_devices and rule != ANY:
    raise ValueError(
        'schedule %r: %d stages do not go evenly round-robin over %d devices; '
        'use a number of stages that is a multiple of the devices' %
        (name, num_stages, num_devices))
  return orders_lib.RoundRobinPlacement(num_stages, num_devices)


def _Indices(stage_devices):
  """(distinct devices in order of first use, stage -> device index)."""
  devices = list(collections.OrderedDict.fromkeys(stage_devices))
  index = {d: i for i, d in enumerate(devices)}
  return devices, [index[d] for d in stage_devices]


def _PlacementError(schedule, k, d, where, stage_devices):
  """The error text if `where` breaks the schedule's placement rule."""
  rule = schedule.placement
  if rule == ONE_PER_DEVICE and d != k:
    return ('schedule %r runs one stage per device, but the %d stages share '
            '%d devices (%s): give each stage its own device, or use a '
            'schedule for several stages per device (%s)' % (
                schedule.name, k, d, list(stage_devices), ', '.join(
                    repr(s.name) for s in _REGISTRY.values()
                    if s.placement in (ROUND_ROBIN, V_SHAPE, ANY))))
  if rule == ROUND_ROBIN and (
      k % d or where != orders_lib.RoundRobinPlacement(k, d)):
    return ('schedule %r needs the stages round-robin over the devices, the '
            'same number on each (stage s on device s mod D), e.g. '
            'stage_devices [d0, d1, d0, d1]; got %s' %
            (schedule.name, list(stage_devices)))
  if rule == V_SHAPE and (k % 2 or where != orders_lib.VPlacement(k)):
    return ('schedule %r needs two stages per device in a V: K=2D stages on '
            'D devices, stage_devices [d0, d1, ..., d(D-1), d(D-1), ..., d1, '
            'd0] (device d holds stages d and K-1-d); got %s. With one stage '
            'per device use %s' % (schedule.name, list(stage_devices), ', '.join(
                repr(s.name) for s in _REGISTRY.values()
                if s.placement == ONE_PER_DEVICE and s.split_backward)))
  return None


def Orders(name, stage_devices, num_micro_batches, costs=None):
  """The task order of every device under schedule `name`.

  Args:
    name: a registered schedule.
    stage_devices: the device (any hashable name) of each stage, K entries;
      or an int K for one stage per device.
    num_micro_batches: M.
    costs: relative task costs, {'F': 1, 'B': 1, 'W': 1} by default
      (``simulate.RematCosts`` with re-materialization); schedules that place
      tasks by cost (the zero-bubble ones) use them.

  Returns:
    (devices, orders): the distinct devices in order of first use, and for
    each a list of its Tasks in run order.

  Raises:
    ValueError: an unknown schedule, or a placement or M it cannot run,
      saying what to change.
  """
  schedule = Get(name)
  if isinstance(stage_devices, int):
    stage_devices = list(range(stage_devices))
  k, m = len(stage_devices), num_micro_batches
  simulate.CheckSizes(k, m)
  devices, where = _Indices(stage_devices)
  d = len(devices)
  problem = _PlacementError(schedule, k, d, where, stage_devices)
  if problem is None and schedule.check is not None:
    problem = schedule.check(k, d, m)
  if problem:
    raise ValueError(problem)
  if schedule.placement == ANY:
    return orders_lib.DeviceOrders(schedule.orders(k, d, m, where, costs),
                                   stage_devices)
  return devices, schedule.orders(k, d, m, where, costs)


def BubbleFormula(name, num_devices, stages_per_device, num_micro_batches):
  """The idle fraction of `name` with T_F = T_B = T_W (``bubble_text``)."""
  return Get(name).bubble(num_devices, stages_per_device, num_micro_batches)


def Costs(name, forward=1, backward=1, weight=1):
  """Ticks per phase for simulating `name`: B includes W without a split."""
  return simulate.CostsOf(Get(name).split_backward, forward, backward, weight)


def ParamDoc():
  """The schedules as one sentence, for params and flags."""
  return '; '.join("'%s': %s" % (s.name, s.description)
                   for s in _REGISTRY.values())


def MarkdownTable():
  """The registry as a Markdown table (the README's schedule table)."""
  rows = [
      '| schedule | placement | split backward | loss per micro-batch | '
      'M | bubble (T_F = T_B = T_W) | activations on the first device | '
      'what it is |',
      '|---|---|---|---|---|---|---|---|',
  ]
  for s in _REGISTRY.values():
    rows.append('| `%s` | %s | %s | %s | %s | %s | %s | %s |' % (
        s.name, PLACEMENT_TEXT[s.placement],
        'yes' if s.split_backward else 'no',
        'yes' if s.per_micro_batch_loss else 'no', s.micro_batches_text,
        s.bubble_text,
        s.activations_text, s.description))
  return '\n'.join(rows) + '\n'


def _NeedsAtLeastKMicroBatches(name):
  def Check(k, d, m):
    del d
    if m < k:
      return ('schedule %r needs at least as many micro-batches as stages: '
              'M=%d < K=%d. Use num_micro_batches >= %d (or schedule gpipe)' %
              (name, m, k, k))
    return None
  return Check


def _InterleavedCheck(k, d, m):
  v = k // d
  if v > 1 and m % d:
    return ("schedule 'interleaved_1f1b' needs M a multiple of the %d devices "
            '(micro-batches go through in groups of D); got M=%d: use %d or %d'
            % (d, m, max(d, m - m % d), m + d - m % d))
  if m < (d if v > 1 else k):
    return ("schedule 'interleaved_1f1b' needs M >= %d micro-batches here; got "
            '%d' % (d if v > 1 else k, m))
  return None


def _InterleavedActivations(d, v, m):
  if v == 1:
    return min(d, m)
  return min(2 * (d - 1) + (v - 1) * d + 1, v * m)


Register(Schedule(
    name='gpipe',
    description='fill-drain (GPipe): all forwards, then all backwards; '
    'several stages per device loop breadth-first',
    placement=ANY,
    orders=lambda k, d, m, where, costs: orders_lib.GPipeClockCycles(k, m),
    split_backward=False, per_micro_batch_loss=False,
    bubble=simulate.LoopedBubbleFraction,
    bubble_text='(D-1)/(vM+D-1) (M >= D)',
    activations=lambda d, v, m: v * m,
    activations_text='all vM',
    check=None, micro_batches_text='any', stages_per_device=1))

Register(Schedule(
    name='1f1b',
    description='one forward, one backward (PipeDream-flush): GPipe\'s '
    'bubble, at most K micro-batches of activations',
    placement=ONE_PER_DEVICE,
    orders=lambda k, d, m, where, costs: orders_lib.OneFOneBOrders(k, m),
    split_backward=False, per_micro_batch_loss=True,
    bubble=lambda d, v, m: (d - 1.0) / (v * m + d - 1),
    bubble_text='(K-1)/(M+K-1)',
    activations=lambda d, v, m: min(d, m),
    activations_text='K',
    check=_NeedsAtLeastKMicroBatches('1f1b'), micro_batches_text='M >= K',
    stages_per_device=1))

Register(Schedule(
    name='interleaved_1f1b',
    description='1F1B with v stages per device round-robin (Megatron-LM): '
    'v times smaller bubble, v times the hand-overs',
    placement=ROUND_ROBIN,
    orders=lambda k, d, m, where, costs: orders_lib.InterleavedOrders(
        d, k // d, m),
    split_backward=False, per_micro_batch_loss=True,
    bubble=lambda d, v, m: (d - 1.0) / (v * m + d - 1),
    bubble_text='(D-1)/(vM+D-1)',
    activations=_InterleavedActivations,
    activations_text='2(D-1)+(v-1)D+1 stage-sized (v > 1)',
    check=_InterleavedCheck,
    micro_batches_text='M >= K (v = 1); a multiple of D, >= D (v > 1)',
    stages_per_device=2))

Register(Schedule(
    name='zb_h1',
    description='zero bubble H1: 1F1B with the backward split into B and W, '
    'W filling the bubble',
    placement=ONE_PER_DEVICE,
    orders=lambda k, d, m, where, costs: orders_lib.ZeroBubbleH1Orders(
        k, m, costs),
    split_backward=True, per_micro_batch_loss=True,
    # (D-1)(T_F+T_B-T_W) idle per device over a 3M-tick step.
    bubble=lambda d, v, m: (d - 1.0) / (3 * m + d - 1),
    bubble_text='(K-1)/(3M+K-1)',
    activations=lambda d, v, m: min(d, m),
    activations_text='K (2K awaiting their W)',
    check=_NeedsAtLeastKMicroBatches('zb_h1'), micro_batches_text='M >= K',
    stages_per_device=1))

Register(Schedule(
    name='zb_v',
    description='zero bubble V: two stages per device in a V, split '
    'backward: about no bubble at 1F1B\'s memory',
    placement=V_SHAPE,
    orders=lambda k, d, m, where, costs: orders_lib.ZeroBubbleVOrders(
        d, m, costs),
    split_backward=True, per_micro_batch_loss=True,
    # (D-1)(T_F+T_B-2T_W) = 0 leaves the fill of the first forward, D-1
    # half-stage ticks over a 6M-tick step.
    bubble=lambda d, v, m: (d - 1.0) / (6 * m + d - 1),
    bubble_text='(D-1)/(6M+D-1) (M >= D)',
    # Device 0 holds stage 0's forwards until micro-batch 0 comes back down
    # the V to stage K-1 on the same device.
    activations=lambda d, v, m: min(2 * d, m + 1),
    activations_text='min(K, M+1) half-size stages',
    check=None, micro_batches_text='any', stages_per_device=2))

# Timing-aware zero bubble: ZB-H1's placement, rules and equal-cost bubble
# (with 1F1B's memory the first device idles K-1 ticks before its first B,
# with no W pending yet: the least possible), orders from measured costs.
Register(Get('zb_h1')._replace(
    name='zb_auto',
    description='zero bubble, timing-aware: F, B and W ordered by the '
    'measured time of each stage\'s tasks (the planner\'s task_costs) under '
    'a memory limit per stage; ZB-H1\'s step with equal costs',
    orders=lambda k, d, m, where, costs: timed.TimedZeroBubbleOrders(
        k, m, costs),
    activations_text='K (default limit; task_costs may raise it)',
    check=_NeedsAtLeastKMicroBatches('zb_auto')))
