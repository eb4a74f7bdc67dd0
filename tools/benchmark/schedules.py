"""The schedules subcommand: every pipeline schedule on two one-core workers.

For the Transformer and AmoebaNet-D-like stacks (``models``), on K=2 pinned
one-core worker processes, every schedule of the registry ``gpipe.schedules``
(fill-drain, 1F1B, interleaved 1F1B with v=2, ZB-H1, ZB-V with v=2) at every
M it allows, all ending the pipeline with the same per-example loss layer:

* steps timed interleaved in one run, as speed-ups over K=1, M=1 (the same
  remat mode on both sides);
* the measured bubble (idle fraction of each device over the pipeline's
  span, from traced steps) beside the schedule's formula
  (``registry.BubbleFormula``), with a timeline picture per schedule;
* with ``--memory_m`` (default 16) and remat='never', the peak memory of
  each device's step (activations, gradients, temporaries) per schedule and
  its ratio to fill-drain's.
"""

import os
import statistics

from gpipe.measure import memory
from gpipe.schedules import registry as schedule_registry
from gpipe.measure import timeline
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput

K = 2
# Stages per device of each schedule here (2 devices), from the registry.
STAGES_PER_DEVICE = {name: schedule_registry.Get(name).stages_per_device
                     for name in schedule_registry.Names()}
MIB = float(1 << 20)


def _Placement(name, v):
  return schedule_registry.Placement(name, K * v, K)


def _Allowed(name, m, batch):
  if batch % m:
    return False
  try:
    schedule_registry.Orders(name, _Placement(name, STAGES_PER_DEVICE[name]), m)
  except ValueError:
    return False
  return True


def _Config(name, shape, model, m, remat, k=K):
  v = STAGES_PER_DEVICE[name] if k == K else 1
  return runner_lib.Config('gpipe', model, shape['num_layers'],
                           shape['batch'], k, m, remat, shape['width'], v,
                           name)


