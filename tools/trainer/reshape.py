"""The pipeline's shape for another number of devices (``--elastic``).

When devices are lost or come back, the run goes on in a new shape: R
replicas of a K-stage pipeline with M micro-batches each, a schedule and v
stages per device (D = K/v devices per replica), on at most the devices
that serve. Every shape is chosen from the run's *starting* shape (the flags
or the plan it was started with), never from the one before it, so a run
that loses a device and gets it back returns to where it started.

The global batch never changes, so a step consumes the same examples and
the input goes on where the checkpoint left it. Where the counts allow, the
number of micro-batches per step, R x M, is kept too: then every
micro-batch holds the same examples with the same dropout seeds, and the
loss, every gradient and update are those of the uninterrupted run (up to
the order of floating-point sums).

Two ways to choose, the first that applies:

1. ``FromProfile``: the run's saved planner profile (``<logdir>/profile.json``
   of ``--plan=auto``) is searched for n = N, N-1, ... down to N/2 devices
   under ``--memory_per_device`` (``gpipe.plan.search``, in the run's
   compute dtype): the fastest configuration keeping R x M on the most
   devices, else the fastest of any R x M on the most devices. When none
   fits on any count, ``NoShapeError`` gives the least memory a device
   would need and the cap.
2. ``Fallback``, without a profile (the rule the docs describe):

   a. keep the pipeline (K, its cut rule, the schedule, v: each device holds
      the same stages as before, so it fits in the same memory) and take as
      many replicas R' <= N / D as divide R x M, M' = R x M / R' (R' D
      devices used; the rest wait as spares);
   b. with fewer devices than one pipeline needs (N < D): one replica, the
      same schedule on all N devices (K' = vN, so each device holds more
      layers), M' = R x M, or fill-drain ('gpipe', K' = N) when the
      schedule cannot run that shape; each device then holds about D/N
      times the layers, which the rule cannot check without a profile
      (with ``--memory_per_device`` the trainer checks the weights and
      optimizer slots alone).

Pure Python: no TensorFlow (the planner's search and the schedule registry).
"""

import dataclasses
import math

from gpipe.plan import choice
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.schedules import registry

PROFILE = 'profile'
# The run's shape as it started (the flags' or a plan's).
START = 'start'
FALLBACK = 'fallback rule'


class NoShapeError(ValueError):
  """No shape fits the devices that serve; the text gives the numbers."""


@dataclasses.dataclass(frozen=True)
class Shape(simulator.DeviceCounts):
  """R replicas x K stages, M micro-batches each, a schedule, v per device.

  Attributes:
    replicas: R.
    num_stages: K.
    micro_batches: M per replica.
    schedule: a registered schedule name.
    stages_per_device: v (K = vD): 1, 2 for 'zb_v', or more for looped
      ('gpipe') and interleaved stages.
  """
  replicas: int
  num_stages: int
  micro_batches: int
  schedule: str
  stages_per_device: int = 1

  @property
  def micro_batches_per_step(self):
    """R x M."""
    return self.replicas * self.micro_batches

  @property
  def loop_stages(self):
    """Several stages per device by looping (the trainer's --loop_stages)."""
    return (self.stages_per_device > 1 and
            registry.Get(self.schedule).placement == registry.ANY)

  @property
  def label(self):
    """'R=2 K=2 M=4 gpipe' (with ' v=2' for several stages per device)."""
    return 'R=%d K=%d M=%d %s%s' % (
        self.replicas, self.num_stages, self.micro_batches, self.schedule,
        ' v=%d' % self.stages_per_device if self.stages_per_device > 1
        else '')

  def ToJson(self):
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Choice:
  """A new shape and how it was chosen.

  Attributes:
    shape: the Shape.
    plan: the gpipe.plan.choice.Plan it comes from (FromProfile), or None.
    how: START, PROFILE or FALLBACK (or what else chose it).
    note: what it keeps or changes, in words.
    cut: layers per stage to use instead of the shape's own cut (a
      rebalanced cut), or None.
  """
  shape: Shape
  plan: object = None
  how: str = FALLBACK
  note: str = ''
  cut: tuple = None

  @property
  def keeps_math(self):
    return 'keeps R x M' in self.note


def Allowed(schedule, num_stages, num_devices, micro_batches):
  """None if `schedule` runs K stages on D devices with M, else why not."""
  entry = registry.Get(schedule)
  k, d, m = num_stages, num_devices, micro_batches
  if entry.placement == registry.V_SHAPE and k != 2 * d:
    return 'schedule %r needs K = 2D' % schedule
  if entry.placement == registry.ONE_PER_DEVICE and k != d:
    return 'schedule %r runs one stage per device' % schedule
  if entry.placement in (registry.ANY, registry.ROUND_ROBIN) and k % d:
    return 'schedule %r needs the same number of stages on each device' % (
        schedule)
  if entry.check is not None:
    return entry.check(k, d, m)
  return None


def _Keeps(total, shape):
  if shape.micro_batches_per_step == total:
    return 'keeps R x M = %d micro-batches per step' % total
  return ('R x M = %d instead of %d: the micro-batches hold other examples, '
          'so the losses differ slightly from an uninterrupted run' %
          (shape.micro_batches_per_step, total))


