r"""GPipe's Tables 1-3 at this machine's scale, beside Lingvo's GPipe.

Usage (from the repository root; or ``bazel run //tools:benchmark -- ...``)::

  .venv/bin/python -m tools.benchmark throughput --json t.json --plot t.png
  .venv/bin/python -m tools.benchmark memory --json m.json --plot m.png
  .venv/bin/python -m tools.benchmark bubble --json b.json --plot b.png
  .venv/bin/python -m tools.benchmark graph --json g.json --plot g.png

Subcommands:

  throughput  Training steps/s of a Transformer stack and an AmoebaNet-D-like
              stack for K in {1, 2} stages (one pinned one-core worker
              process each) and M micro-batches, normalized to K=1, M=1 with
              the same remat mode (like the paper's Table 2); beside it, on
              the same layers, K, M and cores, Lingvo's GPipe (one process
              with K virtual CPUs, all cores' threads) and plain TensorFlow
              (no pipeline, all cores). Also ours with v > 1 stages per
              device (2v stages looped over the 2 workers, breadth-first).
              All configurations are timed interleaved in one run.
  memory      Table 1: under one per-device memory cap, the most layers of
              each model that take a training step as naive-1 (no pipeline,
              no remat), pipeline-1 (remat, M micro-batches) and pipeline-2,
              from the measured peak memory of traced steps.
  bubble      Measured idle fraction of each stage (execution traces) vs the
              fill-drain model (K-1)/(M+K-1), and a timeline picture.
  graph       Graph build time and op count as M and L grow (no session).

Every subcommand prints a markdown table, the machine and the settings, and
writes ``--json`` and ``--plot`` if given. ``--quick`` runs a tiny version
(for tests). ``--priority N`` raises the worker processes' scheduling
priority (Linux autogroup niceness -N; root): on a machine shared with other
work, pipelined stages otherwise get only part of their cores.
"""

import argparse
import json
import os
import statistics
import sys
import time

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import memory
from gpipe import param_count
from gpipe import pipeline
from gpipe import schedule
from gpipe import timeline
from lingvo import compat as tf
from tools import bench_models
from tools import bench_runner

MIB = float(1 << 20)

# Model shapes at this machine's scale (per subcommand; --quick shrinks).
THROUGHPUT_MODELS = {
    'transformer': dict(num_layers=8, batch=64, width=256),
    'amoeba': dict(num_layers=8, batch=128, width=64),
}
QUICK_THROUGHPUT_MODELS = {
    'transformer': dict(num_layers=4, batch=4, width=64),
    'amoeba': dict(num_layers=4, batch=4, width=8),
}


def _Log(*args):
  print(*args, file=sys.stderr, flush=True)


def _Table(header, rows):
  """A markdown table from a header and rows of strings/numbers."""
  def Cell(v):
    if isinstance(v, float):
      return '%.3g' % v if abs(v) < 100 else '%.0f' % v
    return str(v)
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(Cell(v) for v in row) + ' |')
  return '\n'.join(lines)


def _Header(args, title, settings):
  info = bench_runner.MachineInfo()
  lines = ['## %s' % title, '',
           'Machine: %s, %s cores, %s; TensorFlow %s, oneDNN %s; load average '
           'at start %s.' % (info.get('cpu_model', '?'), info['cpus'],
                             info['platform'], info['tensorflow'],
                             info['onednn'], ', '.join(
                                 '%.1f' % v for v in info.get(
                                     'load_average', []))),
           'Settings: %s.' % ', '.join('%s=%s' % kv for kv in settings.items()),
           'Command: `%s`' % ' '.join(['python -m tools.benchmark'] +
                                      sys.argv[1:]), '']
  return '\n'.join(lines), info


def _Write(args, result, plot_fn):
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1, sort_keys=True)
  if args.plot:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
    fig = plot_fn(plt)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=90)
    plt.close(fig)


def _Runner(args):
  runner = bench_runner.Runner(priority=args.priority, log=_Log)
  return runner


# ---------------------------------------------------------------- throughput


