"""A profile's absolute times, fitted to traced steps of the trainer itself.

The layers timed one by one (``profiling``) give each layer's cost relative
to the others'; what a stage task of the executor takes inside the trainer's
step (its function calls, two worker processes sharing caches and memory
bandwidth, the client process beside them) they do not give. A calibration
run on its own (``calibrate``) varied by several times between runs on a
loaded machine. This module takes the absolute times from the planner's
reference runs of the trainer (``tools/plan/trainer_step.py``) instead,
pure Python:

1. ``TaskFactors``: in one traced step of each reference, every stage task's
   time against the same task's time from the layers' figures: a factor per
   kind of task (F; B and W of a split backward; an unsplit backward, BW).
   Kinds no reference ran are taken from those that did (B and W from BW,
   BW from B and W together; a recomputed forward from F).
2. ``HandoverLatency``: a task that waited for another device's output
   started this long after it (``traced.HandoverDelays``).
3. ``FitScale``: tracing slows small ops down, so the traced factors give
   the split of the time between the tasks, not its total: one scale on all
   of them, a fixed cost of the trainer's step (input, Lingvo's learner,
   the client) and, with a third reference, a cost of each task call beyond
   the profile's are fitted so that the simulator's steps of the references
   match their untraced steps through the trainer.

``Fit`` does the three and returns the profile to search with;
``ReferenceRecord`` is what the profile keeps of the references: the search
predicts a measured configuration by its measured step and ranks the others
by their fitted steps lengthened by the fit's largest error on a reference
it was not fitted to (``LeaveOneOutError``; ``gpipe.plan.search.Measured``).
"""

import collections
import math
import statistics

from gpipe.plan import profile as profile_lib
from gpipe.plan import simulator
from gpipe.plan import traced
from gpipe.schedules import registry

# One reference: its configuration, the trainer's median untraced step
# (seconds), the stage tasks of one traced step (timeline.TaskTimes; empty
# when it was not traced) and the median step of each of its runs when it ran
# more than once (`seconds` is the fastest's; () for a single run).
Reference = collections.namedtuple('Reference',
                                   ['config', 'seconds', 'tasks', 'runs'],
                                   defaults=[()])

# The scale ``FitScale`` may give, and the grid it searches (geometric):
# tracing slows tasks down, by a few tens of percent for small ones; it does
# not speed them up. Noisy references can ask for more than any slowdown
# explains (a loaded machine): the bounds keep the traced split of the time.
MIN_SCALE = 0.5
MAX_SCALE = 1.5
SCALE_STEPS = 161
# How strongly ``FitScale`` keeps the scale near 1 (the traced times) when
# the references alone leave it loose: per squared log of the scale.
SCALE_PRIOR = 1e-4
# Golden-section steps refining the grid's best scale.
REFINE_STEPS = 30
# The step (seconds) on the call cost that gives each reference's
# sensitivity to it (a task on the critical path counts once).
CALL_PROBE = 1e-3


def _Bare(profile):
  """The layers' figures alone: no factors, calls, contention or trainer."""
  return profile.Replace(factors=(), contention=1.0, call_seconds=0.0,
                         trainer_seconds=0.0, update_factor=1.0)


def _ModelledTasks(profile, config):
  """{(stage, phase): seconds} of one task from the layers' figures alone."""
  models = simulator.StageModels(_Bare(profile), config)
  out = {}
  for k, m in enumerate(models):
    out[(k, simulator.FORWARD)] = m.forward
    out[(k, simulator.BACKWARD)] = m.backward
    out[(k, simulator.WEIGHT)] = m.weight
  return out


