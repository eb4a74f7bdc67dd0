"""The plan subcommand: the planner's predictions against measured steps.

For each benchmark stack (the Transformer, the AmoebaNet-D-like and the
dense stack of ``models``):

1. its profile (``gpipe.plan.profiling``): every layer's F, B and W seconds
   and bytes at the micro-batch sizes M in 1..32 give, measured in a child
   process pinned to one core with the workers' threads, and the hand-over
   between the runner's two pinned one-core workers;
2. the planner's search (``gpipe.plan.search``) for the two devices here
   (R and K in {1, 2}, v up to 2) under a memory cap of half of what
   fill-drain at K=2, M=8 without remat is predicted to need, so the
   configurations that keep every micro-batch's activations are dropped;
   its runner's step applies each variable's gradient on its own, so the
   predictions free a stage's gradient sum after its last weight gradient
   (``simulator.UPDATE_EACH_VARIABLE``, not the planner's default);
3. the top candidates run on the runner's pinned one-core workers (timed
   interleaved; one traced step each for its peak memory per device),
   beside K=1, M=1 and, at K=2, M=8 with remat, ZB-V, ZB-H1 and the
   timing-aware 'zb_auto' ordered by the measured costs (with the memory
   limits of a roomy cap, and with ZB-H1's).

It reports, per configuration, the predicted and measured step time and
peak step memory per device (the step's own tensors, as
``gpipe.measure.memory`` measures them; variables come on top, the same on
both sides), and per model the largest errors, whether the planner's pick
is within 5% of the fastest measured candidate and whether it fits the cap
as measured. The plot puts predicted against measured.
"""

import json
import multiprocessing
import os
import statistics
import tempfile

from gpipe.measure import memory
from gpipe.measure import timeline
from gpipe.plan import calibrate
from gpipe.plan import profiling
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.schedules import registry
from gpipe.schedules import timed
from tools.benchmark import models
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput

DEVICES = 2
# The largest M searched and measured (micro-batch sizes batch / M).
MAX_MICRO_BATCHES = 32
# The training step of the benchmark's runner: SGD, assign_sub(v, lr * g):
# read g, write lr * g, read both, write v.
UPDATE_TRAFFIC = 5.0
# That step applies each variable's gradient on its own as soon as it is
# complete: a stage's gradient sum is freed after its last weight gradient.
UPDATE = simulator.UPDATE_EACH_VARIABLE
# Threads of the profiling process: those of a pinned worker.
INTRA_OP_THREADS = 1
INTER_OP_THREADS = 2
# The zero-bubble comparison: K=2 devices, M=8, remat always: (label,
# schedule, the cap zb_auto's memory limits come from). With a roomy cap
# zb_auto may warm up deeper (more memory); without one it keeps ZB-H1's.
ZB_M = 8
ZB_RUNS = (('zb_v', 'zb_v', None), ('zb_h1', 'zb_h1', None),
           ('zb_auto', 'zb_auto', 1 << 30),
           ('zb_auto (ZB-H1 memory)', 'zb_auto', None))
ZB_LABELS = tuple(label for label, _, _ in ZB_RUNS)


def _Rows(batch, max_micro_batches):
  return sorted({batch // m for m in range(1, max_micro_batches + 1)
                 if batch % m == 0 and m & (m - 1) == 0}, reverse=True)


def _ProfileChild(model, shape, rows, core, repeats, handover, step_seconds,
                  path):
  """Measures a benchmark stack's profile in this (spawned) process."""
  # pylint: disable=g-import-not-at-top
  from gpipe.compat import lingvo_import  # pylint: disable=unused-import
  from lingvo import compat as tf
  # pylint: enable=g-import-not-at-top
  profiling.PinToCore(core)
  config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=INTRA_OP_THREADS,
      inter_op_parallelism_threads=INTER_OP_THREADS)
  layers, specs, loss = _StackSpecs(model, shape)
  got = profiling.MeasureModel(
      model, layers, specs, shape['batch'], rows, loss=loss,
      optimizer_slots=0, update_traffic=UPDATE_TRAFFIC,
      handover=profile_lib.Handover(*handover), step_seconds=step_seconds,
      session_config=config, repeats=repeats,
      machine=runner_lib.MachineInfo(),
      notes='pinned to core %d, %d intra-op + %d inter-op threads' %
      (core, INTRA_OP_THREADS, INTER_OP_THREADS), log=report.Log)
  profile_lib.Save(got, path)


def _StackSpecs(model, shape):
  """(layer params, input specs, loss) of a benchmark stack."""
  # pylint: disable=g-import-not-at-top
  from lingvo import compat as tf
  # pylint: enable=g-import-not-at-top
  batch, width = shape['batch'], shape['width']
  return (models.ModelLayers(model, shape['num_layers'], width),
          (tf.TensorSpec(models.InputShape(model, batch, width),
                         tf.float32),),
          (models.MeanSquareLoss.Params().Set(name='loss'),
           tf.TensorSpec([batch], tf.float32)))


