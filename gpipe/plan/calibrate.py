"""Calibrating a profile against the executor's own stage calls.

A layer timed on its own (``measure``) is not the same work as that layer
inside a stage function of the executor: the stage's forward returns what
its backward reads, a split backward returns what W reads, the calls cross
a function boundary, and two worker processes computing at once share the
caches and the memory bandwidth of their cores. ``Calibrate`` measures the
difference once per model:

1. On one pinned worker, the whole model as one stage (K=1) of a real
   ``gpipe.PipeliningLayer`` at a few micro-batch sizes, up to
   ``CALIBRATION_MICRO_BATCHES`` micro-batches of that size, its loss and
   gradients timed less the session run's fixed cost (untraced:
   tracing slows small ops down far more than large ones; a traced step
   only shares the time out over the tasks) under a split backward
   ('zb_h1': F, B, W tasks) without and with re-materialization, and an
   unsplit one ('gpipe': B does W's work). Against the simulator's prediction of the same step from
   the layers' figures alone this gives factors per size
   (``profile.Factors``): one for the tasks of a split backward, shared out
   over F, B and W as a traced step of it shares out its time
   (``traced.PhaseFactors``: the executor's B carries more of the gradient
   chain than the layers' B), one for the unsplit backward, and the
   recomputed forward of a re-materializing B over the forward's profile
   time.
2. The same stage on both workers at once, against one alone: the slowdown
   of a device while the other computes too (``contention``).

3. The model cut in two on both workers, one micro-batch (``gpipe``):
   what its step takes beyond the calibrated prediction is put on its two
   hand-overs (``CalibrateHandover``), a lower bandwidth than tensor reads
   between the workers show. Then the same cut, pipelined in small
   micro-batches and traced: a task waiting for another worker's output
   starts a hand-over after that output's task ends
   (``traced.HandoverDelays``), later than an idle worker's tensor read
   would arrive, the sending worker's core being busy in its next task; the
   median delay, less the bytes over the bandwidth, is the hand-over's
   latency.

The simulator multiplies each task's profile time by its factor
(``profile.FactorsAt``: interpolated in the rows) and, when more than one
device computes, by the contention.
"""

import statistics

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from gpipe.measure import timeline
from gpipe.plan import profiling
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.plan import traced
from gpipe.runtime import background
from lingvo import compat as tf
from lingvo.core import py_utils

# The K=1 graphs timed per size: (schedule, remat).
_SPLIT = ('zb_h1', 'never')  # F, B, W tasks.
_REMAT = ('zb_h1', 'always')  # B recomputes the forward.
_UNSPLIT = ('gpipe', 'never')  # B does W's work.
_CALIBRATION = (_SPLIT, _REMAT, _UNSPLIT)


def _Build(layer_params, input_specs, loss, batch_dim, rows, m, schedule,
           remat, devices, name, stage_sizes=None):
  """A pipeline with a stage on each of `devices`: its loss and gradient ops.

  One device: the whole model as one stage (K=1). The inputs live on the
  first device, the loss's targets on the last.
  """
  inputs, _ = profiling.Variables(
      tuple(profiling.WithRows(input_specs, rows * m, batch_dim)), name,
      tf.float32, devices[0])
  p = pipeline.PipeliningLayer.Params().Set(
      name=name, layers=[lp.Copy() for lp in layer_params],
      num_stages=len(devices), num_micro_batches=m, schedule=schedule,
      remat=remat, stage_devices=list(devices), batch_dim=batch_dim)
  if stage_sizes:
    p.stage_sizes = list(stage_sizes)
  targets = None
  if loss is not None:
    p.loss_tpl = loss[0].Copy()
    targets, _ = profiling.Variables(
        profiling.WithRows(loss[1], rows * m, batch_dim), name + '_targets',
        tf.float32, devices[-1])
  net = p.Instantiate()
  out = (net.FProp(net.theta, *inputs, targets=targets) if loss is not None
         else net.FProp(net.theta, *inputs))
  with tf.device(devices[-1]):
    floats = [tf.reduce_sum(tf.cast(t, tf.float32))
              for t in tf.nest.flatten(out)
              if t is not None and t.dtype.is_floating]
    total = tf.add_n(floats)
  grads = tf.gradients(total, net.vars.Flatten(),
                       colocate_gradients_with_ops=True)
  # The loss with the gradients, as a training step fetches it: gradients
  # alone need no forward task when every backward recomputes it.
  return [total.op] + [g.op for g in grads if g is not None]