def Throughput(args):
  """Steps/s vs K and M, ours beside Lingvo's GPipe and plain TF."""
  models = QUICK_THROUGHPUT_MODELS if args.quick else THROUGHPUT_MODELS
  names = args.models.split(',') if args.models else list(models)
  mbs = [int(m) for m in args.micro_batches.split(',')]
  lingvo_mbs = [int(m) for m in (args.lingvo_micro_batches or
                                 args.micro_batches).split(',')]
  loops = [int(v) for v in args.stages_per_device.split(',')]
  loop_mbs = [int(m) for m in args.loop_micro_batches.split(',')]
  settings = dict(remat=args.remat, micro_batches=mbs, steps=args.steps,
                  stages_per_device=loops, loop_micro_batches=loop_mbs,
                  warmup=args.warmup, priority=args.priority,
                  gpipe_workers='K processes, one pinned core each, '
                  '1 intra-op + 2 inter-op threads',
                  lingvo='1 process, K virtual CPUs, %d+%d threads' %
                  (bench_runner.ALL_CORES, bench_runner.ALL_CORES),
                  plain='1 process, %d+%d threads' %
                  (bench_runner.ALL_CORES, bench_runner.ALL_CORES))
  header, info = _Header(args, 'Throughput', settings)
  result = dict(machine=info, settings=settings, models={})
  tables = []
  for name in names:
    shape = models[name]
    r = args.remat
    configs = [('gpipe', 1, 1, 1, r), ('gpipe', 1, max(mbs), 1, r)]
    configs += [('gpipe', 2, m, 1, r) for m in mbs]
    configs += [('gpipe', 2, m, v, r) for v in loops for m in loop_mbs
                if v > 1 and v * 2 <= shape['num_layers']]
    configs += [('lingvo', 1, 1, 1, r)] + [('lingvo', 2, m, 1, r)
                                           for m in lingvo_mbs]
    configs += [('plain', 1, 1, 1, 'never')]
    # The pipeline's own per-micro-batch cost: ours at K=1 without remat vs
    # the same micro-batches as inline ops, both on one pinned core.
    configs += [(impl, 1, m, 1, 'never') for impl in ('gpipe', 'inline')
                for m in (1, max(mbs))]
    configs = list(dict.fromkeys(configs))  # remat='never' repeats some
    runner = _Runner(args)
    try:
      steps = []
      for impl, k, m, v, remat in configs:
        if shape['batch'] % m:
          continue
        steps.append(runner.Add(bench_runner.Config(
            impl, name, shape['num_layers'], shape['batch'], k, m, remat,
            shape['width'], v)))
      medians = runner.TimeInterleaved(steps, args.steps, args.warmup)
    finally:
      runner.Close()
    base = {impl: medians.get(bench_runner.Config(
        impl, name, shape['num_layers'], shape['batch'], 1, 1, args.remat,
        shape['width']).label) for impl in ('gpipe', 'lingvo')}
    rows, records = [], []
    for step in steps:
      c = step.config
      t = medians[c.label]
      ref = base['gpipe']
      v, m = c.stages_per_device, c.num_micro_batches
      rows.append([c.impl, c.num_stages, v, m, c.remat,
                   1e3 * t, c.batch / t, ref / t,
                   '%.2f' % (2.0 * v * m / (v * m + 1))
                   if c.num_stages == 2 and c.impl != 'plain' else ''])
      records.append(dict(impl=c.impl, K=c.num_stages, M=m, v=v,
                          remat=c.remat, step_seconds=t,
                          all_step_seconds=step.times,
                          examples_per_second=c.batch / t,
                          speedup_vs_gpipe_K1M1=ref / t))
    ours = {(r['K'], r['M'], r['v']): r['step_seconds'] for r in records
            if r['impl'] == 'gpipe' and r['remat'] == args.remat}
    never = {(r['impl'], r['M']): r['step_seconds'] for r in records
             if r['remat'] == 'never' and r['impl'] in ('gpipe', 'inline')}
    mx = max(mbs)
    lingvo = {(r['K'], r['M']): r['step_seconds'] for r in records
              if r['impl'] == 'lingvo'}
    k2 = {m: ours[(1, 1, 1)] / ours[(2, m, 1)] for m in mbs
          if (2, m, 1) in ours}
    best_m = max(k2, key=k2.get) if k2 else None
    m8 = {v: ours[(2, 8, v)] for k, m, v in ours if k == 2 and m == 8}
    lm = 8 if 8 in loop_mbs else loop_mbs[0]
    looped = {v: ours[(2, lm, v)] for k, m, v in ours
              if k == 2 and m == lm and v > 1}
    best_v = min(looped, key=looped.get) if looped else None
    headline = dict(
        speedup_K2_M8=k2.get(8),
        best_M=best_m,
        speedup_best_M=k2.get(best_m),
        ours_over_lingvo_K2_M8=(lingvo[(2, 8)] / m8[1]
                                if (2, 8) in lingvo and 1 in m8 else None),
        looping_M=lm,
        looping_best_v=best_v,
        looping_speedup_K2=(ours[(1, 1, 1)] / looped[best_v]
                            if best_v else None),
        looping_ours_over_lingvo_K2=(lingvo[(2, lm)] / looped[best_v]
                                     if (2, lm) in lingvo and best_v
                                     else None),
        lingvo_K2_M8_over_ours_K1M1=(ours[(1, 1, 1)] / lingvo[(2, 8)]
                                     if (2, 8) in lingvo else None),
        micro_batch_overhead_M=mx,
        micro_batch_overhead_fraction=(
            1.0 - ours[(1, 1, 1)] / ours[(1, mx, 1)]
            if (1, mx, 1) in ours else None),
        # Without remat: inline ops over M micro-batches vs over one (what
        # TensorFlow pays for smaller tensors, whoever splits the batch) ...
        inline_micro_batch_cost_fraction=(
            1.0 - never[('inline', 1)] / never[('inline', mx)]
            if ('inline', mx) in never and ('inline', 1) in never else None),
        # ... and ours vs inline at M (the pipeline's own calls, splits and
        # gradient accumulation), as a fraction of our step.
        pipeline_overhead_fraction=(
            1.0 - never[('inline', mx)] / never[('gpipe', mx)]
            if ('inline', mx) in never and ('gpipe', mx) in never else None))
    result['models'][name] = dict(shape=shape, configs=records,
                                  headline=headline)
    tables.append('### %s (L=%d, batch=%d, width=%d)\n\n' % (
        name, shape['num_layers'], shape['batch'], shape['width']) + _Table(
            ['impl', 'K devices', 'v stages/device', 'M', 'remat', 'step ms',
             'examples/s', 'speed-up vs ours K=1 M=1',
             'fill-drain ceiling 2vM/(vM+1)'], rows) +
                  '\n\n' + _HeadlineText(headline))
  text = header + '\n' + '\n\n'.join(tables)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
      recs = result['models'][name]['configs']
      base_t = [r for r in recs if r['impl'] == 'gpipe' and r['K'] == 1 and
                r['M'] == 1 and r['remat'] == args.remat][0]['step_seconds']
      for impl, style in (('gpipe', 'o-'), ('lingvo', 's--')):
        pts = sorted((r['M'], base_t / r['step_seconds']) for r in recs
                     if r['impl'] == impl and r['K'] == 2 and r['v'] == 1)
        if pts:
          ax.plot([p[0] for p in pts], [p[1] for p in pts], style,
                  label='%s K=2' % ('ours' if impl == 'gpipe' else 'Lingvo'))
      for v, marker in zip(sorted({r['v'] for r in recs if r['v'] > 1}),
                           '^v*Dp'):
        pts = sorted((r['M'], base_t / r['step_seconds']) for r in recs
                     if r['impl'] == 'gpipe' and r['v'] == v)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker,
                markersize=9, label='ours K=2, v=%d stages per device' % v)
      ms = sorted({r['M'] for r in recs if r['K'] == 2})
      ax.plot(ms, [2.0 * m / (m + 1) for m in ms], ':', color='gray',
              label='fill-drain ceiling 2M/(M+1)')
      plain = [r for r in recs if r['impl'] == 'plain']
      if plain:
        ax.axhline(base_t / plain[0]['step_seconds'], color='green',
                   linestyle='-.', label='plain TF, 2 cores')
      ax.axhline(1.0, color='black', linewidth=0.5)
      ax.set_xscale('log', base=2)
      ax.set_xlabel('micro-batches M')
      ax.set_ylabel('speed-up over ours K=1 M=1')
      ax.set_title(name)
      ax.legend(fontsize=7)
    return fig

  _Write(args, result, Plot)
  return result