def MeasureProfile(model, shape, rows, core, repeats, handover,
                   step_seconds, in_process=False):
  """The stack's Profile, measured in a child process pinned to `core`."""
  path = os.path.join(tempfile.mkdtemp(), '%s_profile.json' % model)
  args = (model, shape, rows, core, repeats, tuple(handover), step_seconds,
          path)
  if in_process:
    _ProfileChild(*args)
  else:
    child = multiprocessing.get_context('spawn').Process(
        target=_ProfileChild, args=args)
    child.start()
    child.join()
    if child.exitcode:
      raise RuntimeError('profiling %s failed (exit status %d)' %
                         (model, child.exitcode))
  return profile_lib.Load(path)


def RunnerConfig(model, shape, config, prediction):
  """The runner.Config of a planner Configuration (costs as planned)."""
  costs = None
  if registry.Get(config.schedule).split_backward:
    costs = json.dumps(prediction.task_costs, sort_keys=True)
  return runner_lib.Config(
      'gpipe', model, shape['num_layers'], shape['batch'],
      config.devices_per_replica, config.micro_batches, config.remat,
      shape['width'], config.stages_per_device, config.schedule,
      config.dtype, config.replicas, config.batched_weights,
      tuple(config.stage_sizes), costs)


def _Tasks(task_times):
  """A Prediction's task times as timeline.TaskTime-like records."""
  return [timeline.TaskTime(t.stage, t.micro_batch, t.phase, d, start, end,
                            start)
          for d, lane in enumerate(task_times) for t, start, end in lane]


def _TaskSeconds(tasks):
  """{phase: median seconds} of the tasks of one step (replica 0's)."""
  by = {}
  for t in tasks:
    by.setdefault(t.phase, []).append(t.end - t.start)
  return {phase: statistics.median(v) for phase, v in sorted(by.items())}


def _WorkerPeaks(peaks, num_workers):
  """Peak bytes per worker task index, from PeakBytesPerDevice's keys."""
  out = [0] * num_workers
  for device, value in peaks.items():
    for task in range(num_workers):
      if '/task:%d/' % task in device:
        out[task] = max(out[task], value)
  return out


