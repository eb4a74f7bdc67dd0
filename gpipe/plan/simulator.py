"""Predicting a training step of any configuration from a model's profile.

A ``Configuration`` is one way to train the model: R data-parallel
replicas, K stages cut at ``stage_sizes``, v stages per device (D = K/v
devices per replica), M micro-batches per replica, a schedule of the
registry, a remat mode, batched weight gradients or not, a compute dtype.
``Predict`` turns a ``profile.Profile`` and a configuration into a
``Prediction``: step time, examples/s, each device's busy time and idle
fraction, and each device's peak memory, without building anything.

How (pure Python, no TensorFlow):

1. ``StageModels``: each stage's task times and bytes at the configuration's
   micro-batch size, summed over its layers' measurements and scaled by the
   profile's calibration (``calibrate``: the executor's stage calls against
   those sums, per kind of task; a device's slowdown while others compute
   too). A B that re-materializes also runs the forward; without a split
   backward (and without batched W) B also does W's work; each
   weight-gradient task adds its gradient into the stage's running sum
   (memory traffic); every task pays the device's call cost.
2. The schedule's task orders (``gpipe.schedules.registry.Orders``, with the
   measured costs for the schedules that order by cost, and the executor's
   rewrite for batched W) run in ``simulate.TaskTimes``, each task as early
   as its order and its inputs allow; an input from another device arrives
   a hand-over later (latency + bytes / bandwidth).
3. Memory: replaying each device's tasks in time, a forward keeps what the
   backward reads (its input with remat, every activation its backward
   reads without), a backward holds its temporaries (with remat the
   recomputed activations) while it runs and frees the forward's; with a
   split backward what W reads stays from B to W; a stage's gradient sum
   lives from its first weight gradient until the update frees it, and
   the task adding a micro-batch's gradients into it holds them and the
   new sum beside the old one. When the update frees it is ``Predict``'s
   ``update``: with ``UPDATE_ALL_GRADIENTS`` (the default)
   the update reads every gradient of the model before it applies any, as
   Lingvo's learner does (one global gradient norm, a NaN/Inf check and a
   scale over all of them), so every sum is kept to the end of the step;
   with ``UPDATE_EACH_VARIABLE`` each variable's gradient is applied and
   freed as soon as it is complete, so with one replica a stage's sum is
   freed after its last weight gradient (with R > 1 replicas it still
   waits for theirs, to the end of the step). Copies the update itself
   makes (Lingvo's scaled gradients) are not counted. The peak of that
   replay is the step's memory (what ``gpipe.measure.memory`` measures);
   the variables and optimizer slots come on top.
4. After its last task each device (replica 0's) receives the other
   replicas' gradient sums, adds them and applies the update; the step
   ends when the last device is done, plus the profile's fixed costs of a
   step: its session run, and for a profile measured for the trainer what
   the trainer's step adds (``trainer_seconds``: its input, Lingvo's
   learner, its client process).

With equal task costs and no hand-over or call costs the idle fractions are
the registry's bubble formulas (``//tests:plan_simulator_test``).
"""

import collections

from gpipe.schedules import pipeline_tasks
from gpipe import weight_batching
from gpipe.plan import profile as profile_lib
from gpipe.schedules import registry
from gpipe.schedules import simulate
from gpipe.schedules import timed

FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT

REMAT_MODES = pipeline_tasks.REMAT_MODES

# When the update applies the gradients (``Predict``'s ``update``): after
# the step's last gradient (conservative; Lingvo's learner), or each
# variable's as soon as it is complete.
UPDATE_ALL_GRADIENTS = 'all_gradients'
UPDATE_EACH_VARIABLE = 'each_variable'
UPDATES = (UPDATE_ALL_GRADIENTS, UPDATE_EACH_VARIABLE)

# An uncalibrated profile: the layers' sums as they are; a B that
# re-materializes runs the forward once more.
_NO_FACTORS = profile_lib.Factors(rows=1, F=1.0, B=1.0, W=1.0, BW=1.0, R=1.0)