def PhaseSums(profile, references):
  """{kind: [traced seconds, modelled seconds]} summed over the references.

  Args:
    profile: the profile.Profile (uncalibrated).
    references: Reference records; those without tasks are skipped.

  Returns:
    A dict keyed by 'F', 'B', 'W' (split backward) and 'BW' (unsplit).
  """
  sums = collections.defaultdict(lambda: [0.0, 0.0])
  for ref in references:
    if not ref.tasks:
      continue
    modelled = _ModelledTasks(profile, ref.config)
    split = simulator.SplitBackward(ref.config)
    for t in ref.tasks:
      if _CoversAll(t.micro_batch) or (t.stage, t.phase) not in modelled:
        continue
      kind = t.phase
      if t.phase == simulator.BACKWARD and not split:
        kind = 'BW'
      sums[kind][0] += t.end - t.start
      sums[kind][1] += modelled[(t.stage, t.phase)]
  return dict(sums)


def _CoversAll(micro_batch):
  """Whether a traced task covers all micro-batches (a batched W)."""
  return not isinstance(micro_batch, int)


def TaskFactors(profile, references):
  """The traced over the modelled task times per kind (profile.Factors).

  Args:
    profile: the profile.Profile (uncalibrated).
    references: Reference records with traced tasks.

  Returns:
    A profile.Factors at the references' micro-batch size (the largest of
    them), or None when no reference was traced.
  """
  sums = PhaseSums(profile, references)

  def Ratio(*kinds):
    traced_sum = sum(sums[k][0] for k in kinds if k in sums)
    modelled = sum(sums[k][1] for k in kinds if k in sums)
    return traced_sum / modelled if traced_sum > 0 and modelled > 0 else None

  f = Ratio(simulator.FORWARD)
  b = Ratio(simulator.BACKWARD)
  w = Ratio(simulator.WEIGHT)
  bw = Ratio('BW')
  split_total = Ratio(simulator.BACKWARD, simulator.WEIGHT)
  if bw is None:
    bw = split_total
  if b is None:
    b = bw
  if w is None:
    w = bw
  known = [x for x in (f, b, w, bw) if x is not None]
  if not known:
    return None
  fill = statistics.mean(known)
  f, b, w, bw = (fill if x is None else x for x in (f, b, w, bw))
  rows = max(simulator.RowsPerMicroBatch(profile, r.config)
             for r in references if r.tasks)
  return profile_lib.Factors(rows=rows, F=f, B=b, W=w, BW=bw, R=f)


def Scaled(factors, scale):
  """`factors` with every kind times `scale`."""
  return factors._replace(**{k: getattr(factors, k) * scale
                             for k in profile_lib.FACTOR_KINDS})


def HandoverLatency(profile, references):
  """The hand-over latency the pipelined references' traces show, or None.

  The median delay from a task's end to the start of its waiting reader on
  another device, less the boundary's bytes over the profile's bandwidth;
  never below the profile's latency.
  """
  delays, boundaries = [], []
  for ref in references:
    if not ref.tasks or ref.config.devices_per_replica < 2:
      continue
    schedule = registry.Get(ref.config.schedule)
    got = traced.HandoverDelays(ref.tasks, schedule.per_micro_batch_loss)
    if got:
      delays += got
      models = simulator.StageModels(_Bare(profile), ref.config)
      boundaries.append(models[0].output_bytes)
  if not delays:
    return None
  latency = statistics.median(delays) - (
      statistics.mean(boundaries) / profile.handover.bandwidth)
  return max(latency, profile.handover.latency)


def _Step(profile, config):
  return simulator.Predict(profile, config).step_seconds


def _Scaled(profile, scale, traced_latency):
  """`profile` with its factors (and a traced latency) times `scale`."""
  scaled = profile.Replace(factors=tuple(Scaled(f, scale)
                                         for f in profile.factors))
  if traced_latency is not None:
    scaled = scaled.Replace(handover=profile.handover._replace(
        latency=max(scale * traced_latency, profile.handover.latency)))
  return scaled


