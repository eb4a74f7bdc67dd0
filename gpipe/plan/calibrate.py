"""Calibrating a profile against the executor's own stage calls.

A layer timed on its own (``measure``) is not the same work as that layer
inside a stage function of the executor: the stage's forward returns what
its backward reads, a split backward returns what W reads, the calls cross
a function boundary, and two worker processes computing at once share the
caches and the memory bandwidth of their cores. ``Calibrate`` measures the
difference once per model:

1. On one pinned worker, the whole model as one stage (K=1) of a real
   ``gpipe.PipeliningLayer`` at a few micro-batch sizes, under a split
   backward ('zb_h1': F, B, W tasks) and an unsplit one ('gpipe': B does
   W's work), with and without re-materialization, one traced step each:
   the median duration of each kind of task against the sum of the layers'
   profile figures gives a factor per kind and size (``profile.Factors``): F, B, W
   of a split backward, the unsplit B (input and weight gradient), and the
   recomputed forward of a re-materializing B.
2. The same stage on both workers at once, against one alone: the slowdown
   of a device while the other computes too (``contention``).

The simulator multiplies each task's profile time by its factor
(``profile.FactorsAt``: interpolated in the rows) and, when more than one
device computes, by the contention.
"""

import collections
import statistics
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from gpipe.measure import param_count
from gpipe.measure import timeline
from gpipe.plan import measure
from gpipe.plan import profile as profile_lib
from lingvo import compat as tf
from lingvo.core import py_utils

def _Sums(profile_layers, rows, dtype):
  at = [layer.At(rows, dtype) for layer in profile_layers]
  return dict(F=sum(m.forward for m in at), B=sum(m.backward for m in at),
              W=sum(m.weight for m in at))


def _Build(layer_params, input_specs, loss, batch_dim, rows, m, schedule,
           remat, device, name):
  """One K=1 pipeline on `device`: returns the gradient ops to run."""
  inputs, _ = measure.Variables(
      tuple(measure.WithRows(input_specs, rows * m, batch_dim)), name,
      tf.float32, device)
  p = pipeline.PipeliningLayer.Params().Set(
      name=name, layers=[lp.Copy() for lp in layer_params], num_stages=1,
      num_micro_batches=m, schedule=schedule, remat=remat,
      stage_devices=[device], batch_dim=batch_dim)
  targets = None
  if loss is not None:
    p.loss_tpl = loss[0].Copy()
    targets, _ = measure.Variables(
        measure.WithRows(loss[1], rows * m, batch_dim), name + '_targets',
        tf.float32, device)
  net = p.Instantiate()
  out = (net.FProp(net.theta, *inputs, targets=targets) if loss is not None
         else net.FProp(net.theta, *inputs))
  with tf.device(device):
    floats = [tf.reduce_sum(tf.cast(t, tf.float32))
              for t in tf.nest.flatten(out)
              if t is not None and t.dtype.is_floating]
    total = tf.add_n(floats)
  grads = tf.gradients(total, net.vars.Flatten(),
                       colocate_gradients_with_ops=True)
  return [g.op for g in grads if g is not None]


def _TaskMedians(sess, fetch, runs):
  """{phase: median seconds} of the stage calls, as in untraced steps.

  Traced steps say which task took how long, but tracing slows every op
  down (more where ops are many and small): the tasks' traced durations
  are scaled by the untraced step's median over the traced step's.
  """
  durations = collections.defaultdict(list)
  traced, untraced = [], []
  for _ in range(runs):
    metadata = tf.compat.v1.RunMetadata()
    start = time.perf_counter()
    sess.run(fetch, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
             run_metadata=metadata)
    traced.append(time.perf_counter() - start)
    for t in timeline.ParseStepStats(metadata.step_stats):
      durations[t.phase].append(t.end - t.start)
    start = time.perf_counter()
    sess.run(fetch)
    untraced.append(time.perf_counter() - start)
  scale = min(statistics.median(untraced) / statistics.median(traced), 1.0)
  return {phase: scale * statistics.median(v)
          for phase, v in durations.items()}