class DeviceCounts:
  """D and R x D of anything with replicas, num_stages and stages_per_device.

  Shared by the planner's Configuration and the trainer's elastic shapes.
  """

  __slots__ = ()

  @property
  def devices_per_replica(self):
    """D: the devices of one replica, K / v."""
    return self.num_stages // self.stages_per_device

  @property
  def num_devices(self):
    """R x D."""
    return self.replicas * self.devices_per_replica


class Configuration(
    DeviceCounts,
    collections.namedtuple('Configuration', [
        'replicas', 'num_stages', 'stage_sizes', 'micro_batches', 'schedule',
        'remat', 'batched_weights', 'dtype', 'stages_per_device'
    ], defaults=(False, 'float32', 1))):
  """One way to train a model (see the module docstring).

  Attributes:
    replicas: R.
    num_stages: K.
    stage_sizes: layers per stage (K positive ints).
    micro_batches: M per replica.
    schedule: a registered schedule name.
    remat: 'always', 'except_last' or 'never'.
    batched_weights: ``batched_weight_gradients``.
    dtype: the compute dtype ('float32' or 'bfloat16').
    stages_per_device: v (1; 2 for 'zb_v'; v >= 1 round-robin for
      'interleaved_1f1b' and 'gpipe').
  """

  __slots__ = ()

  @property
  def label(self):
    """A short text: 'zb_auto R=1 K=2 M=8 always'."""
    return '%s R=%d K=%d%s M=%d %s%s%s' % (
        self.schedule, self.replicas, self.num_stages,
        ' v=%d' % self.stages_per_device if self.stages_per_device > 1 else
        '', self.micro_batches, self.remat,
        ' batched-W' if self.batched_weights else '',
        '' if self.dtype == 'float32' else ' ' + self.dtype)

  def ToJson(self):
    d = self._asdict()
    d['stage_sizes'] = list(self.stage_sizes)
    return d

  @classmethod
  def FromJson(cls, d):
    d = dict(d)
    d['stage_sizes'] = tuple(d['stage_sizes'])
    return cls(**d)


class StageModel(
    collections.namedtuple('StageModel', [
        'forward', 'backward', 'weight', 'batched_weight', 'output_bytes',
        'kept_bytes', 'weight_bytes', 'temporary_bytes', 'gradient_bytes',
        'param_bytes', 'split_backward'
    ])):
  """One stage at one micro-batch size (seconds and bytes per task).

  Attributes:
    forward: seconds of an F task.
    backward: of a B task (recompute and, without a split, W included).
    weight: of a W task (0 without a split backward).
    batched_weight: of the one batched W of all M micro-batches (with
      batched weight gradients), else 0.
    output_bytes: handed to the next stage per micro-batch (and its
      gradient back).
    kept_bytes: held from the end of F to the end of B.
    weight_bytes: held from the end of B to the end of W (split or batched).
    temporary_bytes: {phase: bytes held while such a task runs}.
    gradient_bytes: the stage's running gradient sum.
    param_bytes: its variables.
    split_backward: whether W tasks (not B) give the weight gradients.
  """

  __slots__ = ()

  def Seconds(self, task):
    if task.phase == FORWARD:
      return self.forward
    if task.phase == BACKWARD:
      return self.backward
    if pipeline_tasks.IsAll(task.micro_batch):
      return self.batched_weight
    return self.weight


class Prediction(
    collections.namedtuple('Prediction', [
        'config', 'step_seconds', 'examples_per_second', 'span_seconds',
        'busy_seconds', 'idle_fractions', 'step_peak_bytes', 'static_bytes',
        'task_times', 'stage_devices', 'task_costs'
    ])):
  """What ``Predict`` says about one configuration.

  Attributes:
    config: the Configuration.
    step_seconds: the training step.
    examples_per_second: batch / step.
    span_seconds: from the first task's start to the last task's end.
    busy_seconds: per device (R x D), the seconds in its tasks.
    idle_fractions: per device, 1 - busy / span (the bubble).
    step_peak_bytes: per device, the most bytes the step's own tensors
      hold at once (activations, gradients, temporaries).
    static_bytes: per device, its variables and optimizer slots.
    task_times: replica 0's per device list of (Task, start, end).
    stage_devices: replica 0's device index of each stage.
    task_costs: the measured costs as ``PipeliningLayer.task_costs``
      (relative: seconds).
  """

  __slots__ = ()

  @property
  def peak_bytes(self):
    """Per device, variables + slots + the step's peak."""
    return [a + b for a, b in zip(self.static_bytes, self.step_peak_bytes)]

  @property
  def bubble(self):
    """The mean idle fraction over the devices."""
    return sum(self.idle_fractions) / len(self.idle_fractions)

  def Fits(self, memory_per_device):
    return max(self.peak_bytes) <= memory_per_device