def Fallback(start, num_devices, num_layers=None):
  """The shape on `num_devices` devices by the fallback rule (module doc).

  Args:
    start: the run's starting Shape.
    num_devices: N, the devices that serve (>= 1).
    num_layers: the pipeline's layers (K' never exceeds it), or None.

  Returns:
    A Choice.

  Raises:
    NoShapeError: no device, or no shape the schedules allow.
  """
  if num_devices < 1:
    raise NoShapeError('no device serves')
  total = start.micro_batches_per_step
  d = start.devices_per_replica
  if num_devices >= d:
    for r in range(min(num_devices // d, total), 0, -1):
      if total % r:
        continue
      shape = dataclasses.replace(start, replicas=r,
                                  micro_batches=total // r)
      if Allowed(shape.schedule, shape.num_stages, d,
                 shape.micro_batches) is None:
        return Choice(shape, None, FALLBACK, 'the same pipeline (K=%d, v=%d) '
                      'in %d replica(s) on %d of %d device(s); %s' %
                      (shape.num_stages, shape.stages_per_device, r,
                       shape.num_devices, num_devices, _Keeps(total, shape)))
  candidates = [dataclasses.replace(
      start, replicas=1, micro_batches=total,
      num_stages=start.stages_per_device * num_devices)]
  candidates.append(Shape(1, num_devices, total, 'gpipe', 1))
  for shape in candidates:
    if num_layers is not None and shape.num_stages > num_layers:
      continue
    if Allowed(shape.schedule, shape.num_stages, shape.devices_per_replica,
               shape.micro_batches) is None:
      return Choice(shape, None, FALLBACK, 'a shorter pipeline on all %d '
                    'device(s) (each holds about %.3g times the layers it '
                    'held); %s' % (num_devices,
                                   d / float(shape.devices_per_replica),
                                   _Keeps(total, shape)))
  raise NoShapeError(
      'no shape of %s fits %d device(s) by the fallback rule' %
      (start.label, num_devices))


def FromPlan(plan):
  """The Shape of a gpipe.plan.choice.Plan."""
  c = plan.config
  return Shape(c.replicas, c.num_stages, c.micro_batches, c.schedule,
               c.stages_per_device)


def FromProfile(profile, start, num_devices, memory_per_device=None,
                dtype='float32', model=None):
  """The planner's shape on at most `num_devices` devices (module doc).

  Args:
    profile: the run's gpipe.plan.profile.Profile.
    start: the starting Shape (its R x M is kept where a plan allows).
    num_devices: N, the devices that serve.
    memory_per_device: the cap in bytes, or None.
    dtype: the run's compute dtype (kept).
    model: the model's name for the plan (default: the profile's).

  Returns:
    A Choice with the plan.

  Raises:
    NoShapeError: nothing fits on any count down to one device; the text
      gives what a device would need and the cap.
  """
  if num_devices < 1:
    raise NoShapeError('no device serves')
  total = start.micro_batches_per_step
  fallback = None
  least = None
  for n in range(num_devices, 0, -1):
    result = search.Search(profile, n, memory_per_device, dtypes=[dtype])
    keeping = [c for c in result.candidates
               if c.config.replicas * c.config.micro_batches == total]
    if keeping and n * 2 >= num_devices:
      return _Chosen(keeping[0], n, num_devices, memory_per_device,
                     model or profile.model, total)
    if result.candidates and fallback is None:
      fallback = (result.candidates[0], n)
    for c in result.dropped:
      if c.prediction is not None:
        need = max(c.prediction.peak_bytes)
        least = need if least is None else min(least, need)
    if fallback is not None and n * 2 < num_devices:
      break
  if fallback is not None:
    return _Chosen(fallback[0], fallback[1], num_devices, memory_per_device,
                   model or profile.model, total)
  weights = search.WeightBytesPerDevice(
      [layer.param_bytes for layer in profile.layers],
      profile.optimizer_slots, num_devices)
  raise NoShapeError(
      'the %d device(s) that serve cannot hold %s under --memory_per_device='
      '%s: %s, and the weights and optimizer slots alone need %s on a device '
      'at best' % (
          num_devices, profile.model,
          search.Bytes(memory_per_device) if memory_per_device else '(none)',
          'the leanest configuration needs %s on its fullest device' %
          search.Bytes(least) if least is not None else
          'no configuration of the planner runs there',
          search.Bytes(weights)))


def _Chosen(candidate, used, available, cap, model, total):
  plan = choice.FromCandidate(candidate, used, cap, model)
  shape = FromPlan(plan)
  return Choice(shape, plan, PROFILE, 'the planner\'s fastest on %d of %d '
                'device(s) (%s); %s' % (used, available, plan.Describe(),
                                        _Keeps(total, shape)))


def CheckWeights(state_bytes, shape, memory_per_device):
  """Raises NoShapeError if `shape`'s devices cannot hold the state alone.

  The check the fallback rule can make without a profile: the weights and
  optimizer slots (``state_bytes``, e.g. every variable of the newest
  checkpoint) spread at best evenly over the D devices of one replica (the
  variables live on the first replica's), against the cap.

  Args:
    state_bytes: the bytes of every variable of the model and optimizer.
    shape: the chosen Shape.
    memory_per_device: the cap in bytes (None: nothing to check).
  """
  if memory_per_device is None or state_bytes is None:
    return
  need = state_bytes / float(shape.devices_per_replica)
  if need > memory_per_device:
    raise NoShapeError(
        'the %d device(s) of %s cannot hold the model under '
        '--memory_per_device=%s: its weights and optimizer slots alone '
        '(%s) need at least %s on each (%d bytes), before any gradient or '
        'activation' % (shape.devices_per_replica, shape.label,
                        search.Bytes(memory_per_device),
                        search.Bytes(state_bytes), search.Bytes(need),
                        math.ceil(need)))
