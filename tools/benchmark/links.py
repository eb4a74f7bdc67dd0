"""The links subcommand: pipeline steps across hosts whose links have latency.

Each stage's worker is a one-core worker process (pinned, one intra-op
thread, as in ``runner``) in its own host: a network namespace of a
``tools.netlab.netns.Lab``. Every link is capped at ``--rate_mbit`` (a
``tbf`` qdisc on both ends of each veth) and crosses the lab's delaying TCP
relay (``tools.netlab.delay_relay``), which adds a one-way delay d to every
message: trainer to master, master to workers, and each tensor handed from
stage to stage (see the lab's docstring for the wiring). The same
configurations (schedule x K x M, the loss inside the pipeline) are timed
at each d of ``--delays_ms``, interleaved: a round runs one step of every
configuration at each delay in turn, the relay's delay changed between
them, so the machine's other load hits every delay alike.

What a schedule hides of the link: a step has ``crossings`` = 2(K-1)M
hand-overs (each micro-batch's activations forward and gradients back at
every stage boundary) + 4 control messages (the client's request and reply,
the master's RunGraph requests and replies, sent in parallel to the other
tasks). If none overlapped with computation the step would grow by
crossings x d; the measured growth ``added`` = t(d) - t(0) shows
``exposed`` = added / d of them, and ``hidden`` = 1 - exposed / crossings.
``critical`` is the number a schedule cannot hide: the crossings on the
critical path of its task order with unit task costs (F=1, B=2 with
re-materialization, W=1; ``CriticalCrossings``), and ``simulated`` the growth
that task order predicts with its unit cost scaled to t(0).

This process creates the lab (it needs root), starts the workers and the
relay, then runs the timing in a child process in the lab's client
namespace (``python -m tools.benchmark.links SPEC.json``), which writes its
results for this process to report.
"""

import json
import os
import statistics
import sys
import tempfile

from gpipe.schedules import pipeline_tasks
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.schedules import registry
from tools.benchmark import report
from tools.benchmark import runner as runner_lib
from tools.benchmark import throughput
from tools.netlab import delay_relay
from tools.netlab import netns

FIRST_PORT = 2300
# The model's default shape: a step of ~0.1-0.2 s on this kind of core, so
# that millisecond delays are not lost in the noise of long steps, and
# micro-batch tasks of a few ms, about as long as the delays.
SHAPE = dict(num_layers=8, batch=32, width=128)
# Messages of a step that are no stage hand-over: the client's RunStep
# request and reply, the master's RunGraph requests and replies.
CONTROL_CROSSINGS = 4


def _Crossings(k, m):
  return 2 * (k - 1) * m + CONTROL_CROSSINGS


def _Inputs(task, k):
  """The tasks whose outputs `task` reads (the loss inside the pipeline)."""
  s, m, phase = task
  if phase == pipeline_tasks.FORWARD:
    return [pipeline_tasks.Task(s - 1, m, phase)] if s else []
  if phase == pipeline_tasks.WEIGHT:
    return [pipeline_tasks.Task(s, m, pipeline_tasks.BACKWARD)]
  later = [pipeline_tasks.Task(s + 1, m, phase)] if s < k - 1 else []
  return later + [pipeline_tasks.Task(s, m, pipeline_tasks.FORWARD)]


def SimulatedSpan(name, k, m, remat, latency):
  """A step's length in unit-cost ticks, each link crossing `latency` long.

  One stage per device; device 0 is the master: the other devices start
  `latency` after it (the RunGraph request), the step ends `latency` after
  their last task (the reply), and the client's request and reply add two.

  Args:
    name: a schedule with one stage per device ('gpipe', '1f1b', 'zb_h1').
    k: K stages (devices).
    m: M micro-batches.
    remat: whether B recomputes the forward pass.
    latency: the one-way delay of a crossing, in ticks.

  Returns:
    The span in ticks.
  """
  costs = registry.Costs(name, forward=1, backward=2 if remat else 1,
                         weight=1)
  _, orders = registry.Orders(name, k, m, costs)
  device = {t: d for d, order in enumerate(orders) for t in order}
  finish = {}
  free = [latency if d else 0.0 for d in range(len(orders))]
  pos = [0] * len(orders)
  remaining = sum(len(o) for o in orders)
  while remaining:
    for d, order in enumerate(orders):
      while pos[d] < len(order):
        task = order[pos[d]]
        inputs = _Inputs(task, k)
        if any(t not in finish for t in inputs):
          break
        start = max([free[d]] + [finish[t] + (latency if device[t] != d else 0)
                                 for t in inputs])
        finish[task] = free[d] = start + costs[task.phase]
        pos[d] += 1
        remaining -= 1
  end = max(free[d] + (latency if d else 0) for d in range(len(orders)))
  return end + 2 * latency


