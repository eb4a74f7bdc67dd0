"""The memory subcommand: the paper's Table 1 under a per-device memory cap.

For each model and mode (naive-1, pipeline-1, pipeline-2) it searches for the
most layers whose parameters plus measured peak step memory fit the cap
(``LargestFitting``), measuring each size in fresh worker processes.
"""

from gpipe.measure import memory
from gpipe.measure import param_count
from tools.benchmark import models
from tools.benchmark import report
from tools.benchmark import runner as runner_lib

MIB = float(1 << 20)

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
  workers could outgrow the machine's RAM.
  """
  if config in cache:
    return cache[config]
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
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
      param_count.CountParams(lp) for lp in models.ModelLayers(
          config.model, config.num_layers, config.width))
  # Per device: parameters + their gradients (SGD keeps no slots); the
  # pipeline's stages hold about 1/K of them each.
  param_bytes = 4 * params / config.num_stages
  cache[config] = dict(
      num_layers=config.num_layers, params=params,
      param_bytes_per_device=param_bytes, step_peak_bytes=step_peak,
      allocator_peak_bytes=total_peak,
      fits_bytes=param_bytes + step_peak)
  report.Log('  %s L=%d: params %.1f MiB/device, step peak %.1f MiB' %
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
  shapes = QUICK_MEMORY_MODELS if args.quick else MEMORY_MODELS
  names = args.models.split(',') if args.models else list(shapes)
  cap = args.cap_mib * MIB
  settings = dict(cap_mib=args.cap_mib, modes=[m[0] for m in MEMORY_MODES],
                  micro_batches=args.micro_batches, priority=args.priority,
                  fits='parameters + measured peak step memory <= cap')
  header, info = report.Header('Memory', settings)
  result = dict(machine=info, settings=settings, models={})
  rows = []
  for name in names:
    shape = shapes[name]
    result['models'][name] = {}
    for mode, impl, k, m, remat in MEMORY_MODES:
      m = args.micro_batches if impl == 'gpipe' else m
      def Make(layers, impl=impl, k=k, m=m, remat=remat, shape=shape):
        return runner_lib.Config(impl, name, layers, shape['batch'], k,
                                 m, remat, shape['width'])
      report.Log('%s %s:' % (name, mode))
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
  text = header + '\n' + report.Table(
      ['model', 'mode', 'max layers', 'params (M)', 'param MiB/device',
       'peak step MiB/device', 'total MiB/device', 'first L over cap'],
      rows) + '\n\nHeadline: pipeline-1 fits %s the layers of naive-1.' % (
          ', '.join('%s %s%.1fx' % (
              name, '>= ' if not result['models'][name]['pipeline-1'][
                  'first_not_fitting'] else '', ratio)
                    for name, ratio in ratios.items()) or 'n/a')
  print(text)
  result['markdown'] = text

  report.Write(args, result, lambda plt: MemoryPlot(plt, result))
  return result
