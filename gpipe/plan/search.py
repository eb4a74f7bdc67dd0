"""Searching every configuration of a model for D devices under a cap.

``Search(profile, num_devices, memory_per_device)`` enumerates the ways to
train the profiled model on ``num_devices`` devices: R data-parallel
replicas of a K-stage pipeline on D devices each, R x D = N (the trainer's
layout uses every device it is given, ``gpipe.runtime.layout.Layout``), every
schedule of the registry with the stages per device its placement allows, M
micro-batches per replica that divide the batch, every remat mode, batched
weight gradients or not, and every compute dtype the profile measured. Each
pipeline is cut where the measured per-layer time balances the stages
(``balance.PartitionByCost`` on F + B + W at the micro-batch size).
Equivalent configurations are tried once: one stage runs every schedule
alike ('gpipe' stands for them, and 'except_last' is 'never' there), one
micro-batch has nothing to batch, looping needs two devices. Every
configuration is simulated (``simulator.Predict``); those the schedule
refuses, or whose predicted peak memory exceeds the cap (less a headroom,
``HEADROOM`` of it by default) on some device, are dropped with the reason.
The rest are ranked by predicted examples/s. A configuration the planner
ran through the trainer itself (the profile's ``trainer_reference``:
``tools/plan/trainer_step.py``) is predicted by that measured step, not
extrapolated; one it did not run ranks by its fitted step lengthened by the
fit's largest error on a measured one it was not fitted to (``Measured``),
so that an extrapolation beats a measurement only by more than the fit is
known to miss by. Peak memory assumes the
update reads every gradient before it applies any (each stage's gradient
sum kept to the end of the step, as Lingvo's learner needs) unless
``update=simulator.UPDATE_EACH_VARIABLE`` says it applies each variable's
gradient as soon as it is complete (``simulator.Predict``).

For ``'zb_auto'`` the memory limit of each stage (micro-batches between F
and B, and between F and W) is the most the cap leaves room for after the
stage's variables, gradient sum and temporaries, so it may run ZB-H2-like
deep warm-ups when memory allows and 1F1B-like ones when it does not.
"""

import collections
import math

from gpipe import balance
from gpipe.plan import simulator
from gpipe.schedules import registry
from gpipe.schedules import timed

GIB = float(1 << 30)
MIB = float(1 << 20)

# Dropped configurations, by kind (the table's last lines).
NOT_ALLOWED = 'not allowed by the schedule'
DOES_NOT_FIT = 'does not fit the memory cap'
LOSS_AFTER = 'needs the loss in the pipeline'

# One stage runs the same tasks under every schedule: only this one is tried
# (split backward at K=1 is batched W's business).
_ONE_STAGE_SCHEDULE = 'gpipe'


class Candidate(
    collections.namedtuple('Candidate', ['config', 'prediction', 'reason',
                                         'measured'], defaults=(False,))):
  """One configuration: its Prediction (None if refused) and why dropped.

  Attributes:
    config: a simulator.Configuration.
    prediction: its simulator.Prediction, or None when it was refused
      before simulating.
    reason: None when it fits and runs, else (kind, text): kind one of
      NOT_ALLOWED, DOES_NOT_FIT, LOSS_AFTER.
    measured: whether its step (and examples/s) is the trainer's measured
      one (``Measured``), not the simulator's.
  """

  __slots__ = ()


class SearchResult(
    collections.namedtuple('SearchResult', [
        'candidates', 'dropped', 'num_devices', 'memory_per_device', 'model',
        'update', 'fit_error'
    ], defaults=(simulator.UPDATE_ALL_GRADIENTS, 0.0))):
  """Search's answer.

  Attributes:
    candidates: the configurations that fit, fastest first (Candidates).
    dropped: the others, with their reasons.
    num_devices: the devices searched for.
    memory_per_device: the cap in bytes (None: no cap).
    model: the profile's model name.
    update: the update's timing the peaks assume (``simulator.UPDATES``).
    fit_error: the fit's largest error on the measured candidates (see
      ``Measured``; 0.0 without them).
  """

  __slots__ = ()

  @property
  def best(self):
    """The fastest Candidate that fits, or None."""
    return self.candidates[0] if self.candidates else None


def _Divisors(n, limit):
  return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _StagesPerDevice(name, max_v):
  """The v values schedule `name` runs (its placement rule)."""
  rule = registry.Get(name).placement
  if rule == registry.ONE_PER_DEVICE:
    return [1]
  if rule == registry.V_SHAPE:
    return [2]
  return [v for v in (1, 2, 4) if v <= max_v]


