"""The cost subcommand: where a pipeline step's time goes, per micro-batch.

Traces training steps (``RunOptions(trace_level=FULL_TRACE)``) of one
benchmark model at K=1 M=1 and at K stages x M micro-batches, and sums each
worker's traced op time by kind:

  * ``layers``: the layers' own ops inside the stage functions (matmuls,
    activations, their gradients);
  * ``cross-process copies``: ``_Send`` / ``_Recv`` of hand-overs between
    worker processes;
  * ``split / merge``: splitting the batch and concatenating the outputs;
  * ``accumulation``: adds of the micro-batch gradients (and batch-norm
    statistics);
  * ``views / identities``: Identity / IdentityN (theta views, reads);
  * ``casts``: dtype casts (mixed precision);
  * ``call dispatch``: a stage call's span not covered by its inner ops
    (starting the function, handing over its arguments and results);
  * ``other``: everything else (the loss, the SGD update, ...);

and the idle time of each worker over the step. Per-micro-batch figures are
the K x M step's time of a kind minus the K=1 M=1 step's, over M.

A second table gives each worker's time in the stage calls of each task
kind (F, B, W; ``W*`` is the one batched W of a stage) and the number of
calls. With ``--batched_weight_gradients`` (default on) the K x M step is
also run with ``PipeliningLayer.batched_weight_gradients`` beside the
default, so the cut is measured in the same run.

For the dense model in float32 (``--floor``, default on) a last table gives
the kernel floor of each M (``floor.py``): the same work as plain TensorFlow
ops with no pipeline, and the K=2 speed-up ceiling it leaves, beside the
pipeline's own.
"""

import collections
import re
import statistics

from gpipe.schedules import pipeline_tasks
from tools.benchmark import floor as floor_lib
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput

KINDS = ('layers', 'cross-process copies', 'split / merge', 'accumulation',
         'views / identities', 'casts', 'call dispatch', 'other', 'idle')

_COPIES = ('_Send', '_Recv', '_HostSend', '_HostRecv', 'RecvTensor')
_SPLITS = ('Split', 'SplitV', 'Slice', 'StridedSlice', 'ConcatV2', 'Concat',
           'Pack', 'Unpack')
_ADDS = ('AddN', 'AddV2', 'Add')
_IDENTITIES = ('Identity', 'IdentityN')
_CALLS = ('PartitionedCall', 'StatefulPartitionedCall')
_LABEL = re.compile(r'=\s*([A-Za-z0-9_]+)\(')


def _OpType(node):
  m = _LABEL.search(node.timeline_label or '')
  if m:
    return m.group(1)
  return node.node_name.split(':')[0].split('/')[-1]


def _Union(intervals):
  total, end = 0, None
  for s, e in sorted(intervals):
    if end is None or s > end:
      total += e - s
      end = e
    elif e > end:
      total += e - end
      end = e
  return total


def TaskCalls(step_stats):
  """{device: {'F'|'B'|'W'|'W*': [microseconds, calls]}} of a traced step."""
  out = {}
  for dev in step_stats.dev_stats:
    if '/device:CPU' not in dev.device or 'stream' in dev.device:
      continue
    tasks = collections.defaultdict(lambda: [0, 0])
    for n in dev.node_stats:
      task = pipeline_tasks.ParseOpName(n.node_name.split(':')[0])
      if task is None:
        continue
      phase = task.phase + ('*' if pipeline_tasks.IsAll(task.micro_batch)
                            else '')
      tasks[phase][0] += max(n.all_end_rel_micros, 0)
      tasks[phase][1] += 1
    out[dev.device] = dict(tasks)
  return out