def _HeadlineText(h):
  def F(v, fmt='%.2fx'):
    return fmt % v if v is not None else 'n/a'
  text = ('Headline: K=2 M=8 speed-up %s; best M=%s %s; ours / Lingvo at K=2 '
          'M=8 %s; micro-batching overhead at K=1 M=%d: %s of the step.' %
          (F(h['speedup_K2_M8']), h['best_M'], F(h['speedup_best_M']),
           F(h['ours_over_lingvo_K2_M8']), h['micro_batch_overhead_M'],
           F(None if h['micro_batch_overhead_fraction'] is None else
             100 * h['micro_batch_overhead_fraction'], '%.0f%%')))
  if h.get('pipeline_overhead_fraction') is not None:
    own = 100 * h['pipeline_overhead_fraction']
    text += (' Of that, without remat on one core: the same %d micro-batches '
             'as inline ops cost %s more than one batch (TensorFlow on '
             'smaller tensors), and %s' %
             (h['micro_batch_overhead_M'],
              F(100 * h['inline_micro_batch_cost_fraction'], '%.0f%%'),
              ('our pipeline adds %.0f%% of its step on top (stage calls, '
               'splits, gradient accumulation).' % own) if own >= 0 else
              ('our pipeline runs them %.0f%% faster than the inline ops '
               '(its stage functions are optimized as units).' % -own)))
  if h.get('looping_best_v'):
    text += (' With v=%d stages per device (looping, breadth-first) at K=2 '
             'M=%d: speed-up %s, ours / Lingvo %s.' %
             (h['looping_best_v'], h['looping_M'],
              F(h['looping_speedup_K2']),
              F(h['looping_ours_over_lingvo_K2'])))
  if h.get('lingvo_K2_M8_over_ours_K1M1'):
    text += (" Lingvo's GPipe at K=2 M=8 on both cores runs %s as fast as "
             'ours on one core, so one stage per device (ceiling 1.78x at '
             'M=8) can beat it by at most %s.' %
             (F(h['lingvo_K2_M8_over_ours_K1M1']),
              F(16.0 / 9 / h['lingvo_K2_M8_over_ours_K1M1'])))
  return text