def Calibrate(target, devices, profile_layers, layer_params, input_specs,
              rows, loss=None, batch_dim=0, dtype='float32', runs=3,
              warmup=2, log=None):
  """Factors per size and the contention (see the module docstring).

  Args:
    target: the session target of the worker processes.
    devices: their devices; the first runs the factors, the first two the
      contention (one device: no contention measured, 1.0).
    profile_layers: the profile's Layers of `layer_params`.
    layer_params: the pipeline's layer params.
    input_specs: TensorSpecs (a tuple nest) of the first layer's inputs.
    rows: micro-batch sizes to calibrate at.
    loss: optional (loss layer params, target specs).
    batch_dim: the batch dimension.
    dtype: the compute dtype of the profile figures.
    runs: traced steps per configuration (the median task).
    warmup: untimed steps first.
    log: a print-like function, or None.

  Returns:
    (list of profile.Factors, contention).
  """
  m = 2  # Two micro-batches: every kind of task runs, twice.

  def Run():
    factors = []
    contention = 1.0
    for r in rows:
      got = {}
      with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
        py_utils.GetOrCreateGlobalStepVar()
        fetches = {}
        for schedule, remat in (('zb_h1', 'never'), ('zb_h1', 'always'),
                                ('gpipe', 'never')):
          fetches[schedule, remat] = _Build(
              layer_params, input_specs, loss, batch_dim, r, m, schedule,
              remat, devices[0], 'calib_%s_%s' % (schedule, remat))
        sess.run(tf.compat.v1.global_variables_initializer())
        for key, fetch in fetches.items():
          for _ in range(warmup):
            sess.run(fetch)
          got[key] = _TaskMedians(sess, fetch, runs)
      sums = _Sums(profile_layers, r, dtype)
      split, remat, unsplit = (got['zb_h1', 'never'], got['zb_h1', 'always'],
                               got['gpipe', 'never'])
      factors.append(profile_lib.Factors(
          rows=r, F=split['F'] / max(sums['F'], 1e-9),
          B=split['B'] / max(sums['B'], 1e-9),
          W=split['W'] / max(sums['W'], 1e-9),
          BW=unsplit['B'] / max(sums['B'] + sums['W'], 1e-9),
          R=max(remat['B'] - split['B'], 0.0) / max(sums['F'], 1e-9)))
      if log:
        log('calibrated at %d rows: %s' % (r, ', '.join(
            '%s %.2f' % (k, getattr(factors[-1], k))
            for k in profile_lib.FACTOR_KINDS)))
    if len(devices) > 1:
      contention = _Contention(target, devices[:2], layer_params,
                               input_specs, loss, batch_dim, rows[len(rows) //
                                                                  2], m,
                               runs, warmup)
      if log:
        log('contention of two devices computing at once: %.2f' % contention)
    return factors, contention
  return param_count.RunIsolated(Run)


def _Contention(target, devices, layer_params, input_specs, loss, batch_dim,
                rows, m, runs, warmup):
  """A stage's step on both devices at once over on one alone."""
  with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
    py_utils.GetOrCreateGlobalStepVar()
    fetches = [_Build(layer_params, input_specs, loss, batch_dim, rows, m,
                      'zb_h1', 'never', d, 'contention%d' % i)
               for i, d in enumerate(devices)]
    sess.run(tf.compat.v1.global_variables_initializer())
    timer = measure.Timer(sess, 2 * runs + 1, warmup)
    alone = timer.Seconds(fetches[0])
    both = timer.Seconds(fetches[0] + fetches[1])
  return max(both / max(alone, 1e-9), 1.0)


def Rows(rows):
  """The sizes to calibrate at: the largest, a middle and the smallest."""
  rows = sorted(set(rows))
  return sorted({rows[0], rows[len(rows) // 2], rows[-1]})


def CalibrateProfile(profile, target, devices, layer_params, input_specs,
                     rows, loss=None, batch_dim=0, log=None):
  """`profile` with its Factors and contention measured (``Calibrate``)."""
  factors, contention = Calibrate(
      target, devices, profile.layers, layer_params, input_specs, rows,
      loss=loss, batch_dim=batch_dim, dtype=profile.Dtypes()[0], log=log)
  return profile.Replace(factors=tuple(factors), contention=contention)