def _Cap(profile, cap_fraction):
  """The cap: `cap_fraction` of fill-drain's need at K=2, M=8, no remat."""
  m = 8 if profile.batch % 8 == 0 else 1
  config = simulator.Configuration(
      1, 2, search.Cut(profile, 2, profile.batch // m), m, 'gpipe', 'never')
  return cap_fraction * max(
      simulator.Predict(profile, config, update=UPDATE).peak_bytes)


def _Comparison(profile):
  """(label, Configuration, Prediction) of K=1 M=1 and the ZB schedules."""
  out = []
  one = simulator.Configuration(1, 1, (profile.num_layers,), 1, 'gpipe',
                                'always')
  out.append(('K=1 M=1', one, simulator.Predict(profile, one,
                                                 update=UPDATE)))
  if profile.batch % ZB_M:
    return out
  rows = profile.batch // ZB_M
  for label, name, cap in ZB_RUNS:
    v = registry.Get(name).stages_per_device
    config = simulator.Configuration(
        1, DEVICES * v, search.Cut(profile, DEVICES * v, rows), ZB_M, name,
        'always', stages_per_device=v)
    candidate = search.Evaluate(profile, config, cap, update=UPDATE)
    if candidate.prediction is not None:
      out.append((label, config, candidate.prediction))
      continue
    # The measured costs were refused (ZB-V's greedy can find no order for
    # some uneven costs): order by unit costs, as without a plan.
    k = config.num_stages
    unit = timed.StageCosts([1.0] * k, [2.0] * k, [1.0] * k)
    try:
      out.append(('%s (unit-cost orders)' % label, config,
                  simulator.Predict(profile, config, unit, update=UPDATE)))
    except ValueError as e:
      report.Log('%s: %s' % (label, e))
  return out


def _RunModel(args, name, shape):
  """Profile, search, run and compare one stack."""
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
  try:
    cluster = runner.Cluster('gpipe', DEVICES)
    if cluster.pids:
      got = profiling.MeasureHandover(cluster.target,
                                      cluster.devices[:DEVICES],
                                      repeats=args.repeats)
    else:
      # Devices of one process (the tests' runners): nothing is handed over
      # between processes.
      got = dict(handover=profile_lib.Handover(0.0, 1e30), step_seconds=0.0)
    handover = got['handover']
    report.Log('%s: hand-over %.2f ms + %.0f MB/s, empty step %.2f ms' % (
        name, 1e3 * handover.latency, handover.bandwidth / 1e6,
        1e3 * got['step_seconds']))
    rows = _Rows(shape['batch'], args.max_micro_batches)
    profile = MeasureProfile(name, shape, rows, args.core, args.repeats,
                             handover, got['step_seconds'],
                             in_process=args.quick)
    if cluster.pids and args.calibrate:
      layers, specs, loss = _StackSpecs(name, shape)
      profile = calibrate.CalibrateProfile(
          profile, cluster.target, cluster.devices[:DEVICES], layers, specs,
          calibrate.Rows(rows), loss=loss, log=report.Log)
    if args.profile_dir:
      os.makedirs(args.profile_dir, exist_ok=True)
      profile_lib.Save(profile, os.path.join(args.profile_dir,
                                             'profile_%s.json' % name))
    cap = _Cap(profile, args.cap_fraction)
    result = search.Search(profile, DEVICES, cap, update=UPDATE,
                           max_micro_batches=args.max_micro_batches)
    if args.quick:
      # The simulated runner of the tests has no batched weight gradients.
      result = result._replace(candidates=[
          c for c in result.candidates if not c.config.batched_weights])
    planned = [('#%d' % (i + 1), c.config, c.prediction)
               for i, c in enumerate(result.candidates[:args.top])]
    runs = planned + _Comparison(profile)
    configs = [RunnerConfig(name, shape, c, p) for _, c, p in runs]
    unique = list(dict.fromkeys(configs))
    steps = {c: runner.Add(c) for c in unique}
    runner.TimeInterleaved(list(steps.values()), args.steps, args.warmup)
    # Per step, not per label: zb_auto's orders under two memory limits
    # share one label.
    medians = {c: statistics.median(step.times) for c, step in steps.items()}
    peaks, task_seconds = {}, {}
    for c, step in steps.items():
      _, metadata = step.Run(trace=True)
      try:
        per_device = memory.PeakBytesPerDevice(metadata)
      except ValueError:
        per_device = {}
      peaks[c] = _WorkerPeaks(per_device, c.num_workers)
      task_seconds[c] = _TaskSeconds(
          timeline.ParseStepStats(metadata.step_stats))
  finally:
    runner.Close()
  records = []
  for (label, config, prediction), rc in zip(runs, configs):
    measured_peaks = peaks[rc]
    records.append(dict(
        label=label, config=config.ToJson(), name=config.label,
        predicted_step_seconds=prediction.step_seconds,
        measured_step_seconds=medians[rc],
        predicted_step_peak_bytes=list(prediction.step_peak_bytes),
        measured_step_peak_bytes=measured_peaks,
        static_bytes=list(prediction.static_bytes),
        measured_task_seconds=task_seconds[rc],
        predicted_task_seconds=_TaskSeconds(
            _Tasks(prediction.task_times)),
        measured_fits=all(
            m + s <= cap for m, s in zip(measured_peaks,
                                         prediction.static_bytes)),
        planned=label.startswith('#')))
  return dict(profile=profile.ToJson(), cap_bytes=cap,
              num_fitting=len(result.candidates),
              num_dropped=len(result.dropped),
              dropped=search.ToJson(result, top=args.top)['dropped_by_reason'],
              table=search.Table(result, top=args.top), records=records,
              headline=_Headline(records))


def _Error(predicted, measured):
  return (predicted - measured) / measured if measured else None


def _Headline(records):
  """The accuracy figures of one model (see the module docstring)."""
  step_errors = [_Error(r['predicted_step_seconds'], r['measured_step_seconds'])
                 for r in records]
  memory_errors = [_Error(p, m) for r in records for p, m in zip(
      r['predicted_step_peak_bytes'], r['measured_step_peak_bytes']) if m]
  planned = [r for r in records if r['planned']]
  fitting = [r for r in planned if r['measured_fits']]
  headline = dict(
      max_step_error=max(abs(e) for e in step_errors),
      max_memory_error=max(abs(e) for e in memory_errors) if memory_errors
      else None)
  if planned:
    fastest = min(fitting or planned, key=lambda r: r['measured_step_seconds'])
    pick = planned[0]
    headline.update(
        pick=pick['name'], pick_fits_measured=pick['measured_fits'],
        fastest_measured=fastest['name'],
        pick_over_fastest=(pick['measured_step_seconds'] /
                           fastest['measured_step_seconds']))
  base = [r for r in records if r['label'] == 'K=1 M=1']
  if base:
    for r in records:
      r['speedup_vs_K1M1'] = (base[0]['measured_step_seconds'] /
                              r['measured_step_seconds'])
    headline['zero_bubble_speedups'] = {
        r['label']: r['speedup_vs_K1M1'] for r in records
        if r['label'].split(' (unit')[0] in ZB_LABELS}
  return headline


def _Tables(name, result):
  mib = float(1 << 20)
  rows = []
  for r in result['records']:
    rows.append([
        r['label'], r['name'], '%.1f' % (1e3 * r['predicted_step_seconds']),
        '%.1f' % (1e3 * r['measured_step_seconds']),
        '%+.0f%%' % (100 * _Error(r['predicted_step_seconds'],
                                  r['measured_step_seconds'])),
        ', '.join('%.1f' % (b / mib) for b in r['predicted_step_peak_bytes']),
        ', '.join('%.1f' % (b / mib) for b in r['measured_step_peak_bytes']),
        'yes' if r['measured_fits'] else 'no',
        '%.2fx' % r['speedup_vs_K1M1'] if 'speedup_vs_K1M1' in r else '',
        ' '.join('%s %.0f/%.0f' % (
            phase, 1e3 * r['predicted_task_seconds'].get(phase, 0),
            1e3 * seconds)
                 for phase, seconds in r['measured_task_seconds'].items())])
  h = result['headline']
  text = ('### %s (cap %.1f MiB per device: %d configurations fit, %d '
          'dropped)\n\n' % (name, result['cap_bytes'] / mib,
                            result['num_fitting'], result['num_dropped']) +
          result['table'] + '\n\nPredicted vs measured:\n\n' + report.Table(
              ['', 'configuration', 'predicted ms', 'measured ms', 'error',
               'predicted peak MiB', 'measured peak MiB', 'fits (measured)',
               'over K=1 M=1', 'task ms predicted/measured'], rows))
  text += ('\n\nLargest error: step time %.0f%%, peak memory %s. ' % (
      100 * h['max_step_error'], '%.0f%%' % (100 * h['max_memory_error'])
      if h['max_memory_error'] is not None else '-'))
  if 'pick' in h:
    text += ('The pick (%s) %s as measured; it takes %.2fx the step of the '
             'fastest measured candidate that fits (%s).' % (
                 h['pick'], 'fits' if h['pick_fits_measured'] else
                 'does NOT fit', h['pick_over_fastest'],
                 h['fastest_measured']))
  return text


def Plan(args):
  """The planner's predictions against measured steps (module docstring)."""
  shapes = (throughput.QUICK_THROUGHPUT_MODELS if args.quick else
            throughput.THROUGHPUT_MODELS)
  names = args.models.split(',') if args.models else ['transformer', 'amoeba',
                                                       'dense']
  settings = dict(devices=DEVICES, cap_fraction=args.cap_fraction,
                  top=args.top, steps=args.steps, warmup=args.warmup,
                  max_micro_batches=args.max_micro_batches,
                  profile_repeats=args.repeats, priority=args.priority,
                  workers='2 processes, one pinned core each, 1 intra-op + '
                  '2 inter-op threads; profile on core %d' % args.core)
  header, info = report.Header('Planner', settings)
  result = dict(machine=info, settings=settings, models={})
  texts = []
  for name in names:
    got = _RunModel(args, name, shapes[name])
    result['models'][name] = dict(got, **shapes[name])
    texts.append(_Tables(name, got))
  text = header + '\n' + '\n\n'.join(texts)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    values = {axes[0]: [], axes[1]: []}
    for name in names:
      records = result['models'][name]['records']
      steps = [(1e3 * r['measured_step_seconds'],
                1e3 * r['predicted_step_seconds']) for r in records]
      mems = [(m / 2.0**20, p / 2.0**20) for r in records for p, m in zip(
          r['predicted_step_peak_bytes'], r['measured_step_peak_bytes'])]
      for ax, points in ((axes[0], steps), (axes[1], mems)):
        points = [(x, y) for x, y in points if x > 0 and y > 0]
        if points:
          ax.plot([x for x, _ in points], [y for _, y in points], 'o',
                  label=name, alpha=0.7)
          values[ax] += [v for point in points for v in point]
    for ax, what, band in ((axes[0], 'step time (ms)', 0.15),
                           (axes[1], 'peak step memory per device (MiB)',
                            0.20)):
      # The diagonal and the band over the figures' own range.
      xs = [0.8 * min(values[ax] or [1.0]), 1.25 * max(values[ax] or [1.0])]
      ax.plot(xs, xs, 'k-', lw=0.8)
      ax.plot(xs, [x * (1 + band) for x in xs], 'k:', lw=0.6)
      ax.plot(xs, [x * (1 - band) for x in xs], 'k:', lw=0.6)
      ax.set_xscale('log')
      ax.set_yscale('log')
      ax.set_xlabel('measured ' + what)
      ax.set_ylabel('predicted ' + what)
      ax.set_title('%s: dotted +-%d%%' % (what, 100 * band))
      ax.legend(fontsize=8)
    return fig

  report.Write(args, result, Plot)
  return result