def CriticalCrossings(name, k, m, remat):
  """How many link crossings lie on the critical path (unit task costs)."""
  epsilon = 1e-3
  return round((SimulatedSpan(name, k, m, remat, epsilon) -
                SimulatedSpan(name, k, m, remat, 0.0)) / epsilon)


def _Configs(args, shape):
  """The (K, schedule, M) runner Configs of the run."""
  configs = []
  for k in [int(v) for v in args.num_stages.split(',')]:
    for name in args.schedules.split(','):
      for m in [int(v) for v in args.micro_batches.split(',')]:
        if shape['batch'] % m:
          continue
        try:
          registry.Orders(name, k, m)
        except ValueError:
          continue  # e.g. 1F1B needs M >= K.
        configs.append(runner_lib.Config(
            'gpipe', args.model, shape['num_layers'], shape['batch'], k, m,
            args.remat, shape['width'], 1, name))
  return configs


def _Drive(spec_path):
  """The child: times every configuration at every delay; writes results."""
  with open(spec_path) as f:
    spec = json.load(f)
  delays = spec['delays_ms']
  steps = []
  for fields in spec['configs']:
    config = runner_lib.Config(*fields)
    cluster = spec['clusters'][str(config.num_stages)]
    step = runner_lib.Step(config, cluster['target'], cluster['devices'])
    report.Log('built %-28s in %5.1f s, %6d ops' %
               (config.label, step.build_seconds, step.num_ops))
    steps.append(step)
  times = {(s.config.label, d): [] for s in steps for d in delays}
  for r in range(spec['warmup'] + spec['steps']):
    for d in (delays if r % 2 == 0 else list(reversed(delays))):
      delay_relay.SetDelayAt(spec['control'], d)
      for step in (steps if r % 2 == 0 else list(reversed(steps))):
        seconds = step.Run()
        if r >= spec['warmup']:
          times[(step.config.label, d)].append(seconds)
    report.Log('round %d of %d done' % (r + 1,
                                        spec['warmup'] + spec['steps']))
  records = []
  for step in steps:
    c = step.config
    records.append(dict(
        schedule=c.schedule, K=c.num_stages, M=c.num_micro_batches,
        remat=c.remat, label=c.label,
        seconds={str(d): statistics.median(times[(c.label, d)])
                 for d in delays},
        all_seconds={str(d): times[(c.label, d)] for d in delays}))
    step.Close()
  with open(spec['out'], 'w') as f:
    json.dump(records, f)


def _Analyse(record, delays, remat):
  """Adds added/exposed/hidden/critical/simulated figures to a record."""
  k, m, name = record['K'], record['M'], record['schedule']
  base = record['seconds']['0']
  span0 = SimulatedSpan(name, k, m, remat, 0.0)
  tick = base / span0
  record['crossings'] = _Crossings(k, m)
  record['critical'] = CriticalCrossings(name, k, m, remat)
  for d in delays:
    if not d:
      continue
    added = record['seconds'][str(d)] - base
    exposed = added / (d / 1e3)
    simulated = (SimulatedSpan(name, k, m, remat, d / 1e3 / tick) -
                 span0) * tick
    record.setdefault('added', {})[str(d)] = added
    record.setdefault('exposed', {})[str(d)] = exposed
    record.setdefault('hidden', {})[str(d)] = 1 - exposed / record['crossings']
    record.setdefault('simulated_added', {})[str(d)] = simulated


def _Table(records, delays):
  top = max(delays)
  header = (['K', 'schedule', 'M'] +
            ['step ms at %g ms' % d for d in delays] +
            ['added ms at %g' % d for d in delays if d] +
            ['simulated added at %g' % top, 'crossings', 'critical',
             'exposed at %g' % top, 'hidden at %g' % top])
  rows = []
  for r in records:
    rows.append([r['K'], r['schedule'], r['M']] +
                [1e3 * r['seconds'][str(d)] for d in delays] +
                [1e3 * r['added'][str(d)] for d in delays if d] +
                [1e3 * r['simulated_added'][str(top)], r['crossings'],
                 r['critical'], '%.1f' % r['exposed'][str(top)],
                 '%.0f%%' % (100 * r['hidden'][str(top)])])
  return report.Table(header, rows)