def _Traced(step, num_steps):
  """(bubbles per device, tasks, peaks per device) of the median step."""
  runs = []
  for _ in range(num_steps):
    _, metadata = step.Run(trace=True)
    tasks = timeline.ParseStepStats(metadata.step_stats)
    try:
      peaks = memory.PeakBytesPerDevice(metadata)
    except ValueError:
      peaks = {}
    runs.append((timeline.BubbleFractions(tasks, 'device'), tasks, peaks))
  runs.sort(key=lambda r: statistics.mean(r[0]))
  return runs[len(runs) // 2]


def _WorkerPeaks(peaks):
  """Peak bytes per worker task (0, 1), from gpipe.measure.memory's device keys."""
  out = {}
  for device, value in peaks.items():
    for task in range(K):
      if '/task:%d/' % task in device:
        out[task] = max(out.get(task, 0), value)
  return [out.get(task, 0) for task in range(K)]


def _RunModel(args, name, shape, mbs):
  """Throughput, bubbles and memory of every schedule for one model."""
  base = _Config('gpipe', shape, name, 1, args.remat, k=1)
  configs = [base] + [
      _Config(sched, shape, name, m, args.remat)
      for sched in STAGES_PER_DEVICE for m in mbs
      if _Allowed(sched, m, shape['batch'])]
  memory_configs = []
  if args.memory_m and shape['batch'] % args.memory_m == 0:
    memory_configs = [
        _Config(sched, shape, name, args.memory_m, 'never')
        for sched in STAGES_PER_DEVICE
        if _Allowed(sched, args.memory_m, shape['batch'])]
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
  records = []
  try:
    steps = [runner.Add(c) for c in configs]
    medians = runner.TimeInterleaved(steps, args.steps, args.warmup)
    for step in steps:
      c = step.config
      record = dict(schedule=c.schedule, K=c.num_stages,
                    v=c.stages_per_device, M=c.num_micro_batches,
                    remat=c.remat, seconds=medians[c.label],
                    speedup=medians[base.label] / medians[c.label])
      if c.num_stages == K:
        bubbles, tasks, _ = _Traced(step, args.trace_steps)
        record.update(
            measured_bubbles=bubbles,
            formula_bubble=schedule_registry.BubbleFormula(
                c.schedule, K, c.stages_per_device, c.num_micro_batches),
            span_seconds=timeline.Span(tasks) if tasks else 0.0)
        if args.timeline_dir and c.num_micro_batches == args.timeline_m:
          path = os.path.join(args.timeline_dir, 'schedule_%s_%s.png' %
                              (name, c.schedule))
          timeline.RenderPNG(
              tasks, '%s %s K=%d v=%d M=%d' % (
                  name, c.schedule, K, c.stages_per_device,
                  c.num_micro_batches), path, by='device')
          record['timeline'] = path
      records.append(record)
    for step in steps:
      step.Close()
    runner.steps = []
    memory_records = []
    for c in memory_configs:
      step = runner.Add(c)
      for _ in range(args.warmup):
        step.Run()
      _, _, peaks = _Traced(step, args.trace_steps)
      memory_records.append(dict(schedule=c.schedule, M=c.num_micro_batches,
                                 peak_bytes=_WorkerPeaks(peaks)))
      step.Close()
      runner.steps = []
  finally:
    runner.Close()
  return records, memory_records


def _Tables(name, records, memory_records):
  """Markdown tables and the headline figures of one model."""
  rows = []
  for r in records:
    if r['K'] != K:
      continue
    rows.append([r['schedule'], r['v'], r['M'], 1e3 * r['seconds'],
                 '%.2fx' % r['speedup'],
                 '%.1f%%' % (100 * r['formula_bubble'])] +
                ['%.1f%%' % (100 * b) for b in r['measured_bubbles']])
  text = '### %s\n\n' % name + report.Table(
      ['schedule', 'v', 'M', 'step ms', 'over K=1 M=1', 'bubble formula'] +
      ['measured d%d' % d for d in range(K)], rows)
  best = {}
  for r in records:
    if r['K'] == K and (r['schedule'] not in best or
                        r['speedup'] > best[r['schedule']]['speedup']):
      best[r['schedule']] = r
  at8 = {r['schedule']: r for r in records if r['K'] == K and r['M'] == 8}
  text += '\n\nBest M per schedule (K=2):\n\n' + report.Table(
      ['schedule', 'best M', 'speed-up', 'speed-up at M=8'],
      [[s, b['M'], '%.2fx' % b['speedup'],
        '%.2fx' % at8[s]['speedup'] if s in at8 else '-']
       for s, b in best.items()])
  headline = dict(best={s: (b['M'], b['speedup']) for s, b in best.items()},
                  at_m8={s: r['speedup'] for s, r in at8.items()})
  if memory_records:
    gpipe = [m for m in memory_records if m['schedule'] == 'gpipe']
    ref = gpipe[0]['peak_bytes'] if gpipe else None
    mem_rows = []
    for m in memory_records:
      ratio = ['%.2f' % (p / q) if ref and q else '-'
               for p, q in zip(m['peak_bytes'], ref or m['peak_bytes'])]
      mem_rows.append([m['schedule'], m['M']] +
                      ['%.1f' % (p / MIB) for p in m['peak_bytes']] + ratio)
      m['ratio_to_gpipe'] = [p / q if ref and q else None
                             for p, q in zip(m['peak_bytes'], ref or [])]
    text += ('\n\nPeak step memory per device, remat=never (activations, '
             'gradients, temporaries; not variables):\n\n') + report.Table(
                 ['schedule', 'M'] + ['d%d MiB' % d for d in range(K)] +
                 ['d%d / gpipe' % d for d in range(K)], mem_rows)
    headline['memory_ratio'] = {
        m['schedule']: m['ratio_to_gpipe'] for m in memory_records}
  return text, headline


def Schedules(args):
  """Every schedule at K=2: speed-up, measured vs formula bubble, memory."""
  models = (throughput.QUICK_THROUGHPUT_MODELS if args.quick else
            throughput.THROUGHPUT_MODELS)
  names = args.models.split(',') if args.models else list(models)
  mbs = [int(m) for m in args.micro_batches.split(',')]
  settings = dict(K=K, stages_per_device=STAGES_PER_DEVICE,
                  micro_batches=mbs, remat=args.remat, steps=args.steps,
                  traced_steps=args.trace_steps, memory_m=args.memory_m,
                  priority=args.priority,
                  workers='2 processes, one pinned core each, 1 intra-op + '
                  '2 inter-op threads',
                  loss='per-example mean(out^2) in the last stage '
                  '(loss_tpl), every schedule')
  header, info = report.Header('Schedules', settings)
  result = dict(machine=info, settings=settings, models={})
  if args.timeline_dir:
    os.makedirs(args.timeline_dir, exist_ok=True)
  texts = []
  for name in names:
    records, memory_records = _RunModel(args, name, models[name], mbs)
    text, headline = _Tables(name, records, memory_records)
    texts.append(text)
    result['models'][name] = dict(configs=records, memory=memory_records,
                                  headline=headline, **models[name])
  text = header + '\n' + '\n\n'.join(texts)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.6),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
      configs = [r for r in result['models'][name]['configs']
                 if r['K'] == K]
      for sched in STAGES_PER_DEVICE:
        rs = [r for r in configs if r['schedule'] == sched]
        if not rs:
          continue
        line, = ax.plot([r['M'] for r in rs],
                        [statistics.mean(r['measured_bubbles']) for r in rs],
                        'o-', label='%s measured' % sched)
        ax.plot([r['M'] for r in rs], [r['formula_bubble'] for r in rs], ':',
                color=line.get_color())
      ax.set_xscale('log', base=2)
      ax.set_xlabel('micro-batches M')
      ax.set_ylabel('idle fraction (mean of 2 devices)')
      ax.set_title('%s, K=2 (dotted: formula)' % name)
      ax.legend(fontsize=7)
    return fig

  report.Write(args, result, Plot)
  return result