def Breakdown(step_stats):
  """{device: {kind: microseconds}} of one traced step (see module doc)."""
  out = {}
  for dev in step_stats.dev_stats:
    if '/device:CPU' not in dev.device or 'stream' in dev.device:
      continue
    kinds = collections.Counter()
    nodes = [(n.all_start_micros, n.all_start_micros +
              max(n.all_end_rel_micros, 0), _OpType(n), n.node_name)
             for n in dev.node_stats]
    if not nodes:
      continue
    calls = [(s, e) for s, e, t, _ in nodes if t in _CALLS]
    inner_all = []
    for s, e, t, name in nodes:
      if t in _CALLS or name == '_SOURCE':
        continue
      inside = any(cs <= s and e <= ce for cs, ce in calls)
      if inside:
        inner_all.append((s, e))
      d = e - s
      if t in _COPIES:
        kinds['cross-process copies'] += d
      elif t in _SPLITS and not inside:
        kinds['split / merge'] += d
      elif t in _ADDS and not inside:
        kinds['accumulation'] += d
      elif t in _IDENTITIES:
        kinds['views / identities'] += d
      elif t == 'Cast':
        kinds['casts'] += d
      elif inside:
        kinds['layers'] += d
      else:
        kinds['other'] += d
    for cs, ce in calls:
      covered = _Union([(max(s, cs), min(e, ce)) for s, e in inner_all
                        if s < ce and e > cs])
      kinds['call dispatch'] += max(0, (ce - cs) - covered)
    span = (max(e for _, e, _, _ in nodes) -
            min(s for s, _, _, _ in nodes))
    busy = _Union([(s, e) for s, e, _, _ in nodes])
    kinds['idle'] += max(0, span - busy)
    out[dev.device] = kinds
  return out


def _Median(breakdowns):
  """Per device and kind, the median over steps (ms)."""
  devices = sorted(set(d for b in breakdowns for d in b))
  return {d: {k: statistics.median(b.get(d, {}).get(k, 0)
                                   for b in breakdowns) / 1e3
              for k in KINDS} for d in devices}


