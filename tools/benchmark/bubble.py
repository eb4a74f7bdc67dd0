"""The bubble subcommand: measured idle fraction of each stage vs the model.

Traces training steps of our pipeline at K=2 (v stages per device) for each
M, measures every stage's (or device's) idle fraction of the pipeline span
from the execution traces, and sets it beside the fill-drain model
``simulate.LoopedBubbleFraction``; optionally renders one step's timeline.
"""

import statistics

from gpipe.schedules import simulate
from gpipe.measure import timeline
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput

_BUBBLE_MODEL = '(K-1)/(vM+K-1) for M >= K'


def Bubble(args):
  """Measured per-stage idle fraction vs ``simulate.LoopedBubbleFraction``."""
  shape = (throughput.QUICK_THROUGHPUT_MODELS if args.quick else
           throughput.THROUGHPUT_MODELS)[args.model]
  mbs = [int(m) for m in args.micro_batches.split(',')]
  k = 2
  v = args.stages_per_device
  by = 'device' if v > 1 else 'stage'
  settings = dict(model=args.model, K=k, stages_per_device=v,
                  micro_batches=mbs, remat=args.remat,
                  priority=args.priority, traced_steps=args.steps, **shape)
  header, info = report.Header('Bubble', settings)
  result = dict(machine=info, settings=settings, configs=[])
  rows = []
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
  try:
    steps = [runner.Add(runner_lib.Config(
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
      model = simulate.LoopedBubbleFraction(k, v, c.num_micro_batches)
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
  text = header + '\n' + report.Table(
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

  report.Write(args, result, Plot)
  return result
