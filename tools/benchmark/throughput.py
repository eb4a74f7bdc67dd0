"""The throughput subcommand: steps/s vs K and M, beside Lingvo and plain TF.

Times training steps of a Transformer stack and an AmoebaNet-D-like stack
(``models``) in every configuration of ``runner.Config`` that the comparison
needs, interleaved in one run, and reports the speed-ups over our K=1, M=1
(the paper's Table 2) with a headline paragraph. With ``--xla`` each of
ours is also timed with its stage functions compiled by XLA
(``compile='xla'``), in a table of step time, first step (when XLA
compiles) and graph size beside the uncompiled one.
"""

from gpipe import precision
from tools.benchmark import lingvo_stack
from tools.benchmark import report
from tools.benchmark import runner as runner_lib

# Model shapes sized for a 2-core CPU (--quick shrinks them); the bubble
# subcommand measures the same shapes.
THROUGHPUT_MODELS = {
    'transformer': dict(num_layers=8, batch=64, width=256),
    'amoeba': dict(num_layers=8, batch=128, width=64),
    # Lingvo's GPipeTransformerStack (4 encoder + 4 decoder layers, length
    # 32) on Lingvo's executor and on ours via gpipe.FromLingvo.
    lingvo_stack.MODEL: dict(num_layers=8, batch=32, width=256),
    # The per-micro-batch cost workload: 16 dense 1024x1024 ReLU layers.
    'dense': dict(num_layers=16, batch=1024, width=1024),
}
QUICK_THROUGHPUT_MODELS = {
    'transformer': dict(num_layers=4, batch=4, width=64),
    'amoeba': dict(num_layers=4, batch=4, width=8),
    lingvo_stack.MODEL: dict(num_layers=2, batch=8, width=64),
    'dense': dict(num_layers=4, batch=4, width=16),
}
# The mixed-precision table: (K, M) of ours in each --fprop_dtypes dtype.
PRECISION_SHAPES = ((1, 1), (1, 8), (2, 8))
# M of the Lingvo stack on both executors at K=2.
STACK_MICRO_BATCHES = (1, 4, 8)