def _LeastSquares(steps, slopes, measured, fit_call):
  """(fixed, extra call seconds) >= 0 minimizing the squared relative error.

  Each prediction is ``step + slope * extra + fixed``.
  """
  weights = [1.0 / (y * y) for y in measured]
  rest = [y - s for y, s in zip(measured, steps)]

  def FixedAlone(extra):
    total = sum(w * (r - n * extra) for w, r, n in zip(weights, rest, slopes))
    return max(total / sum(weights), 0.0)

  def ExtraAlone(fixed):
    den = sum(w * n * n for w, n in zip(weights, slopes))
    if den <= 0:
      return 0.0
    num = sum(w * n * (r - fixed) for w, r, n in zip(weights, rest, slopes))
    return max(num / den, 0.0)

  if not fit_call:
    return FixedAlone(0.0), 0.0
  # The normal equations of the two unknowns.
  sw = sum(weights)
  sn = sum(w * n for w, n in zip(weights, slopes))
  snn = sum(w * n * n for w, n in zip(weights, slopes))
  sr = sum(w * r for w, r in zip(weights, rest))
  snr = sum(w * n * r for w, r, n in zip(weights, rest, slopes))
  det = sw * snn - sn * sn
  if det <= 1e-12 * max(sw * snn, 1e-30):
    return FixedAlone(0.0), 0.0
  fixed = (snn * sr - sn * snr) / det
  extra = (sw * snr - sn * sr) / det
  if extra < 0:
    return FixedAlone(0.0), 0.0
  if fixed < 0:
    extra = ExtraAlone(0.0)
    return FixedAlone(extra), extra
  return fixed, extra


def FitScale(profile, references, traced_latency=None):
  """(scale, fixed seconds, extra call seconds) matching the references.

  For a scale on the profile's factors, the trainer's fixed cost of a step
  and, with three references or more, an extra cost of every task call (a
  stage call dispatched in the trainer's step, beyond the profile's
  ``call_seconds``: it weighs most in looped schedules of many small
  tasks) are fitted by least squares to what the references' untraced
  steps take beyond the simulator's (relative errors, both never below 0);
  the scale with the least error (plus ``SCALE_PRIOR`` times its squared
  log) wins, searched on a geometric grid in [MIN_SCALE, MAX_SCALE] and
  refined between the best point's neighbours. One reference gives no
  scale: 1 and its difference.

  Args:
    profile: the profile.Profile with its factors (no trainer cost).
    references: Reference records (their seconds are used).
    traced_latency: a hand-over latency seen in the traces (slowed down as
      their tasks are: scaled with them, never below the profile's), or
      None to keep the profile's.

  Returns:
    (scale, trainer_seconds, extra call seconds).
  """
  base = profile.Replace(trainer_seconds=0.0)
  if len(references) < 2 or not base.factors:
    fixed = statistics.mean(r.seconds - _Step(base, r.config)
                            for r in references)
    return 1.0, fixed, 0.0
  measured = [r.seconds for r in references]
  fit_call = len(references) >= 3

  def Cost(scale):
    scaled = _Scaled(base, scale, traced_latency)
    steps = [_Step(scaled, r.config) for r in references]
    slopes = [0.0] * len(steps)
    if fit_call:
      more = scaled.Replace(call_seconds=scaled.call_seconds + CALL_PROBE)
      slopes = [(_Step(more, r.config) - s) / CALL_PROBE
                for r, s in zip(references, steps)]
    fixed, extra = _LeastSquares(steps, slopes, measured, fit_call)
    cost = sum(((s + n * extra + fixed - y) / y) ** 2
               for s, n, y in zip(steps, slopes, measured))
    return cost + SCALE_PRIOR * math.log(scale) ** 2, fixed, extra

  ratio = (MAX_SCALE / MIN_SCALE) ** (1.0 / (SCALE_STEPS - 1))
  grid = [MIN_SCALE * ratio ** i for i in range(SCALE_STEPS)]
  best = min(grid, key=lambda x: Cost(x)[0])
  # Golden-section search between the best point's neighbours.
  lo, hi = max(best / ratio, MIN_SCALE), min(best * ratio, MAX_SCALE)
  golden = (math.sqrt(5.0) - 1) / 2
  for _ in range(REFINE_STEPS):
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    if Cost(a)[0] <= Cost(b)[0]:
      hi = b
    else:
      lo = a
  scale = min((best, (lo + hi) / 2), key=lambda x: Cost(x)[0])
  return (scale,) + Cost(scale)[1:]


