"""The data_parallel subcommand: R replicas x K stages on pinned one-core workers.

Times, interleaved in one run, the training step of the same batch as

* R=1, K=1, M=1 (one worker: the baseline) and R=1, K=1, M=2 (the same
  micro-batches as R=2, M=1: exactly its computation, on one worker);
* R=2, K=1, M=1: two replicas on two workers, the gradients summed by an
  AddN on the first worker (where the variables live) before the update;
* R=1, K=2, M=2R and R=2, K=2 (4 workers; on a 2-core machine two workers
  share each core, so this shows correctness and overhead, not speed).

The all-reduce's share of the step is measured from traced steps (every
worker's ops, one clock): the *tail* of a step is the time from the end of
its last backward task to the end of the step (the replicas' gradients
reaching the variables' worker, their AddN and the update); the *head* is
how much later the second replica starts its first forward task than the
first one (its reading of the weights from the first worker). The
all-reduce share is (tail of R=2 - tail of R=1, which is the update alone)
/ step of R=2; the weight-read share is head / step.
"""

import statistics

from gpipe.schedules import pipeline_tasks
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput


def _Phases(step_stats):
  """(first forward start per replica-0/other device, last backward end, end).

  Args:
    step_stats: a traced step's RunMetadata.step_stats.

  Returns:
    (start, first_forward, last_backward_end, end) in seconds: the step's
    first op start, {device: its first forward task start}, the end of the
    last backward (B or W) task and of the last op.
  """
  start, end, last_backward = None, 0, 0
  first_forward = {}
  for dev in step_stats.dev_stats:
    for node in dev.node_stats:
      t0 = node.all_start_micros
      t1 = t0 + max(node.all_end_rel_micros, 1)
      start = t0 if start is None else min(start, t0)
      end = max(end, t1)
      task = pipeline_tasks.ParseOpName(node.node_name)
      if task is None:
        continue
      if task.phase == pipeline_tasks.FORWARD:
        first_forward[dev.device] = min(first_forward.get(dev.device, t0), t0)
      else:
        last_backward = max(last_backward, t1)
  return (start * 1e-6, {d: t * 1e-6 for d, t in first_forward.items()},
          last_backward * 1e-6, end * 1e-6)


def Communication(step, devices, num_traces):
  """Median tail and head (seconds) of `num_traces` traced steps of `step`.

  Args:
    step: a runner.Step.
    devices: the runner's devices of its configuration (replica r's first
      stage on devices[r K]).
    num_traces: traced steps.

  Returns:
    (tail, head): see the module docstring (head 0 with one replica).
  """
  c = step.config
  tails, heads = [], []
  for _ in range(num_traces):
    _, metadata = step.Run(trace=True)
    _, first_forward, last_backward, end = _Phases(metadata.step_stats)
    tails.append(end - last_backward)
    firsts = [
        _Find(first_forward, devices[r * c.num_stages])
        for r in range(c.replicas)
    ]
    heads.append(max(firsts) - min(firsts) if len(firsts) > 1 else 0.0)
  return statistics.median(tails), statistics.median(heads)


def _Find(first_forward, device):
  """The value of the traced device named like `device` (spellings differ)."""
  short = device.replace('/device:', '/').lower()
  for name, value in first_forward.items():
    if name.replace('/device:', '/').lower().startswith(short):
      return value
  raise KeyError('no forward task traced on %s (traced: %s)' %
                 (device, sorted(first_forward)))