def Throughput(args):
  """Steps/s vs K and M, ours beside Lingvo's GPipe and plain TF."""
  models = QUICK_THROUGHPUT_MODELS if args.quick else THROUGHPUT_MODELS
  names = args.models.split(',') if args.models else list(models)
  mbs = [int(m) for m in args.micro_batches.split(',')]
  lingvo_mbs = [int(m) for m in (args.lingvo_micro_batches or
                                 args.micro_batches).split(',')]
  loops = [int(v) for v in args.stages_per_device.split(',')]
  loop_mbs = [int(m) for m in args.loop_micro_batches.split(',')]
  dtypes = [precision.ParseFPropDtype(d).name
            for d in args.fprop_dtypes.split(',')]
  settings = dict(remat=args.remat, micro_batches=mbs, steps=args.steps,
                  stages_per_device=loops, loop_micro_batches=loop_mbs,
                  warmup=args.warmup, priority=args.priority,
                  fprop_dtypes=dtypes, references=args.references,
                  xla=getattr(args, 'xla', False),
                  gpipe_workers='K processes, one pinned core each, '
                  '1 intra-op + 2 inter-op threads',
                  lingvo='1 process, K virtual CPUs, %d+%d threads' %
                  (runner_lib.ALL_CORES, runner_lib.ALL_CORES),
                  plain='1 process, %d+%d threads' %
                  (runner_lib.ALL_CORES, runner_lib.ALL_CORES))
  header, info = report.Header('Throughput', settings)
  result = dict(machine=info, settings=settings, models={})
  tables = []
  for name in names:
    shape = models[name]
    r = args.remat
    f32 = 'float32'
    configs = [('gpipe', 1, 1, 1, r, f32), ('gpipe', 1, max(mbs), 1, r, f32)]
    configs += [('gpipe', 2, m, 1, r, f32) for m in mbs]
    configs += [('gpipe', 2, m, v, r, f32) for v in loops for m in loop_mbs
                if v > 1 and v * 2 <= shape['num_layers']]
    if args.references:
      configs += [('lingvo', 1, 1, 1, r, f32)] + [
          ('lingvo', 2, m, 1, r, f32) for m in lingvo_mbs]
      configs += [('plain', 1, 1, 1, 'never', f32)]
      # The pipeline's own per-micro-batch cost: ours at K=1 without remat
      # vs the same micro-batches as inline ops, both on one pinned core.
      configs += [(impl, 1, m, 1, 'never', f32)
                  for impl in ('gpipe', 'inline') for m in (1, max(mbs))]
    if len(dtypes) > 1:
      configs += [('gpipe', k, m, 1, r, d) for d in dtypes
                  for k, m in PRECISION_SHAPES]
    if name == lingvo_stack.MODEL:
      # Only the two executors of the same Lingvo params compare here.
      configs = [(impl, k, m, 1, r, f32) for impl in ('gpipe', 'lingvo')
                 for k, m in [(1, 1)] + [(2, m) for m in STACK_MICRO_BATCHES]]
    configs = list(dict.fromkeys(configs))  # remat='never' repeats some
    # Ours uncompiled, and with --xla each of ours again compiled by XLA.
    jobs = [(config, None) for config in configs] + [
        (config, 'xla') for config in configs
        if getattr(args, 'xla', False) and config[0] == 'gpipe']
    runner = runner_lib.Runner(priority=args.priority, log=report.Log)
    try:
      steps = []
      for (impl, k, m, v, remat, dtype), compile_mode in jobs:
        if shape['batch'] % m:
          continue
        steps.append(runner.Add(runner_lib.Config(
            impl, name, shape['num_layers'], shape['batch'], k, m, remat,
            shape['width'], v, fprop_dtype=dtype, compile=compile_mode)))
      medians = runner.TimeInterleaved(steps, args.steps, args.warmup)
    finally:
      runner.Close()
    base = {impl: medians.get(runner_lib.Config(
        impl, name, shape['num_layers'], shape['batch'], 1, 1, args.remat,
        shape['width']).label) for impl in ('gpipe', 'lingvo')}
    rows, records = [], []
    for step in steps:
      c = step.config
      t = medians[c.label]
      if c.compile:
        records.append(dict(impl=c.impl, K=c.num_stages, M=c.num_micro_batches,
                            v=c.stages_per_device, remat=c.remat,
                            fprop_dtype=c.fprop_dtype, compile=c.compile,
                            step_seconds=t, all_step_seconds=step.times,
                            first_step_seconds=step.first_seconds,
                            build_seconds=step.build_seconds,
                            graph_ops=step.num_ops,
                            graph_bytes=step.GraphBytes()))
        continue
      ref = base['gpipe']
      v, m = c.stages_per_device, c.num_micro_batches
      rows.append([c.impl, c.num_stages, v, m, c.remat, c.fprop_dtype,
                   1e3 * t, c.batch / t, ref / t,
                   '%.2f' % (2.0 * v * m / (v * m + 1))
                   if c.num_stages == 2 and c.impl != 'plain' else ''])
      records.append(dict(impl=c.impl, K=c.num_stages, M=m, v=v,
                          remat=c.remat, fprop_dtype=c.fprop_dtype,
                          compile=None, step_seconds=t,
                          first_step_seconds=step.first_seconds,
                          build_seconds=step.build_seconds,
                          graph_ops=step.num_ops,
                          graph_bytes=(step.GraphBytes()
                                       if getattr(args, 'xla', False)
                                       else None),
                          all_step_seconds=step.times,
                          examples_per_second=c.batch / t,
                          speedup_vs_gpipe_K1M1=ref / t))
    xla_rows, xla_records = _XlaTable(records)
    records = [r for r in records if not r['compile']]
    ours = {(r['K'], r['M'], r['v']): r['step_seconds'] for r in records
            if r['impl'] == 'gpipe' and r['remat'] == args.remat and
            r['fprop_dtype'] == f32}
    never = {(r['impl'], r['M']): r['step_seconds'] for r in records
             if r['remat'] == 'never' and r['impl'] in ('gpipe', 'inline')
             and r['fprop_dtype'] == f32}
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
        ours_over_lingvo_K2_by_M={
            m: lingvo[(2, m)] / ours[(2, m, 1)] for k, m in lingvo
            if k == 2 and (2, m, 1) in ours},
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
    if 32 in mbs and (2, 32, 1) in ours:
      headline['speedup_K2_M32'] = ours[(1, 1, 1)] / ours[(2, 32, 1)]
    precision_rows, precision_records = _PrecisionTable(records, dtypes,
                                                        shape['batch'])
    result['models'][name] = dict(shape=shape, configs=records,
                                  headline=headline,
                                  precision=precision_records,
                                  xla=xla_records)
    title = '### %s (L=%d, batch=%d, width=%d)' % (
        name, shape['num_layers'], shape['batch'], shape['width'])
    table = report.Table(
        ['impl', 'K devices', 'v stages/device', 'M', 'remat', 'fprop',
         'step ms',
         'examples/s', 'speed-up vs ours K=1 M=1',
         'fill-drain ceiling 2vM/(vM+1)'], rows)
    text = title + '\n\n' + table + '\n\n' + _HeadlineText(headline)
    if precision_rows:
      text += ('\n\nMixed precision (%s; same run):\n\n' %
               ' vs '.join(dtypes)) + report.Table(
                   ['K', 'M'] + ['%s step ms' % d for d in dtypes] +
                   ['%s examples/s' % d for d in dtypes] +
                   ['%s / %s speed' % (dtypes[-1], dtypes[0])],
                   precision_rows)
    if xla_rows:
      text += ('\n\nXLA-compiled stages (compile=\'xla\') beside uncompiled '
               '(same run; first step: when XLA compiles):\n\n') + report.Table(
                   ['K', 'v', 'M', 'remat', 'fprop', 'step ms', 'XLA step ms',
                    'XLA speed-up', 'first step s', 'XLA first step s',
                    'graph build s', 'XLA graph build s', 'graph ops',
                    'XLA graph ops', 'graph KiB', 'XLA graph KiB'], xla_rows)
    tables.append(text)
  text = header + '\n' + '\n\n'.join(tables)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
      recs = [r for r in result['models'][name]['configs']
              if r['fprop_dtype'] == 'float32']
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

  report.Write(args, result, Plot)
  return result