def RowsPerMicroBatch(profile, config):
  """Examples per micro-batch; a ValueError if M x R does not divide."""
  per_step = config.replicas * config.micro_batches
  if profile.batch % per_step:
    raise ValueError('R x M = %d x %d does not divide the batch of %d' %
                     (config.replicas, config.micro_batches, profile.batch))
  return profile.batch // per_step


def SplitBackward(config):
  """Whether B and W are separate tasks (split schedule or batched W)."""
  return registry.Get(config.schedule).split_backward or config.batched_weights


def StageModels(profile, config):
  """Each stage's StageModel (see the module docstring, 1).

  Args:
    profile: a profile.Profile.
    config: a Configuration.

  Returns:
    A list of K StageModels.

  Raises:
    ValueError: a cut that does not cover the profile's layers, or a
      dtype or batch the profile cannot give.
  """
  sizes = list(config.stage_sizes)
  if (len(sizes) != config.num_stages or sum(sizes) != profile.num_layers or
      min(sizes) < 1):
    raise ValueError('stage_sizes %s must be %d positive numbers summing to '
                     'the %d layers' % (sizes, config.num_stages,
                                        profile.num_layers))
  rows = RowsPerMicroBatch(profile, config)
  split = SplitBackward(config)
  call = profile.call_seconds
  bandwidth = profile.memory_bandwidth
  # The executor's stage calls over the layers' sums (calibrate.py), and
  # the slowdown of a device while others compute too.
  f = profile_lib.FactorsAt(profile.factors, rows) or _NO_FACTORS
  whole_f = profile_lib.FactorsAt(profile.factors,
                                  rows * config.micro_batches) or _NO_FACTORS
  slow = profile.contention if config.num_devices > 1 else 1.0
  models = []
  start = 0
  for k, size in enumerate(sizes):
    layers = profile.layers[start:start + size]
    start += size
    at = [layer.At(rows, config.dtype) for layer in layers]
    forward = sum(m.forward for m in at)
    input_grad = sum(m.backward for m in at)
    weight = sum(m.weight for m in at)
    param_bytes = float(sum(layer.param_bytes for layer in layers))
    # Adding a gradient into the running sum: read two, write one.
    accumulate = 3.0 * param_bytes / bandwidth
    remat = pipeline_tasks.RematerializesStage(config.remat, k,
                                               config.num_stages)
    recompute = forward * f.R if remat else 0.0
    # A layer's output that its backward reads and the next layer's reads
    # too is one tensor: held once.
    activations = sum(m.activation_bytes for m in at) - sum(
        min(b.input_read_bytes, a.output_read_bytes)
        for a, b in zip(at, at[1:]))
    temporaries = max(m.temporary_bytes for m in at)
    # The task giving the weight gradients adds them into the stage's
    # running sum in one call: the new sum is written while the gradients
    # and the old sum live (one batched W gives the whole sum at once).
    adding = param_bytes * (2.0 if config.micro_batches > 1 and
                            not config.batched_weights else 1.0)
    batched_weight = 0.0
    weight_task = 0.0
    if split:
      backward = input_grad * f.B + recompute
      if config.batched_weights:
        whole = [layer.At(rows * config.micro_batches, config.dtype)
                 for layer in layers]
        batched_weight = slow * sum(m.weight for m in whole) * whole_f.W + call
      else:
        weight_task = slow * (weight * f.W + accumulate) + call
    else:
      backward = (input_grad + weight) * f.BW + recompute + accumulate
    models.append(StageModel(
        forward=slow * forward * f.F + call,
        backward=slow * backward + call,
        weight=weight_task,
        batched_weight=batched_weight,
        output_bytes=at[-1].output_bytes,
        kept_bytes=at[0].input_bytes if remat else activations,
        weight_bytes=sum(m.weight_bytes for m in at) if split else 0.0,
        temporary_bytes={
            FORWARD: max(m.output_bytes for m in at),
            # Recomputed activations (freed layer by layer as the weight
            # gradients, without a split, take their place, then are added
            # into the sum), and the backward's temporaries.
            BACKWARD: max(activations if remat else 0.0,
                          0.0 if split else adding) + temporaries,
            WEIGHT: temporaries + adding,
        },
        gradient_bytes=param_bytes,
        param_bytes=param_bytes,
        split_backward=split))
  return models