# The most micro-batches a calibration graph runs. The factors are ratios
# per task: a few micro-batches give them, where the whole batch in small
# micro-batches built graphs of tens of calls (gigabytes and minutes for
# AmoebaNet-D at 4 rows).
CALIBRATION_MICRO_BATCHES = 4


def _CalibrationMicroBatches(profile, rows):
  """Micro-batches of `rows` rows a calibration graph runs."""
  return max(1, min(profile.batch // rows, CALIBRATION_MICRO_BATCHES))


def _TracedTasks(sess, fetch):
  """The task times of one traced run of `fetch` (timeline.TaskTime)."""
  metadata = tf.compat.v1.RunMetadata()
  sess.run(fetch, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
           run_metadata=metadata)
  return timeline.ParseStepStats(metadata.step_stats)


def _Predicted(profile, rows, m, schedule, remat):
  """The uncalibrated simulator's K=1 step of the calibration graph."""
  bare = profile.Replace(batch=rows * m, factors=(), contention=1.0,
                         update_traffic=0.0, step_seconds=0.0,
                         trainer_seconds=0.0)
  return simulator.Predict(bare, simulator.Configuration(
      1, 1, (profile.num_layers,), m, schedule, remat)).step_seconds


def Calibrate(target, devices, profile, layer_params, input_specs, rows,
              loss=None, batch_dim=0, repeats=7, warmup=2, log=None):
  """Factors per size and the contention (see the module docstring).

  Args:
    target: the session target of the worker processes.
    devices: their devices; the first runs the factors, the first two the
      contention (one device: no contention measured, 1.0).
    profile: the profile.Profile of `layer_params`.
    layer_params: the pipeline's layer params.
    input_specs: TensorSpecs (a tuple nest) of the first layer's inputs.
    rows: micro-batch sizes to calibrate at.
    loss: optional (loss layer params, target specs).
    batch_dim: the batch dimension.
    repeats: timed steps per configuration (the median).
    warmup: untimed steps first.
    log: a print-like function, or None.

  Returns:
    (list of profile.Factors, contention).
  """
  dtype = profile.Dtypes()[0]

  def Run():
    factors = []
    contention = 1.0
    for r in rows:
      # Micro-batches of r rows: every task a pipeline of that size runs.
      m = _CalibrationMicroBatches(profile, r)
      with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
        py_utils.GetOrCreateGlobalStepVar()
        fetches = {key: _Build(layer_params, input_specs, loss, batch_dim, r,
                               m, key[0], key[1], devices[:1],
                               'calib_%s_%s' % key) for key in _CALIBRATION}
        sess.run(tf.compat.v1.global_variables_initializer())
        timer = profiling.Timer(sess, repeats, warmup)
        # Less the session run's fixed cost (the profile's step_seconds),
        # which the factors of the tasks must not carry.
        measured = {key: max(timer.Seconds(f) - profile.step_seconds, 1e-9)
                    for key, f in fetches.items()}
        phases = traced.PhaseSeconds(_TracedTasks(sess, fetches[_SPLIT]))
      predicted = {key: _Predicted(profile, r, m, *key)
                   for key in _CALIBRATION}
      at = [layer.At(r, dtype) for layer in profile.layers]
      # The split graph's tasks as the layers' figures give them.
      profiled = {simulator.FORWARD: m * sum(a.forward for a in at),
                  simulator.BACKWARD: m * sum(a.backward for a in at),
                  simulator.WEIGHT: m * sum(a.weight for a in at)}
      forward = profiled[simulator.FORWARD]
      split = traced.PhaseFactors(
          measured[_SPLIT] / max(predicted[_SPLIT], 1e-9), phases, profiled)
      f, b, w = (split[p] for p in (simulator.FORWARD, simulator.BACKWARD,
                                    simulator.WEIGHT))
      unsplit = max(measured[_UNSPLIT] - f * forward, 0.0) / max(
          predicted[_UNSPLIT] - forward, 1e-9)
      recompute = max(measured[_REMAT] - measured[_SPLIT], 0.0) / max(
          forward, 1e-9)
      factors.append(profile_lib.Factors(rows=r, F=f, B=b, W=w, BW=unsplit,
                                         R=recompute))
      if log:
        log('calibrated at %d rows: %s' % (r, ', '.join(
            '%s %.2f' % (k, getattr(factors[-1], k))
            for k in profile_lib.FACTOR_KINDS)))
    if len(devices) > 1:
      middle = rows[len(rows) // 2]
      contention = _Contention(target, devices[:2], layer_params,
                               input_specs, loss, batch_dim, middle,
                               _CalibrationMicroBatches(profile, middle),
                               repeats,
                               warmup)
      if log:
        log('contention of two devices computing at once: %.2f' % contention)
    return factors, contention
  return background.RunIsolated(Run)


def _Contention(target, devices, layer_params, input_specs, loss, batch_dim,
                rows, m, repeats, warmup):
  """A stage's step on both devices at once over on one alone."""
  with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
    py_utils.GetOrCreateGlobalStepVar()
    fetches = [_Build(layer_params, input_specs, loss, batch_dim, rows, m,
                      'zb_h1', 'never', [d], 'contention%d' % i)
               for i, d in enumerate(devices)]
    sess.run(tf.compat.v1.global_variables_initializer())
    timer = profiling.Timer(sess, repeats, warmup)
    alone = timer.Seconds(fetches[0])
    both = timer.Seconds(fetches[0] + fetches[1])
  return max(both / max(alone, 1e-9), 1.0)


# The pipelined hand-over run: this many micro-batches, 1F1B, traced steps.
HANDOVER_MICRO_BATCHES = 8
HANDOVER_TRACES = 3


def CalibrateHandover(target, devices, profile, layer_params, input_specs,
                      loss=None, batch_dim=0, rows=None, repeats=7,
                      warmup=2):
  """The hand-over between two devices as the executor's stages pay it.

  A stage boundary between worker processes costs more than a tensor read
  across them (``profiling.MeasureHandover``): the executor's calls send
  their outputs and gradients between the workers' functions.

  1. Bandwidth: the model cut in two on the two devices, one micro-batch of
     the whole batch, runs F, a hand-over, F, B, a hand-over, B in turn;
     what its measured step takes beyond the calibrated simulator's (whose
     two hand-overs are the profile's) is put on those two hand-overs of
     the boundary's bytes, as a lower bandwidth.
  2. Latency: the same cut in ``HANDOVER_MICRO_BATCHES`` micro-batches of
     `rows` under 1F1B, traced: each sender is already in its next task
     when its output leaves. The median delay from a task's end to the
     start of its waiting reader on the other device
     (``traced.HandoverDelays``), less the boundary's bytes over the
     bandwidth, is the latency (never below the profile's).

  Args:
    target: the session target of the worker processes.
    devices: their devices (the first two are used).
    profile: the profile.Profile of `layer_params`, with its factors.
    layer_params: the pipeline's layer params.
    input_specs: TensorSpecs (a tuple nest) of the first layer's inputs.
    loss: optional (loss layer params, target specs).
    batch_dim: the batch dimension.
    rows: the pipelined run's micro-batch size; default the batch over
      ``HANDOVER_MICRO_BATCHES``.
    repeats: timed steps (the median).
    warmup: untimed steps first.

  Returns:
    A profile.Handover.
  """
  config = simulator.Configuration(
      1, 2, search.Cut(profile, 2, profile.batch), 1, 'gpipe', 'never')
  # The devices compute in turn: no contention; no update is run.
  bare = profile.Replace(contention=1.0, update_traffic=0.0,
                         step_seconds=0.0, trainer_seconds=0.0)
  predicted = simulator.Predict(bare, config).step_seconds
  boundary = simulator.StageModels(bare, config)[0].output_bytes
  m = HANDOVER_MICRO_BATCHES
  rows = rows or max(1, profile.batch // m)
  small = profile.Replace(batch=rows * m)
  cut = search.Cut(small, 2, rows)
  small_boundary = simulator.StageModels(small, simulator.Configuration(
      1, 2, cut, m, '1f1b', 'never'))[0].output_bytes

  def Run():
    with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
      py_utils.GetOrCreateGlobalStepVar()
      fetch = _Build(layer_params, input_specs, loss, batch_dim,
                     profile.batch, 1, 'gpipe', 'never', devices[:2],
                     'handover', stage_sizes=config.stage_sizes)
      pipelined = _Build(layer_params, input_specs, loss, batch_dim, rows,
                         m, '1f1b', 'never', devices[:2],
                         'handover_pipelined', stage_sizes=cut)
      sess.run(tf.compat.v1.global_variables_initializer())
      seconds = profiling.Timer(sess, repeats, warmup).Seconds(fetch)
      for _ in range(warmup):
        sess.run(pipelined)
      delays = []
      for _ in range(HANDOVER_TRACES):
        delays += traced.HandoverDelays(_TracedTasks(sess, pipelined))
      return seconds, delays

  measured, delays = background.RunIsolated(Run)
  handover = profile.handover
  each = handover.Seconds(boundary) + (measured - predicted) / 2
  if boundary and each > handover.Seconds(boundary):
    handover = profile_lib.Handover(handover.latency,
                                    boundary / (each - handover.latency))
  if delays:
    latency = statistics.median(delays) - small_boundary / handover.bandwidth
    handover = handover._replace(latency=max(latency, handover.latency))
  return handover


def Rows(rows):
  """The sizes to calibrate at: the largest, a middle and the smallest."""
  rows = sorted(set(rows))
  return sorted({rows[0], rows[len(rows) // 2], rows[-1]})


# A sample's batch: this many micro-batches of the largest calibrated size.
SAMPLE_MICRO_BATCHES = 4


def CalibrateProfile(profile, target, devices, layer_params, input_specs,
                     rows, loss=None, batch_dim=0, num_layers=None,
                     handover=True, log=None):
  """`profile` with its Factors, contention and hand-over calibrated.

  Args:
    profile: the profile.Profile of `layer_params`.
    target: the session target of the worker processes.
    devices: their devices (see ``Calibrate``).
    layer_params: the pipeline's layer params.
    input_specs: TensorSpecs (a tuple nest) of the first layer's inputs.
    rows: micro-batch sizes to calibrate at.
    loss: optional (loss layer params, target specs).
    batch_dim: the batch dimension.
    num_layers: calibrate on a sample of the model, for one that does not
      fit a worker or would take hours a step there: its first
      `num_layers` layers (without the loss unless they are all of them)
      on a batch of ``SAMPLE_MICRO_BATCHES`` micro-batches of the largest
      size. The factors are ratios of the executor's tasks to the layers'
      sums, so they carry over to the whole model. None: the whole model
      on its batch.
    handover: with two devices or more (and two layers to cut between),
      also calibrate the hand-over between them (``CalibrateHandover``);
      False keeps the profile's (one given for a cluster that is not
      here).
    log: a print-like function, or None.

  Returns:
    The profile with its factors, contention and hand-over.

  Raises:
    ValueError: `num_layers` is not a positive number.
  """
  sample = profile
  if num_layers is not None:
    if num_layers < 1:
      raise ValueError('calibrate on at least one layer, not %d' %
                       num_layers)
    if num_layers < profile.num_layers:
      layer_params, loss = layer_params[:num_layers], None
    sample = profile.Replace(
        layers=profile.layers[:num_layers],
        batch=min(profile.batch, SAMPLE_MICRO_BATCHES * max(rows)))
  factors, contention = Calibrate(
      target, devices, sample, layer_params, input_specs, rows, loss=loss,
      batch_dim=batch_dim, log=log)
  changes = dict(factors=tuple(factors), contention=contention)
  if handover and len(devices) > 1 and sample.num_layers > 1:
    changes['handover'] = CalibrateHandover(
        target, devices, sample.Replace(**changes), layer_params,
        input_specs, loss=loss, batch_dim=batch_dim, rows=min(rows))
    if log:
      log('hand-over between the stages: %.2f ms + %.0f MB/s (tensor reads: '
          '%.0f MB/s)' % (1e3 * changes['handover'].latency,
                          changes['handover'].bandwidth / 1e6,
                          profile.handover.bandwidth / 1e6))
  return profile.Replace(**changes)