def DataParallel(args):
  """R=2 replicas over R=1 on pinned one-core workers; all-reduce share."""
  models = (throughput.QUICK_THROUGHPUT_MODELS if args.quick else
            throughput.THROUGHPUT_MODELS)
  names = (args.models.split(',') if args.models else
           ['transformer', 'amoeba'])  # one-tensor stacks with replicas
  settings = dict(remat=args.remat, steps=args.steps, warmup=args.warmup,
                  traces=args.trace_steps, priority=args.priority,
                  workers='R x K processes, one pinned core each (worker i '
                  'on core i mod %d), 1 intra-op + 2 inter-op threads' %
                  runner_lib.ALL_CORES)
  header, info = report.Header('Data parallelism', settings)
  result = dict(machine=info, settings=settings, models={})
  tables = []
  for name in names:
    shape = models[name]
    # (R, K, M per replica)
    configs = [(1, 1, 1), (1, 1, 2), (2, 1, 1), (1, 2, 4), (2, 2, 2)]
    if args.quick:
      configs = configs[:3]  # No 4-worker cluster in quick runs (tests).
    runner = runner_lib.Runner(priority=args.priority, log=report.Log)
    try:
      steps = []
      for r, k, m in configs:
        if shape['batch'] % (r * m):
          continue
        steps.append(runner.Add(runner_lib.Config(
            'gpipe', name, shape['num_layers'], shape['batch'], k, m,
            args.remat, shape['width'], replicas=r)))
      medians = runner.TimeInterleaved(steps, args.steps, args.warmup)
      comm = {
          s.config.label: Communication(s, runner.Devices(s.config),
                                        args.trace_steps)
          for s in steps
      }
    finally:
      runner.Close()
    base = medians[steps[0].config.label]
    tail_r1 = comm[steps[0].config.label][0]
    rows, records = [], []
    for step in steps:
      c = step.config
      t = medians[c.label]
      tail, head = comm[c.label]
      allreduce = (tail - tail_r1) / t if c.replicas > 1 else None
      rows.append([c.replicas, c.num_stages, c.num_micro_batches,
                   c.replicas * c.num_stages, 1e3 * t, c.batch / t,
                   c.batch / t / c.replicas, base / t, 1e3 * tail, 1e3 * head,
                   '%.1f%%' % (100 * allreduce) if allreduce is not None
                   else '', '%.1f%%' % (100 * head / t) if c.replicas > 1
                   else ''])
      records.append(dict(R=c.replicas, K=c.num_stages, M=c.num_micro_batches,
                          step_seconds=t, all_step_seconds=step.times,
                          examples_per_second=c.batch / t,
                          speedup_vs_R1K1M1=base / t, tail_seconds=tail,
                          head_seconds=head, allreduce_share=allreduce,
                          weight_read_share=(head / t if c.replicas > 1
                                             else None)))
    r2 = [r for r in records if r['R'] == 2 and r['K'] == 1]
    r1m2 = [r for r in records if r['R'] == 1 and r['K'] == 1 and r['M'] == 2]
    headline = dict(
        speedup_R2K1=r2[0]['speedup_vs_R1K1M1'] if r2 else None,
        speedup_R2K1_vs_same_micro_batches=(
            r1m2[0]['step_seconds'] / r2[0]['step_seconds']
            if r2 and r1m2 else None),
        allreduce_share_R2K1=r2[0]['allreduce_share'] if r2 else None,
        weight_read_share_R2K1=r2[0]['weight_read_share'] if r2 else None)
    result['models'][name] = dict(shape=shape, configs=records,
                                  headline=headline)
    title = '### %s (L=%d, batch=%d, width=%d)' % (
        name, shape['num_layers'], shape['batch'], shape['width'])
    table = report.Table(
        ['R', 'K', 'M per replica', 'workers', 'step ms', 'examples/s',
         'examples/s per replica', 'speed-up vs R=1 K=1 M=1', 'tail ms',
         'head ms', 'all-reduce share', 'weight-read share'], rows)
    tables.append(title + '\n\n' + table + '\n\n' + _HeadlineText(headline))
  text = header + '\n' + '\n\n'.join(tables)
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
      recs = result['models'][name]['configs']
      labels = ['R=%d K=%d M=%d' % (r['R'], r['K'], r['M']) for r in recs]
      ax.bar(labels, [r['speedup_vs_R1K1M1'] for r in recs])
      ax.axhline(1.85, color='gray', linestyle=':', label='target 1.85x')
      ax.set_ylabel('speed-up over R=1 K=1 M=1')
      ax.set_title(name)
      ax.tick_params(axis='x', labelsize=7)
      ax.legend(fontsize=7)
    return fig

  report.Write(args, result, Plot)
  return result


def _HeadlineText(h):
  def F(v, fmt='%.2fx'):
    return fmt % v if v is not None else 'n/a'
  return ('Headline: R=2, K=1 runs %s as fast as R=1, K=1, M=1 (%s as fast '
          'as R=1 on the same 2 micro-batches); the all-reduce (gradients to '
          "the variables' worker, AddN) takes %s of the R=2 step and the "
          "second replica's weight read %s." %
          (F(h['speedup_R2K1']), F(h['speedup_R2K1_vs_same_micro_batches']),
           F(None if h['allreduce_share_R2K1'] is None else
             100 * h['allreduce_share_R2K1'], '%.1f%%'),
           F(None if h['weight_read_share_R2K1'] is None else
             100 * h['weight_read_share_R2K1'], '%.1f%%')))