def TaskCosts(models, config, profile):
  """The measured costs the schedule orders tasks by (``StageCosts``).

  Hand-overs are counted between stages on different devices; the memory
  limits are the schedule's defaults (``search`` sets them from a cap).
  """
  where = StageDevices(config)
  handover = [
      profile.handover.Seconds(models[k].output_bytes)
      if where[k] != where[k + 1] else 0.0
      for k in range(config.num_stages - 1)]
  return timed.StageCosts([m.forward for m in models],
                          [m.backward for m in models],
                          [m.weight for m in models], handover)


def StageDevices(config):
  """Replica 0's device index of each stage (the schedule's placement)."""
  return registry.Placement(config.schedule, config.num_stages,
                            config.devices_per_replica)


def Predict(profile, config, task_costs=None, update=UPDATE_ALL_GRADIENTS):
  """The predicted step of `config` (see the module docstring).

  Args:
    profile: a profile.Profile.
    config: a Configuration.
    task_costs: optional ``timed.StageCosts`` to order the tasks by (with
      memory limits); default ``TaskCosts``.
    update: when the update applies the gradients, one of ``UPDATES``:
      ``UPDATE_ALL_GRADIENTS`` (after the step's last gradient, as Lingvo's
      learner does: each stage's gradient sum is kept to the end of the
      step) or ``UPDATE_EACH_VARIABLE`` (each variable's gradient as soon
      as it is complete: with one replica a stage's sum is freed after its
      last weight gradient).

  Returns:
    A Prediction.

  Raises:
    ValueError: a configuration the schedule, the cut or the batch refuse,
      saying why.
  """
  schedule = registry.Get(config.schedule)
  if update not in UPDATES:
    raise ValueError('unknown update %r; use one of %s' %
                     (update, ', '.join(UPDATES)))
  if config.remat not in REMAT_MODES:
    raise ValueError('unknown remat %r; use one of %s' %
                     (config.remat, ', '.join(REMAT_MODES)))
  if not profile.loss_in_pipeline and schedule.per_micro_batch_loss:
    raise ValueError(
        "schedule %r needs each micro-batch's loss in the pipeline, but "
        'this model computes its loss after it' % config.schedule)
  if config.batched_weights and not profile.batched_weights:
    raise ValueError('this model cannot batch its weight gradients (e.g. '
                     'micro-batch batch norm)')
  models = StageModels(profile, config)
  where = StageDevices(config)
  k, m = config.num_stages, config.micro_batches
  if task_costs is None:
    task_costs = TaskCosts(models, config, profile)
  _, orders = registry.Orders(config.schedule, where, m, task_costs)
  if config.batched_weights:
    orders = weight_batching.Orders(orders)

  def Delay(dep, task):
    if where[dep.stage] == where[task.stage]:
      return 0.0
    return profile.handover.Seconds(
        models[min(dep.stage, task.stage)].output_bytes)

  times = simulate.TaskTimes(orders, k, m, schedule.per_micro_batch_loss,
                             lambda task: models[task.stage].Seconds(task),
                             Delay)
  span = max(end for lane in times for _, _, end in lane)
  d = config.devices_per_replica
  busy = [sum(end - start for _, start, end in lane) for lane in times]
  # With replicas each sum waits for theirs, whatever the update.
  free_early = update == UPDATE_EACH_VARIABLE and config.replicas == 1
  step_peak = [_PeakBytes(lane, models, free_early) for lane in times]
  static = [0.0] * d
  for s, dev in enumerate(where):
    static[dev] += models[s].param_bytes * (1 + profile.optimizer_slots)
  ends = _DeviceEnds(profile, config, models, where, times,
                     barrier=update == UPDATE_ALL_GRADIENTS)
  step = max(ends) + profile.step_seconds + profile.trainer_seconds
  r = config.replicas
  # Replicas r > 0: the same tasks on their own devices; they read the
  # weights there (a copy per step) and keep no variables.
  replica_peak = [p + sum(models[s].param_bytes for s in range(k)
                          if where[s] == dev)
                  for dev, p in enumerate(step_peak)]
  if r > 1:
    # Replica 0's devices also receive the other replicas' gradient sums.
    step_peak = [p + (r - 1) * sum(models[s].gradient_bytes
                                   for s in range(k) if where[s] == dev)
                 for dev, p in enumerate(step_peak)]
  return Prediction(
      config=config, step_seconds=step,
      examples_per_second=profile.batch / step, span_seconds=span,
      busy_seconds=busy * r,
      idle_fractions=[1.0 - b / span for b in busy] * r,
      step_peak_bytes=step_peak + replica_peak * (r - 1),
      static_bytes=static + [0.0] * (d * (r - 1)),
      task_times=times, stage_devices=where,
      task_costs=task_costs.ToDict())