# -------------------------------------------------------------------- memory

MEMORY_MODELS = {
    'transformer': dict(batch=64, width=128),
    'amoeba': dict(batch=32, width=64),
}
QUICK_MEMORY_MODELS = {
    'transformer': dict(batch=4, width=32),
    'amoeba': dict(batch=4, width=8),
}
MEMORY_MODES = (
    # name, impl, K, M, remat
    ('naive-1', 'plain', 1, 1, 'never'),
    ('pipeline-1', 'gpipe', 1, 8, 'always'),
    ('pipeline-2', 'gpipe', 2, 8, 'always'),
)


def _MeasurePeak(args, config, cache):
  """Peak bytes (max over devices) of one traced training step.

  Each size gets fresh worker processes: a TensorFlow process keeps much of
  the memory of the graphs it ran, and a sweep of big graphs in the same
  workers outgrows this machine's RAM.
  """
  if config in cache:
    return cache[config]
  runner = _Runner(args)
  try:
    step = runner.Add(config)
    step.Run()
    _, metadata = step.Run(trace=True)
    step_peak = memory.MaxOverDevices(memory.PeakBytesPerDevice(metadata))
    total_peak = memory.MaxOverDevices(
        memory.PeakAllocatorBytesPerDevice(metadata))
  finally:
    runner.Close()
  params = sum(
      param_count.CountParams(lp) for lp in bench_models.ModelLayers(
          config.model, config.num_layers, config.width))
  # Per device: parameters + their gradients (SGD keeps no slots); the
  # pipeline's stages hold about 1/K of them each.
  param_bytes = 4 * params / config.num_stages
  cache[config] = dict(
      num_layers=config.num_layers, params=params,
      param_bytes_per_device=param_bytes, step_peak_bytes=step_peak,
      allocator_peak_bytes=total_peak,
      fits_bytes=param_bytes + step_peak)
  _Log('  %s L=%d: params %.1f MiB/device, step peak %.1f MiB' %
       (config.label, config.num_layers, param_bytes / MIB, step_peak / MIB))
  return cache[config]