def Cost(args):
  """Per-micro-batch cost of a pipeline step, from traces."""
  shapes = (throughput.QUICK_THROUGHPUT_MODELS if args.quick else
            throughput.THROUGHPUT_MODELS)
  shape = shapes[args.model]
  mbs = [int(m) for m in str(args.micro_batches).split(',')]
  settings = dict(model=args.model, K=args.num_stages, M=mbs, remat=args.remat,
                  fprop_dtype=args.fprop_dtype, steps=args.steps,
                  warmup=args.warmup)
  header, info = report.Header('Per-micro-batch cost', settings)
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
  configs = [(1, 1, False)]
  for m in mbs:
    configs.append((args.num_stages, m, False))
    if args.batched_weight_gradients:
      configs.append((args.num_stages, m, True))
  result = dict(machine=info, settings=settings, configs=[])
  sections = []
  try:
    steps = [runner.Add(runner_lib.Config(
        'gpipe', args.model, shape['num_layers'], shape['batch'], k, mb,
        args.remat, shape['width'], fprop_dtype=args.fprop_dtype,
        batched_weights=batched)) for k, mb, batched in configs]
    # Untimed warm-up, then timed rounds interleaved (the same load on all).
    times = runner.TimeInterleaved(steps, args.steps, warmup=args.warmup)
    for (k, mb, batched), step in zip(configs, steps):
      traced = [step.Run(trace=True) for _ in range(args.steps)]
      med = _Median([Breakdown(md.step_stats) for _, md in traced])
      calls = TaskCalls(traced[len(traced) // 2][1].step_stats)
      rec = dict(K=k, M=mb, batched_weights=batched,
                 step_seconds=times[step.config.label],
                 traced_step_seconds=statistics.median(t for t, _ in traced),
                 breakdown_ms=med,
                 task_calls={d: {ph: [v[0] / 1e3, v[1]] for ph, v in c.items()}
                             for d, c in calls.items()})
      result['configs'].append(rec)
      rows = [[d.split('/job:')[-1]] + ['%.1f' % med[d][kind] for kind in KINDS]
              for d in med]
      task_rows = [[d.split('/job:')[-1]] + [
          '%.1f (%d)' % tuple(rec['task_calls'][d].get(ph, [0, 0]))
          for ph in ('F', 'B', 'W', 'W*')] for d in rec['task_calls']]
      sections.append(
          '### %s: %.0f ms per step (untraced median; traced %.0f ms)'
          '\n\n' % (step.config.label, 1e3 * rec['step_seconds'],
                    1e3 * rec['traced_step_seconds']) +
          report.Table(['worker'] + ['%s ms' % kind for kind in KINDS],
                       rows) + '\n\nStage calls, ms (calls):\n\n' +
          report.Table(['worker', 'F', 'B', 'W', 'W*'], task_rows))
  finally:
    runner.Close()
  base = result['configs'][0]
  # Per micro-batch: the extra time of a kind on all workers over M.
  rows = []
  per_mb = []
  for piped in result['configs'][1:]:
    per_mb.append({
        kind: max(sum(piped['breakdown_ms'][d][kind]
                      for d in piped['breakdown_ms']) -
                  sum(base['breakdown_ms'][d][kind]
                      for d in base['breakdown_ms']), 0.0) / piped['M']
        for kind in KINDS})
    piped['added_per_micro_batch_ms'] = per_mb[-1]
    piped['speedup_vs_K1M1'] = base['step_seconds'] / piped['step_seconds']
  for kind in KINDS:
    rows.append([kind] + ['%.2f' % p[kind] for p in per_mb])
  result['per_micro_batch_ms'] = per_mb[0]
  speedups = ', '.join(
      '%s %.2fx' % (steps[i].config.label,
                    result['configs'][i]['speedup_vs_K1M1'])
      for i in range(1, len(configs)))
  text = header + '\n' + '\n\n'.join(sections) + (
      '\n\n### Added per micro-batch (all workers, K=%d x M minus K=1 M=1, '
      'over M)\n\n' % args.num_stages) + report.Table(
          ['kind'] + ['M=%d%s' % (m, ' batched W' if b else '')
                      for _, m, b in configs[1:]], rows) + (
              '\n\nSpeed-up over K=1 M=1 (untraced, interleaved): %s.'
              % speedups)
  if getattr(args, 'floor', False):
    text += '\n\n' + _FloorSection(args, shape, mbs, result)
  print(text)
  result['markdown'] = text
  report.Write(args, result, None)
  return result


def _FloorSection(args, shape, mbs, result):
  """Measures the kernel floor (dense, float32) and returns its table."""
  if (args.model != 'dense' or args.fprop_dtype != 'float32' or
      args.num_stages != 2):
    return ('(Kernel floor: measured for the dense model in float32 at K=2 '
            'only; this run is %s in %s at K=%d.)' % (
                args.model, args.fprop_dtype, args.num_stages))
  fl = floor_lib.Floor(shape['num_layers'], shape['batch'], shape['width'],
                       mbs, steps=args.steps, warmup=args.warmup,
                       log=report.Log)
  result['floor'] = fl
  piped = {}
  for c in result['configs'][1:]:
    piped.setdefault(c['M'], {})[c['batched_weights']] = c['speedup_vs_K1M1']
  rows = []
  for rec in fl['M']:
    got = piped.get(rec['M'], {})
    rows.append(['%d' % rec['M']] + ['%.0f' % rec[k] for k in (
        'stage_alone_ms', 'stage_both_ms', 'weights_alone_ms', 'bubble_ms',
        'floor_step_ms')] + ['**%.2fx**' % rec['ceiling']] + [
            '%.2fx' % got[b] if b in got else '-' for b in (False, True)])
  return ('### Kernel floor: each stage\'s work as plain TensorFlow ops, no '
          'pipeline (K=1 M=1 the same way: %.0f ms)\n\n' % fl['K1M1_ms'] +
          report.Table(
              ['M', 'stage alone ms', 'stage, both at once ms', 'W alone ms',
               'bubble ms', 'floor step ms', 'K=2 ceiling',
               'pipeline', 'pipeline batched W'], rows) +
          '\n\nCeiling: K=1 M=1 over (stage both at once + bubble); bubble: '
          '(stage alone - W alone) / M, one micro-batch\'s F and B '
          '(tools/benchmark/floor.py). Pipeline: speed-up over its own K=1 '
          'M=1 measured above.')