def Fit(profile, references, log=None):
  """The profile with factors, hand-over and trainer cost from `references`.

  Args:
    profile: the profile.Profile of the layers (its factors are replaced).
    references: Reference records (at least one).
    log: a print-like function, or None.

  Returns:
    The fitted profile.Profile: ``factors`` (one size; without traced
    tasks the profile's own, scaled), ``contention`` 1 when traced (the
    references ran every device at once: it is in the factors), the
    hand-over's latency, ``call_seconds`` (with three references or
    more), ``trainer_seconds`` and ``update_factor`` 1.
  """
  fitted = profile.Replace(update_factor=1.0, trainer_seconds=0.0)
  factors = TaskFactors(profile, references)
  if factors is not None:
    fitted = fitted.Replace(factors=(factors,), contention=1.0)
  latency = HandoverLatency(fitted, references)
  scale, fixed, extra = FitScale(fitted, references, latency)
  fitted = _Scaled(fitted, scale, latency).Replace(
      trainer_seconds=fixed, call_seconds=fitted.call_seconds + extra)
  if log:
    if fitted.factors:
      log('task factors from the traced references: %s' % ', '.join(
          '%s %.2f' % (k, getattr(fitted.factors[0], k))
          for k in profile_lib.FACTOR_KINDS))
    log('scale on the traced tasks %.2f; hand-over latency %.2f ms; a task '
        'call %.2f ms; the trainer adds %.1f ms a step' % (
            scale, 1e3 * fitted.handover.latency,
            1e3 * fitted.call_seconds, 1e3 * fixed))
  return fitted


def FitError(profile, references):
  """The largest relative error of `profile`'s steps of the references.

  Args:
    profile: the fitted profile.Profile.
    references: Reference records with measured seconds.

  Returns:
    max |predicted / measured - 1| (0.0 without references).
  """
  return max((abs(_Step(profile, r.config) / r.seconds - 1.0)
              for r in references if r.seconds > 0), default=0.0)


def LeaveOneOutError(profile, references):
  """How far the fit misses a configuration it was not fitted to.

  Three references fit the three unknowns of ``FitScale`` exactly, so their
  own residuals say nothing of a configuration not run. Each reference is
  predicted instead by ``Fit`` to the others (its traced tasks and its step
  left out), as any configuration the planner did not run is.

  Args:
    profile: the profile.Profile of the layers (as given to ``Fit``).
    references: the Reference records.

  Returns:
    max |predicted / measured - 1| over the references left out, each by a
    fit to the rest; 0.0 with fewer than two references.
  """
  if len(references) < 2:
    return 0.0
  errors = []
  for i, left_out in enumerate(references):
    rest = references[:i] + references[i + 1:]
    fitted = Fit(profile, rest)
    errors.append(abs(_Step(fitted, left_out.config) / left_out.seconds -
                      1.0))
  return max(errors)


def ReferenceRecord(profile, fitted, references, devices):
  """The profile's ``trainer_reference``: what the references measured.

  Args:
    profile: the profile.Profile of the layers (as given to ``Fit``).
    fitted: what ``Fit`` made of it with `references`.
    references: the Reference records.
    devices: the devices they ran on.

  Returns:
    A JSON-serializable dict: 'configs' (labels), 'devices', 'seconds',
    'runs' (each reference's runs' steps, seconds, the counted one among
    them), 'measured' ([configuration JSON, seconds] each, for
    ``gpipe.plan.search.Measured``), 'fit_error' (the larger of the fit's
    own error on them, ``FitError``, and that on each left out,
    ``LeaveOneOutError``) and 'own_error' (the former).
  """
  own = FitError(fitted, references)
  return dict(configs=[r.config.label for r in references], devices=devices,
              seconds=[r.seconds for r in references],
              runs=[list(r.runs) or [r.seconds] for r in references],
              measured=[[r.config.ToJson(), r.seconds] for r in references],
              fit_error=max(own, LeaveOneOutError(profile, references)),
              own_error=own)