def LargestFitting(measure, cap_bytes, max_layers, step_size,
                   max_measurements=12):
  """The most layers (a multiple of `step_size`) whose cost fits `cap_bytes`.

  Brackets the answer between the largest size known to fit and the smallest
  known not to, and shrinks the bracket by secant steps through the two
  nearest measurements (memory is close to linear in L, but its slope at small
  L is not the slope at large L), falling back to bisection when a secant step
  would not land strictly inside. Every probe is a real measurement.

  Args:
    measure: layers -> bytes, assumed non-decreasing in layers.
    cap_bytes: the cap.
    max_layers: the largest size tried.
    step_size: sizes are multiples of this (e.g. the number of stages).
    max_measurements: give up (ValueError) after this many probes.

  Returns:
    (largest fitting size or None, smallest non-fitting size or None if
    `max_layers` fits).
  """
  def Align(layers):
    return max(step_size, min(top, layers - layers % step_size))

  top = max_layers - max_layers % step_size
  if top < step_size:
    raise ValueError('max_layers=%d is below the smallest size %d; raise '
                     '--max_layers' % (max_layers, step_size))
  points = {}
  def Probe(layers):
    if layers not in points:
      if len(points) >= max_measurements:
        raise ValueError('no answer after %d measurements: %s' %
                         (max_measurements, sorted(points.items())))
      points[layers] = measure(layers)
    return points[layers] <= cap_bytes

  if not Probe(step_size):
    return None, step_size
  fit, over, below = step_size, None, None
  probe = Align(2 * step_size)
  while over is None or over - fit > step_size:
    upper = over if over is not None else top + step_size
    if not fit < probe < upper:
      probe = Align((fit + upper) // 2)
    if Probe(probe):
      fit, below = probe, fit
      if fit == top:
        return fit, None
    else:
      over = probe
    # Secant through the nearest measurement on each side of the cap (or the
    # last two that fit, before anything has failed).
    other = over if over is not None else below
    slope = (points[other] - points[fit]) / (other - fit)
    probe = Align(fit + int((cap_bytes - points[fit]) / max(slope, 1.0)))
    if probe == fit:
      probe += step_size
  return fit, over


def MemoryPlot(plt, result):
  """Bars of the largest L per mode and model, from a `Memory` result."""
  names = list(result['models'])
  fig, ax = plt.subplots(figsize=(6, 3.4))
  modes = [m[0] for m in MEMORY_MODES]
  width = 0.8 / len(names)
  for i, name in enumerate(names):
    runs = [result['models'][name][m] for m in modes]
    vals = [(r['fit'] or {}).get('num_layers', 0) for r in runs]
    # '+': the largest size tried still fitted (the sweep's --max_layers).
    labels = ['%d%s' % (v, '+' if r['fit'] and not r['first_not_fitting']
                        else '') for v, r in zip(vals, runs)]
    xs = [j + i * width for j in range(len(modes))]
    ax.bar(xs, vals, width, label=name)
    for x, v, label in zip(xs, vals, labels):
      ax.text(x, v, label, ha='center', va='bottom', fontsize=8)
  ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(modes))])
  ax.set_xticklabels(modes)
  ax.set_ylabel('largest L under %d MiB/device' %
                result['settings']['cap_mib'])
  ax.legend(fontsize=8)
  return fig


def Memory(args):
  """Table 1: the largest model per mode under one per-device cap."""
  models = QUICK_MEMORY_MODELS if args.quick else MEMORY_MODELS
  names = args.models.split(',') if args.models else list(models)
  cap = args.cap_mib * MIB
  settings = dict(cap_mib=args.cap_mib, modes=[m[0] for m in MEMORY_MODES],
                  micro_batches=args.micro_batches, priority=args.priority,
                  fits='parameters + measured peak step memory <= cap')
  header, info = _Header(args, 'Memory', settings)
  result = dict(machine=info, settings=settings, models={})
  rows = []
  for name in names:
    shape = models[name]
    result['models'][name] = {}
    for mode, impl, k, m, remat in MEMORY_MODES:
      m = args.micro_batches if impl == 'gpipe' else m
      def Make(layers, impl=impl, k=k, m=m, remat=remat, shape=shape):
        return bench_runner.Config(impl, name, layers, shape['batch'], k,
                                   m, remat, shape['width'])
      _Log('%s %s:' % (name, mode))
      cache = {}
      best, over = LargestFitting(
          lambda layers: _MeasurePeak(args, Make(layers), cache)['fits_bytes'],
          cap, args.max_layers, k)
      fit = cache[Make(best)] if best else None
      above = cache[Make(over)] if over else None
      result['models'][name][mode] = dict(fit=fit, first_not_fitting=above)
      if fit:
        rows.append([name, mode, fit['num_layers'], fit['params'] / 1e6,
                     fit['param_bytes_per_device'] / MIB,
                     fit['step_peak_bytes'] / MIB,
                     fit['fits_bytes'] / MIB,
                     above['num_layers'] if above else '> %d' %
                     args.max_layers])
      else:
        rows.append([name, mode, 0, '', '', '', '', ''])
  ratios = {}
  for name in names:
    r = result['models'][name]
    if r['naive-1']['fit'] and r['pipeline-1']['fit']:
      ratios[name] = (r['pipeline-1']['fit']['num_layers'] /
                      r['naive-1']['fit']['num_layers'])
  result['pipeline1_over_naive1_layers'] = ratios
  text = header + '\n' + _Table(
      ['model', 'mode', 'max layers', 'params (M)', 'param MiB/device',
       'peak step MiB/device', 'total MiB/device', 'first L over cap'],
      rows) + '\n\nHeadline: pipeline-1 fits %s the layers of naive-1.' % (
          ', '.join('%s %s%.1fx' % (
              name, '>= ' if not result['models'][name]['pipeline-1'][
                  'first_not_fitting'] else '', ratio)
                    for name, ratio in ratios.items()) or 'n/a')
  print(text)
  result['markdown'] = text

  _Write(args, result, lambda plt: MemoryPlot(plt, result))
  return result