def Links(args):
  """Step time per schedule, K and M over namespace hosts with link delays."""
  reason = netns.Unavailable()
  if reason:
    raise SystemExit('links: the hosts are network namespaces, which cannot '
                     'be made here: %s. Run it as root on Linux.' % reason)
  if args.quick:
    shape = dict(throughput.QUICK_THROUGHPUT_MODELS[args.model])
  else:
    shape = dict(SHAPE)
  for name in shape:
    if getattr(args, name, None):
      shape[name] = getattr(args, name)
  delays = sorted({float(v) for v in args.delays_ms.split(',')} | {0.0})
  delays = [int(d) if d == int(d) else d for d in delays]
  configs = _Configs(args, shape)
  if not configs:
    raise SystemExit('links: no configuration of --num_stages=%s, '
                     '--schedules=%s, --micro_batches=%s runs (1F1B and ZB-H1 '
                     'need M >= K; M must divide the batch, %d)' % (
                         args.num_stages, args.schedules, args.micro_batches,
                         shape['batch']))
  ks = sorted({c.num_stages for c in configs})
  settings = dict(model=args.model, layers=shape['num_layers'],
                  batch=shape['batch'], width=shape['width'],
                  remat=args.remat, delays_ms=delays,
                  rate_mbit=args.rate_mbit, steps=args.steps,
                  warmup=args.warmup,
                  hosts='one network namespace per stage, one pinned '
                  'one-core worker each (1 intra-op + 2 inter-op threads)',
                  latency='delaying TCP relay, every link (tools/netlab)')
  header, info = report.Header('Links with latency', settings)
  ports = {k: FIRST_PORT + k for k in ks}
  with netns.Lab(max(ks), delay_ms=0, rate_mbit=args.rate_mbit,
                 ports=tuple(ports.values())) as lab:
    clusters = {}
    if args.priority > 0:
      # Every hand-over passes through the relay: as urgent as the workers.
      runner_lib.RaisePriority([lab.relay_pid], args.priority)
    for k in ks:
      workers = netns.Workers(lab, k, port=ports[k], pin_cores=True)
      if args.priority > 0:
        runner_lib.RaisePriority([p for p in workers.pids if p],
                                 args.priority)
      clusters[str(k)] = dict(target=workers.target,
                              devices=[cluster_spec_lib.DeviceName(i)
                                       for i in range(k)])
      report.Log('K=%d: workers at %s' % (k, ', '.join(workers.addresses)))
    with tempfile.TemporaryDirectory() as tmp:
      spec = dict(configs=[list(c) for c in configs], clusters=clusters,
                  delays_ms=delays, control=lab.relay_control,
                  steps=args.steps, warmup=args.warmup,
                  out=os.path.join(tmp, 'records.json'))
      spec_path = os.path.join(tmp, 'spec.json')
      with open(spec_path, 'w') as f:
        json.dump(spec, f)
      child = lab.Popen(lab.client, [
          sys.executable, '-m', 'tools.benchmark.links', spec_path],
                        stdout=None, stderr=None)
      if child.wait():
        raise SystemExit('links: the timing process in the lab failed (exit '
                         '%d); see its output above' % child.returncode)
      with open(spec['out']) as f:
        records = json.load(f)
  remat = args.remat != 'never'
  for r in records:
    _Analyse(r, delays, remat)
  text = header + '\n' + _Table(records, delays)
  print(text)
  result = dict(machine=info, settings=settings, configs=records,
                markdown=text)
  report.Write(args, result, lambda plt: Plot(plt, result))
  return result


def Plot(plt, result):
  """The figure of a links result: delays exposed against M, per K."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  records = result['configs']
  settings = result['settings']
  top = str(max(settings['delays_ms']))
  ks = sorted({r['K'] for r in records})
  schedules = list(dict.fromkeys(r['schedule'] for r in records))
  fig, axes = plt.subplots(1, len(ks), figsize=(6 * len(ks), 3.8),
                           squeeze=False)
  for ax, k in zip(axes[0], ks):
    for name in schedules:
      rs = [r for r in records if r['K'] == k and r['schedule'] == name]
      line, = ax.plot([r['M'] for r in rs],
                      [r['exposed'][top] for r in rs], 'o-',
                      label='%s measured' % name)
      ax.plot([r['M'] for r in rs],
              [r['simulated_added'][top] / (float(top) / 1e3) for r in rs],
              ':', color=line.get_color(), label='%s simulated' % name)
    ms = sorted({r['M'] for r in records if r['K'] == k})
    ax.plot(ms, [_Crossings(k, m) for m in ms], 'k--',
            label='every crossing exposed')
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    low, high = ax.get_ylim()
    ax.set_yticks([t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500)
                   if low <= t <= high])
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel('micro-batches M')
    ax.set_ylabel('delays exposed: added time / %s ms' % top)
    ax.set_title('%s, K=%d, %g Mbit/s links' % (settings['model'], k,
                                                settings['rate_mbit']))
    ax.legend(fontsize=7)
  return fig


if __name__ == '__main__':
  _Drive(sys.argv[1])