def _DeviceEnds(profile, config, models, where, times, barrier):
  """When each device of replica 0 has applied its update.

  Args:
    profile: the profile.Profile.
    config: the Configuration.
    models: its StageModels.
    where: each stage's device.
    times: each device's simulated (task, start, end).
    barrier: the update reads every gradient before it applies any
      (Lingvo's learner: a global norm and a NaN check): no device updates
      before the last gradient sum is complete. Else each device updates
      after its own gradients.

  Returns:
    Per device of replica 0, when its update ends.
  """
  r = config.replicas
  ready, updates = [], []
  for dev, lane in enumerate(times):
    end = max(e for _, _, e in lane)
    stages = [s for s in range(config.num_stages) if where[s] == dev]
    grad_bytes = sum(models[s].gradient_bytes for s in stages)
    if r > 1:
      # The other replicas' sums arrive over one link, then one AddN.
      end += ((r - 1) * profile.handover.Seconds(grad_bytes) +
              r * grad_bytes / profile.memory_bandwidth)
    param_bytes = sum(models[s].param_bytes for s in stages)
    ready.append(end)
    updates.append(profile.update_factor * profile.update_traffic *
                   param_bytes / profile.memory_bandwidth)
  if barrier:
    ready = [max(ready)] * len(ready)
  return [t + u for t, u in zip(ready, updates)]


def _PeakBytes(lane, models, free_early):
  """The most bytes a device's tasks hold at once (module docstring, 3).

  Args:
    lane: one device's list of (Task, start, end).
    models: the StageModels.
    free_early: whether a stage's gradient sum is applied and freed at the
      end of its last weight-gradient task, not kept to the end of the
      step.

  Returns:
    The peak bytes.
  """
  events = []
  last_gradient = {}
  for task, _, end in lane:
    if task.phase == (WEIGHT if models[task.stage].split_backward else
                      BACKWARD):
      last_gradient[task.stage] = max(end, last_gradient.get(task.stage, end))
  has_gradient = set()
  for task, start, end in lane:
    st = models[task.stage]
    temp = st.temporary_bytes[task.phase]
    events += [(start, temp), (end, -temp)]
    if task.phase == FORWARD:
      events.append((end, st.kept_bytes))
    elif task.phase == BACKWARD:
      events.append((end, st.weight_bytes - st.kept_bytes))
    else:
      count = (task.micro_batch.count
               if pipeline_tasks.IsAll(task.micro_batch) else 1)
      events.append((end, -count * st.weight_bytes))
    gives_gradient = task.phase == (WEIGHT if st.split_backward else
                                    BACKWARD)
    if gives_gradient and task.stage not in has_gradient:
      has_gradient.add(task.stage)
      events.append((end, st.gradient_bytes))
      if free_early:
        events.append((last_gradient[task.stage], -st.gradient_bytes))
  live = peak = 0.0
  # At equal times frees go first, as in gpipe.measure.memory.
  for _, delta in sorted(events):
    live += delta
    peak = max(peak, live)
  return peak