# -------------------------------------------------------------------- bubble


_BUBBLE_MODEL = '(K-1)/(vM+K-1) for M >= K'


def Bubble(args):
  """Measured per-stage idle fraction vs ``schedule.LoopedBubbleFraction``."""
  shape = (QUICK_THROUGHPUT_MODELS if args.quick else
           THROUGHPUT_MODELS)[args.model]
  mbs = [int(m) for m in args.micro_batches.split(',')]
  k = 2
  v = args.stages_per_device
  by = 'device' if v > 1 else 'stage'
  settings = dict(model=args.model, K=k, stages_per_device=v,
                  micro_batches=mbs, remat=args.remat,
                  priority=args.priority, traced_steps=args.steps, **shape)
  header, info = _Header(args, 'Bubble', settings)
  result = dict(machine=info, settings=settings, configs=[])
  rows = []
  runner = _Runner(args)
  try:
    steps = [runner.Add(bench_runner.Config(
        'gpipe', args.model, shape['num_layers'], shape['batch'], k, m,
        args.remat, shape['width'], v)) for m in mbs
             if shape['batch'] % m == 0]
    for step in steps:
      for _ in range(args.warmup):
        step.Run()
    for step in steps:
      runs = []
      for _ in range(args.steps):
        seconds, metadata = step.Run(trace=True)
        tasks = timeline.ParseStepStats(metadata.step_stats)
        runs.append((timeline.BubbleFractions(tasks, by), tasks, seconds))
      # The median step by mean bubble.
      runs.sort(key=lambda r: statistics.mean(r[0]))
      bubbles, tasks, seconds = runs[len(runs) // 2]
      c = step.config
      # D devices, v stages each, fill-drain with breadth-first looping:
      # (D-1)/(vM+D-1) once M >= D.
      model = schedule.LoopedBubbleFraction(k, v, c.num_micro_batches)
      busy = timeline.StageBusySeconds(tasks, by)
      rows.append([c.num_micro_batches, '%.1f%%' % (100 * model)] +
                  ['%.1f%%' % (100 * b) for b in bubbles] +
                  [1e3 * timeline.Span(tasks)] + [1e3 * b for b in busy])
      result['configs'].append(dict(
          M=c.num_micro_batches, model_bubble=model, measured_bubbles=bubbles,
          span_seconds=timeline.Span(tasks), busy_seconds=busy,
          tasks=[t._asdict() for t in tasks]))
      if args.timeline and c.num_micro_batches == args.timeline_m:
        timeline.RenderPNG(
            tasks, '%s K=%d%s M=%d remat=%s' % (
                args.model, k, ' v=%d' % v if v > 1 else '',
                c.num_micro_batches, args.remat), args.timeline, by=by)
  finally:
    runner.Close()
  text = header + '\n' + _Table(
      ['M', 'model %s' % _BUBBLE_MODEL] + ['measured %s %d' % (by, i)
                                        for i in range(k)] +
      ['span ms'] + ['busy ms %s %d' % (by, i) for i in range(k)], rows)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ms = [c['M'] for c in result['configs']]
    ax.plot(ms, [c['model_bubble'] for c in result['configs']], 'k:',
            label='model %s, v=%d' % (_BUBBLE_MODEL, v))
    for i in range(k):
      ax.plot(ms, [c['measured_bubbles'][i] for c in result['configs']],
              'o-', label='measured %s %d' % (by, i))
    ax.set_xscale('log', base=2)
    ax.set_xlabel('micro-batches M')
    ax.set_ylabel('idle fraction of the pipeline span')
    ax.set_title('bubble, %s, K=%d' % (args.model, k))
    ax.legend(fontsize=8)
    return fig

  _Write(args, result, Plot)
  return result


# --------------------------------------------------------------------- graph


def _BuildSeconds(num_layers, num_stages, num_micro_batches, width=64,
                  batch=None):
  """Builds FProp + gradients of a pipeline graph; (seconds, ops)."""
  batch = batch or 2 * num_micro_batches
  graph = tf.Graph()
  start = time.time()
  with graph.as_default():
    net = pipeline.PipeliningLayer.Params().Set(
        name='pipe', num_stages=num_stages, partition_cost='uniform',
        num_micro_batches=num_micro_batches,
        layers=bench_models.ModelLayers('dense', num_layers, width),
        stage_devices=['/job:worker/replica:0/task:%d/device:CPU:0' % k
                       for k in range(num_stages)]).Instantiate()
    x = tf.zeros([batch, width])
    loss = tf.reduce_sum(net.FProp(net.theta, x))
    tf.gradients(loss, net.vars.Flatten(), colocate_gradients_with_ops=True)
  return time.time() - start, len(graph.get_operations())


def Graph(args):
  """Build time and op count vs M and L."""
  if args.quick:
    m_sweep, l_sweep, big = [1, 2, 4], [4, 8], (8, 4, 4)
  else:
    m_sweep = [1, 2, 4, 8, 16, 32, 64]
    l_sweep = [8, 16, 32, 64, 128]
    big = (128, 16, 32)
  k, base_l, base_m = 4, 16 if not args.quick else 4, 8 if not args.quick else 2
  settings = dict(K=k, layers_for_M_sweep=base_l, M_for_L_sweep=base_m,
                  layer='dense 64 wide', big=dict(L=big[0], K=big[1],
                                                  M=big[2]))
  header, info = _Header(args, 'Graph size', settings)
  result = dict(machine=info, settings=settings, M_sweep=[], L_sweep=[])
  rows = []
  _BuildSeconds(4, 2, 2)  # warm up imports and tracing machinery
  for m in m_sweep:
    seconds, ops = _BuildSeconds(base_l, k, m)
    result['M_sweep'].append(dict(L=base_l, K=k, M=m, seconds=seconds,
                                  ops=ops))
    rows.append(['M sweep', base_l, k, m, seconds, ops])
  for layers in l_sweep:
    seconds, ops = _BuildSeconds(layers, k, base_m)
    result['L_sweep'].append(dict(L=layers, K=k, M=base_m, seconds=seconds,
                                  ops=ops))
    rows.append(['L sweep', layers, k, base_m, seconds, ops])
  seconds, ops = _BuildSeconds(*big)
  result['big'] = dict(L=big[0], K=big[1], M=big[2], seconds=seconds, ops=ops)
  rows.append(['large', big[0], big[1], big[2], seconds, ops])

  def Slope(points, key):
    """Least-squares ops per unit of `key`, and the worst ops per unit."""
    xs = [p[key] for p in points]
    ys = [p['ops'] for p in points]
    mean_x, mean_y = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x)**2 for x in xs)
    return slope

  result['ops_per_micro_batch'] = Slope(result['M_sweep'], 'M')
  result['ops_per_layer'] = Slope(result['L_sweep'], 'L')
  # Linearity: time per op should not grow with the graph.
  per_op = [p['seconds'] / p['ops'] for p in result['M_sweep'] +
            result['L_sweep']]
  result['max_over_min_seconds_per_op'] = max(per_op) / min(per_op)
  text = header + '\n' + _Table(
      ['sweep', 'L', 'K', 'M', 'build s', 'ops'], rows) + (
          '\n\nOps grow by %.0f per micro-batch and %.0f per layer (least '
          'squares); seconds per op vary %.2fx across the sweeps (1.0 = '
          'exactly linear). L=%d, K=%d, M=%d builds in %.1f s.' %
          (result['ops_per_micro_batch'], result['ops_per_layer'],
           result['max_over_min_seconds_per_op'], big[0], big[1], big[2],
           seconds))
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, sweep, fixed in (
        (axes[0], 'M', result['M_sweep'], 'L=%d' % base_l),
        (axes[1], 'L', result['L_sweep'], 'M=%d' % base_m)):
      xs = [p[key] for p in sweep]
      ax.plot(xs, [p['seconds'] for p in sweep], 'o-', label='build seconds')
      ax.set_xlabel(key)
      ax.set_ylabel('build seconds')
      ax2 = ax.twinx()
      ax2.plot(xs, [p['ops'] for p in sweep], 's--', color='C1', label='ops')
      ax2.set_ylabel('ops')
      ax.set_title('K=%d, %s' % (k, fixed))
      ax.legend(loc='upper left', fontsize=8)
      ax2.legend(loc='lower right', fontsize=8)
    return fig

  _Write(args, result, Plot)
  return result