def _XlaTable(records):
  """Rows and records of ours beside ours compiled by XLA (--xla)."""
  key = lambda r: (r['K'], r['v'], r['M'], r['remat'], r['fprop_dtype'])
  plain = {key(r): r for r in records
           if r['impl'] == 'gpipe' and not r['compile']}
  rows, out = [], []
  for r in records:
    if not r['compile'] or key(r) not in plain:
      continue
    p = plain[key(r)]
    rows.append(list(key(r)) + [
        1e3 * p['step_seconds'], 1e3 * r['step_seconds'],
        '%.2fx' % (p['step_seconds'] / r['step_seconds']),
        p['first_step_seconds'], r['first_step_seconds'],
        p['build_seconds'], r['build_seconds'], p['graph_ops'],
        r['graph_ops'], p['graph_bytes'] / 1024.0,
        r['graph_bytes'] / 1024.0])
    out.append(dict(K=r['K'], v=r['v'], M=r['M'], remat=r['remat'],
                    fprop_dtype=r['fprop_dtype'], uncompiled=p, xla=r,
                    speedup=p['step_seconds'] / r['step_seconds']))
  return rows, out


def _PrecisionTable(records, dtypes, batch):
  """Rows (K, M, ms per dtype, examples/s per dtype, ratio) and records."""
  if len(dtypes) < 2:
    return [], []
  times = {(r['K'], r['M'], r['fprop_dtype']): r['step_seconds']
           for r in records if r['impl'] == 'gpipe' and r['v'] == 1}
  rows, out = [], []
  for k, m in PRECISION_SHAPES:
    if not all((k, m, d) in times for d in dtypes):
      continue
    ts = [times[(k, m, d)] for d in dtypes]
    ratio = ts[0] / ts[-1]
    rows.append([k, m] + [1e3 * t for t in ts] + [batch / t for t in ts] +
                [ratio])
    out.append(dict(K=k, M=m, step_seconds=dict(zip(dtypes, ts)),
                    examples_per_second={d: batch / t
                                         for d, t in zip(dtypes, ts)},
                    speed_ratio=ratio))
  return rows, out


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
  by_m = h.get('ours_over_lingvo_K2_by_M') or {}
  if by_m:
    text += (" Ours / Lingvo's executor at K=2: %s." % ', '.join(
        'M=%d %s' % (m, F(by_m[m])) for m in sorted(by_m)))
  if h.get('lingvo_K2_M8_over_ours_K1M1'):
    text += (" Lingvo's GPipe at K=2 M=8 on both cores runs %s as fast as "
             'ours on one core, so one stage per device (ceiling 1.78x at '
             'M=8) can beat it by at most %s.' %
             (F(h['lingvo_K2_M8_over_ours_K1M1']),
              F(16.0 / 9 / h['lingvo_K2_M8_over_ours_K1M1'])))
  return text