def DeviceShapes(num_devices):
  """(R, D) pairs: R replicas of D devices, R x D = num_devices.

  Only shapes using every device: the trainer lays its replicas' stages
  out over exactly the devices it has (``gpipe.runtime.layout.Layout``
  refuses R x D != N), so a plan for fewer would be refused after the
  measuring. To try a small model on fewer devices, plan for (and run on)
  fewer.
  """
  return [(r, num_devices // r) for r in range(1, num_devices + 1)
          if num_devices % r == 0]


def Cut(profile, num_stages, rows, dtype='float32'):
  """Stage sizes balancing the measured F + B + W time per layer."""
  costs = []
  for layer in profile.layers:
    m = layer.At(rows, dtype)
    costs.append(m.forward + m.backward + m.weight)
  return tuple(balance.PartitionByCost(costs, num_stages))


def Configurations(profile, num_devices, schedules=None, remats=None,
                   max_micro_batches=64, max_stages_per_device=2,
                   batched_weights=None, dtypes=None):
  """Every Configuration to try (see the module docstring).

  Args:
    profile: a profile.Profile.
    num_devices: N.
    schedules: schedule names (default: the registry's).
    remats: remat modes (default all).
    max_micro_batches: the largest M tried.
    max_stages_per_device: the largest v of looping and interleaving.
    batched_weights: [False, True] by default (when the model allows).
    dtypes: compute dtypes (default: those the profile measured).

  Returns:
    A list of Configurations.
  """
  schedules = schedules or registry.Names()
  remats = remats or simulator.REMAT_MODES
  if batched_weights is None:
    batched_weights = [False, True] if profile.batched_weights else [False]
  dtypes = dtypes or profile.Dtypes()
  configs = []
  cuts = {}
  for r, d in DeviceShapes(num_devices):
    if profile.batch % r:
      continue
    for m in _Divisors(profile.batch // r, max_micro_batches):
      rows = profile.batch // (r * m)
      for name in schedules:
        for v in _StagesPerDevice(name, max_stages_per_device):
          k = d * v
          if k > profile.num_layers or (v > 1 and d == 1) or (
              k == 1 and name != _ONE_STAGE_SCHEDULE):
            continue
          for dtype in dtypes:
            key = (k, rows, dtype)
            if key not in cuts:
              cuts[key] = Cut(profile, k, rows, dtype)
            for remat in remats:
              if k == 1 and remat == 'except_last':
                continue  # The one stage is the last: 'never'.
              for batched in batched_weights:
                if batched and m == 1:
                  continue  # One micro-batch: nothing to batch.
                configs.append(simulator.Configuration(
                    replicas=r, num_stages=k, stage_sizes=cuts[key],
                    micro_batches=m, schedule=name, remat=remat,
                    batched_weights=batched, dtype=dtype,
                    stages_per_device=v))
  return configs


def MemoryLimits(profile, config, memory_per_device):
  """Per stage, the most micro-batches the cap leaves room for (>= 1).

  Each micro-batch a stage holds between F and W costs at most the larger
  of what it keeps from F to B and what W reads; the rest of the cap goes
  to the stage's variables and slots, its gradient sum and its largest
  task's temporaries.

  Returns:
    A list of K ints, or None without a cap.
  """
  if memory_per_device is None:
    return None
  models = simulator.StageModels(profile, config)
  limits = []
  for st in models:
    budget = (memory_per_device - st.param_bytes *
              (1 + profile.optimizer_slots) - st.gradient_bytes -
              max(st.temporary_bytes.values()))
    per_micro_batch = max(st.kept_bytes, st.weight_bytes, 1.0)
    limits.append(int(max(1, min(config.micro_batches,
                                 math.floor(budget / per_micro_batch)))))
  return limits


# The share of the cap kept free by default: predicted peaks are off by a
# few percent (docs/BENCHMARKS.md, "Planner"), and a plan at the brim would
# not fit when they are low.
HEADROOM = 0.05


def _Predict(profile, config, memory_per_device, update):
  """The Prediction of `config`; zb_auto with limits from the cap."""
  if config.schedule != 'zb_auto' or memory_per_device is None:
    return simulator.Predict(profile, config, update=update)
  models = simulator.StageModels(profile, config)
  costs = simulator.TaskCosts(models, config, profile)
  limits = MemoryLimits(profile, config, memory_per_device)
  prediction = None
  # The limits are an estimate: tighten them while the step does not fit.
  for _ in range(4):
    costs.max_in_flight = list(limits)
    costs.max_awaiting_weight = list(limits)
    prediction = simulator.Predict(profile, config, costs, update=update)
    if prediction.Fits(memory_per_device) or max(limits) == 1:
      break
    limits = [max(1, x - max(1, x // 4)) for x in limits]
  return prediction


def Measured(profile):
  """({Configuration: seconds} run through the trainer, the fit's error).

  The planner's reference runs of the trainer (``tools/plan/
  trainer_step.py``) are recorded in the profile's ``trainer_reference``:
  'measured', a list of [configuration JSON, the trainer's median step in
  seconds], and 'fit_error', the largest relative error of the fitted
  profile's predictions of those steps, each left out of the fit
  (``gpipe.plan.trainer_fit.ReferenceRecord``).

  Args:
    profile: a profile.Profile.

  Returns:
    (a dict of simulator.Configuration to seconds, the fit's error >= 0);
    ({}, 0.0) for a profile without them.
  """
  reference = profile.trainer_reference or {}
  measured = {simulator.Configuration.FromJson(c): float(s)
              for c, s in reference.get('measured', ())}
  return measured, max(float(reference.get('fit_error', 0.0)), 0.0)


def _WithStep(prediction, seconds, batch):
  """`prediction` with the trainer's measured step in place of its own."""
  return prediction._replace(step_seconds=seconds,
                             examples_per_second=batch / seconds)


def RankingSeconds(candidate, fit_error):
  """The step `candidate` is ranked by (see the module docstring).

  Args:
    candidate: a fitting Candidate.
    fit_error: the fit's largest relative error on the measured steps.

  Returns:
    The measured step, or the predicted one times (1 + fit_error).
  """
  step = candidate.prediction.step_seconds
  return step if candidate.measured else step * (1.0 + fit_error)


def Evaluate(profile, config, memory_per_device=None, headroom=0.0,
             update=simulator.UPDATE_ALL_GRADIENTS):
  """One configuration as a Candidate (never raises for a refusal).

  Args:
    profile: a profile.Profile.
    config: a simulator.Configuration.
    memory_per_device: the cap in bytes, or None.
    headroom: the share of the cap to keep free.
    update: when the update applies the gradients (``simulator.Predict``).

  Returns:
    A Candidate.
  """
  if memory_per_device is not None:
    memory_per_device *= 1.0 - headroom
  try:
    prediction = _Predict(profile, config, memory_per_device, update)
  except ValueError as e:
    kind = LOSS_AFTER if 'loss after it' in str(e) else NOT_ALLOWED
    return Candidate(config, None, (kind, str(e)))
  if memory_per_device is not None and not prediction.Fits(
      memory_per_device):
    peaks = prediction.peak_bytes
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    return Candidate(config, prediction, (DOES_NOT_FIT, (
        'needs %s on device %d, over %s%s' % (
            Bytes(peaks[worst]), worst, Bytes(memory_per_device),
            ' (the cap less %.0f%% headroom)' % (100 * headroom)
            if headroom else ''))))
  return Candidate(config, prediction, None)


def _CheckHeadroom(headroom):
  if not 0 <= headroom < 1:
    raise ValueError('the memory headroom is a share of the cap in [0, 1), '
                     'got %r' % headroom)


class CapTooSmallError(ValueError):
  """The memory cap cannot even hold the weights; says how much they need."""


def WeightBytesPerDevice(layer_param_bytes, optimizer_slots, num_devices):
  """The least any configuration keeps on its fullest device for weights.

  A device keeps its stages' variables and the optimizer's slots for them
  (``simulator.Predict``'s static bytes). Layers are cut whole, and at best
  the weights spread evenly over all N devices (replicas beyond the first
  keep no variables: more replicas only leave fewer devices to share them).
  Gradients, activations and temporaries come on top, so no cap below this
  can fit anything.

  Args:
    layer_param_bytes: each layer's variable bytes (``profile.Layer``).
    optimizer_slots: the optimizer's copies per parameter (Adam 2).
    num_devices: N.

  Returns:
    Bytes.
  """
  weights = max(sum(layer_param_bytes) / float(num_devices),
                max(layer_param_bytes, default=0))
  return weights * (1 + optimizer_slots)


def CheckCapHoldsWeights(layer_param_bytes, optimizer_slots, num_devices,
                         memory_per_device, headroom=HEADROOM):
  """Refuses at once a cap that no configuration can fit under.

  Cheap (no simulation, and before a model is measured: the parameter bytes
  come from its built variables), so a cap that is off by orders of
  magnitude is named before minutes of measuring.

  Args:
    layer_param_bytes: each layer's variable bytes.
    optimizer_slots: the optimizer's copies per parameter.
    num_devices: N, the devices planned for.
    memory_per_device: the cap in bytes, or None (nothing to check).
    headroom: the share of the cap a plan leaves free.

  Raises:
    CapTooSmallError: the cap less its headroom is below
      ``WeightBytesPerDevice``; the message gives the bytes needed.
  """
  _CheckHeadroom(headroom)
  if memory_per_device is None:
    return
  need = WeightBytesPerDevice(layer_param_bytes, optimizer_slots,
                              num_devices)
  usable = memory_per_device * (1.0 - headroom)
  if need <= usable:
    return
  total = sum(layer_param_bytes)
  largest = max(layer_param_bytes, default=0)
  if largest > total / float(num_devices):
    # A layer is never split: more devices do not help.
    spread = 'the largest layer has %s of weights' % Bytes(largest)
    more = ''
  else:
    spread = '%s of weights over %d device(s) at best' % (Bytes(total),
                                                          num_devices)
    more = ', or plan for more devices'
  raise CapTooSmallError(
      '--memory_per_device=%s%s cannot hold the weights and optimizer '
      'slots alone: they need at least %s (%d bytes) on a device (%s, x (1 '
      '+ %g optimizer slot(s))), before any gradient or activation. Give '
      '--memory_per_device well above %s%s' %
      (Bytes(memory_per_device),
       ' (%s after the %.0f%% headroom)' % (Bytes(usable), 100 * headroom)
       if headroom else '', Bytes(need), math.ceil(need), spread,
       optimizer_slots, Bytes(need / (1.0 - headroom)), more))


def Search(profile, num_devices, memory_per_device=None, headroom=HEADROOM,
           update=simulator.UPDATE_ALL_GRADIENTS, **options):
  """Ranks every configuration (see the module docstring).

  Args:
    profile: a profile.Profile.
    num_devices: N devices (R x D = N).
    memory_per_device: the cap in bytes, or None.
    headroom: the share of the cap a configuration must leave free.
    update: when the update applies the gradients, one of
      ``simulator.UPDATES`` (``simulator.Predict``); the default keeps each
      stage's gradient sum to the end of the step.
    **options: passed to ``Configurations`` (schedules, remats,
      max_micro_batches, max_stages_per_device, batched_weights, dtypes).

  Returns:
    A SearchResult.
  """
  if num_devices < 1:
    raise ValueError('--devices must be >= 1, got %d' % num_devices)
  if update not in simulator.UPDATES:
    raise ValueError('unknown update %r; use one of %s' %
                     (update, ', '.join(simulator.UPDATES)))
  _CheckHeadroom(headroom)
  measured, fit_error = Measured(profile)
  fits, dropped = [], []
  for config in Configurations(profile, num_devices, **options):
    candidate = Evaluate(profile, config, memory_per_device, headroom,
                         update)
    if not candidate.reason and config in measured:
      candidate = candidate._replace(
          prediction=_WithStep(candidate.prediction, measured[config],
                               profile.batch), measured=True)
    (dropped if candidate.reason else fits).append(candidate)
  # Fastest first (measured, or fitted with the fit's error); ties: less
  # memory.
  fits.sort(key=lambda c: (RankingSeconds(c, fit_error),
                           max(c.prediction.peak_bytes)))
  return SearchResult(fits, dropped, num_devices, memory_per_device,
                      profile.model, update, fit_error)


def Bytes(n):
  """'1.5 GiB', '12.0 MiB', '512 B'."""
  if n >= GIB:
    return '%.2f GiB' % (n / GIB)
  if n >= MIB:
    return '%.1f MiB' % (n / MIB)
  if n >= 1024:
    return '%.1f KiB' % (n / 1024.0)
  return '%d B' % n


def ParseBytes(text):
  """'16GiB', '256MiB', '1.5GB', '1000000' -> bytes.

  Raises:
    ValueError: not a size, with examples.
  """
  units = {'': 1, 'b': 1, 'k': 1e3, 'kb': 1e3, 'kib': 1024, 'm': 1e6,
           'mb': 1e6, 'mib': MIB, 'g': 1e9, 'gb': 1e9, 'gib': GIB,
           't': 1e12, 'tb': 1e12, 'tib': GIB * 1024}
  s = str(text).strip().lower().replace(' ', '')
  number = s.rstrip('abcdefghijklmnopqrstuvwxyz')
  unit = s[len(number):]
  try:
    value = float(number)
  except ValueError:
    value = None
  if value is None or unit not in units or value <= 0:
    raise ValueError('%r is not a memory size; write e.g. 16GiB, 256MiB, '
                     '1.5GB or a number of bytes' % text)
  return int(value * units[unit])


def _PeakText(peaks, listed=4):
  """Each device's peak, or with many devices the largest and where."""
  if len(peaks) <= listed:
    return ', '.join(Bytes(b) for b in peaks)
  worst = max(range(len(peaks)), key=peaks.__getitem__)
  return 'at most %s (device %d)' % (Bytes(peaks[worst]), worst)


def Table(result, top=10, dropped_examples=2):
  """The search as text: the best candidates, then what was dropped.

  Args:
    result: a SearchResult.
    top: candidates to list.
    dropped_examples: examples per kind of dropped configuration.

  Returns:
    A Markdown string.
  """
  lines = [
      'Plan for %s on %d device(s)%s: %d configurations fit, %d dropped.' %
      (result.model, result.num_devices,
       ', %s each' % Bytes(result.memory_per_device)
       if result.memory_per_device else '', len(result.candidates),
       len(result.dropped)), '',
      '| # | schedule | R | K | v | D | M | remat | batched W | dtype | '
      'examples/s | step ms | step from | bubble | peak memory per device |',
      '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for i, c in enumerate(result.candidates[:top]):
    g, p = c.config, c.prediction
    lines.append(
        '| %d | %s | %d | %d | %d | %d | %d | %s | %s | %s | %.1f | %.1f | '
        '%s | %.1f%% | %s |' % (
            i + 1, g.schedule, g.replicas, g.num_stages,
            g.stages_per_device, g.devices_per_replica, g.micro_batches,
            g.remat, 'yes' if g.batched_weights else 'no', g.dtype,
            p.examples_per_second, 1e3 * p.step_seconds,
            'trainer' if c.measured else 'model', 100 * p.bubble,
            _PeakText(p.peak_bytes)))
  if any(c.measured for c in result.candidates[:top]):
    lines += ['', "step from 'trainer': measured through the trainer while "
              "planning; 'model': the fitted simulator's, ranked as if %.0f%% "
              'longer (its largest error on a measured one left out of the '
              'fit)' % (100 * result.fit_error)]
  by_kind = collections.OrderedDict()
  for c in result.dropped:
    by_kind.setdefault(c.reason[0], []).append(c)
  if by_kind:
    lines += ['', 'Dropped:']
  for kind, cands in by_kind.items():
    examples = '; '.join('%s: %s' % (c.config.label, c.reason[1])
                         for c in cands[:dropped_examples])
    lines.append('- %d %s (e.g. %s)' % (len(cands), kind, examples))
  if not result.candidates:
    lines += ['', 'Nothing fits: raise the memory per device, use more '
              'devices, or a model with fewer or smaller layers.']
  return '\n'.join(lines)


def ToJson(result, top=10):
  """The search as a JSON-serializable dict: the best, then the dropped."""
  def Row(c):
    d = dict(config=c.config.ToJson(), label=c.config.label,
             measured=c.measured)
    if c.prediction is not None:
      p = c.prediction
      d.update(step_seconds=p.step_seconds,
               examples_per_second=p.examples_per_second, bubble=p.bubble,
               peak_bytes=list(p.peak_bytes),
               step_peak_bytes=list(p.step_peak_bytes))
    if c.reason:
      d.update(dropped=c.reason[0], reason=c.reason[1])
    return d
  dropped = collections.Counter(c.reason[0] for c in result.dropped)
  return dict(model=result.model, num_devices=result.num_devices,
              memory_per_device=result.memory_per_device,
              update=result.update, fit_error=result.fit_error,
              candidates=[Row(c) for c in result.candidates[:top]],
              num_fitting=len(result.candidates),
              dropped_by_reason=dict(dropped),
              dropped_examples=[Row(c) for c in result.dropped[:top]])