# ---------------------------------------------------------------------- main


def _Parser():
  parser = argparse.ArgumentParser(
      prog='python -m tools.benchmark', description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)

  def Common(p):
    p.add_argument('--json', help='write the results to this JSON file')
    p.add_argument('--plot', help='write a PNG plot to this file')
    p.add_argument('--quick', action='store_true',
                   help='tiny sizes and few steps (for tests)')
    p.add_argument('--priority', type=int, default=0,
                   help='raise worker priority by N (Linux autogroup '
                   'niceness -N, needs root); 0 leaves it alone')

  p = sub.add_parser('throughput', help=Throughput.__doc__)
  Common(p)
  p.add_argument('--models', default='',
                 help='comma-separated subset of transformer,amoeba')
  p.add_argument('--micro_batches', default='1,4,8,32')
  p.add_argument('--lingvo_micro_batches', default='',
                 help="M values for Lingvo's GPipe (default: --micro_batches)")
  p.add_argument('--stages_per_device', default='1,2,4',
                 help='v values for ours at K=2: v > 1 puts 2v stages on the '
                 'two devices in a loop (run at --loop_micro_batches)')
  p.add_argument('--loop_micro_batches', default='8')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=5, help='timed rounds')
  p.add_argument('--warmup', type=int, default=2)

  p = sub.add_parser('memory', help=Memory.__doc__)
  Common(p)
  p.add_argument('--models', default='')
  p.add_argument('--cap_mib', type=float, default=256.0,
                 help='per-device memory cap (MiB)')
  p.add_argument('--max_layers', type=int, default=96)
  p.add_argument('--micro_batches', type=int, default=8,
                 help='M of pipeline-1 and pipeline-2')

  p = sub.add_parser('bubble', help=Bubble.__doc__)
  Common(p)
  p.add_argument('--model', default='transformer',
                 choices=sorted(THROUGHPUT_MODELS))
  p.add_argument('--micro_batches', default='1,2,4,8,16,32')
  p.add_argument('--remat', default='always', choices=pipeline.REMAT_MODES)
  p.add_argument('--steps', type=int, default=3,
                 help='traced steps per M (the median is reported)')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--stages_per_device', type=int, default=1,
                 help='v: 2v stages looped over the 2 workers (bubble per '
                 'device then)')
  p.add_argument('--timeline', help='write the timeline PNG of one M here')
  p.add_argument('--timeline_m', type=int, default=8)

  p = sub.add_parser('graph', help=Graph.__doc__)
  Common(p)
  return parser


def main(argv=None):
  # `bazel run` starts in the runfiles tree: resolve paths where it was run.
  if os.environ.get('BUILD_WORKING_DIRECTORY'):
    os.chdir(os.environ['BUILD_WORKING_DIRECTORY'])
  args = _Parser().parse_args(argv)
  if args.quick:
    for name, value in (('steps', 1), ('warmup', 1)):
      if hasattr(args, name):
        setattr(args, name, value)
    if args.command == 'throughput' and args.micro_batches == '1,4,8,32':
      args.micro_batches = '1,2'
      if args.loop_micro_batches == '8':
        args.loop_micro_batches = '2'
      if args.stages_per_device == '1,2,4':
        args.stages_per_device = '1,2'
    if args.command == 'bubble' and args.micro_batches == '1,2,4,8,16,32':
      args.micro_batches = '1,2'
      args.timeline_m = 2
    if args.command == 'memory':
      args.cap_mib = min(args.cap_mib, 4.0)
      args.micro_batches = 2
      args.max_layers = min(args.max_layers, 12)
  commands = dict(throughput=Throughput, memory=Memory, bubble=Bubble,
                  graph=Graph)
  commands[args.command](args)
  return 0


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.exit(main())
