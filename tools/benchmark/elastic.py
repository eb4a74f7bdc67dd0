"""The elastic subcommand: ``--elastic`` across a lost, a returned and a slow worker.

For each model (default: the default model and the Transformer stack
``mt.NumbersSmall``), three runs of the trainer binary, each timed from
outside and from its own step log (every record has its wall clock):

1. *Loss and return.* ``--workers`` (4) worker processes serve a cluster
   file; the trainer runs with ``--cluster_spec=@FILE --elastic`` from the
   shape of ``--shape_flags`` (R=2 replicas, M=2). After
   ``--loss_step`` steps the last worker is killed (SIGKILL) and stays away past
   ``--worker_wait_secs``: the run shrinks to the workers that serve.
   ``--return_after`` steps after the first step on that shape, it is
   started again on another port and the file rewritten, as a supervisor
   would: the run grows back at its next checkpoint.
2. *Same-shape restart.* ``--worker_processes=N --max_worker_restarts=1
   --elastic``: a worker killed after ``--loss_step`` steps is started again
   by the trainer in its place, and the run goes on in the same shape.
3. *A slow worker.* ``--worker_processes=2 --pin_cores --elastic`` (a core
   each; on a 2-core machine four workers already share the cores at about
   half a core each, so a half-core quota would slow none of them): worker 1
   is held to ``--throttle_cores`` by a cgroup CPU quota (Linux's cpu
   controller, as root) from its start, and the trainer moves layers off its
   stage. Then static runs for comparison: the cut the run started with
   and the cut it moved to, each from the start under the same quota, and
   the first cut without the quota.

With ``--compare_losses`` (the default) an uninterrupted run in the
starting shape (``--worker_processes=N``) follows the first, and each step's
loss of the elastic run is compared with its loss there: R x M stays the
same through the moves, so they differ only by rounding (another order of
the same sums), which training amplifies step by step; in float64
(``--model_params_override='task.dtype=float64;
input.feature_dtype=float64'``, applied to every run) it stays far below
the float32 figures.

Reported per model: examples/s (median of per-step rates) before the loss,
on the shrunk shape and after the return; the seconds from the kill to the
first step on the new shape (measured from outside) and from when the
trainer noticed the loss (its ``trainer/recovery_secs``), beside the run's
own start-up (the trainer's start to the end of its step 2,
``startup.json``); the steps redone; the same for the restart; the throttled step before and after
rebalancing, the step the rebalancer predicted (before over its predicted
gain) and the static cuts' steps. The plot: examples/s over time with each
event marked.
"""

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from gpipe.runtime import cpu_quota
from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from tools.benchmark import report
from tools.trainer import elastic as elastic_lib
from tools.trainer import model_select
from tools.trainer import progress
from tools.trainer import timed_run

MODELS = ('image.AmoebaNetD_Digits', 'mt.NumbersSmall')
# R=2 replicas of K=2 stages with M=2 on 4 workers: a shrink keeps R x M.
SHAPE_FLAGS = ('--data_parallel=2', '--num_micro_batches=2')


def _ShapeFlags(args):
  """The starting shape's trainer flags (--shape_flags, or SHAPE_FLAGS)."""
  if args.shape_flags is None:
    return list(SHAPE_FLAGS)
  return args.shape_flags.split()
POLL_SECS = 0.2


class ElasticBenchmarkError(RuntimeError):
  """A run failed or did not do what the scenario needs; says which."""


def _Steps(logdir):
  return progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))


def _Trainer(flags, log_path):
  with open(log_path, 'w') as log:
    env = timed_run.Environment()
    env['PYTHONUNBUFFERED'] = '1'
    return subprocess.Popen(
        [sys.executable, '-m', 'tools.trainer'] + list(flags),
        cwd=timed_run.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)


def _Read(path):
  with open(path) as f:
    return f.read()


def _WaitFor(what, ready, proc, log_path, timeout):
  """Polls `ready()` until it is true; the trainer must still run."""
  deadline = time.time() + timeout
  while True:
    value = ready()
    if value:
      return value
    if proc.poll() is not None:
      raise ElasticBenchmarkError(
          'the trainer ended (exit %s) while waiting for %s:\n%s' % (
              proc.returncode, what, _Read(log_path)[-3000:]))
    if time.time() > deadline:
      raise ElasticBenchmarkError('no %s within %d s:\n%s' % (
          what, timeout, _Read(log_path)[-3000:]))
    time.sleep(POLL_SECS)


def _Finish(proc, log_path, timeout):
  try:
    proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    raise ElasticBenchmarkError('the trainer took more than %d s:\n%s' % (
        timeout, _Read(log_path)[-3000:])) from None
  if proc.returncode:
    raise ElasticBenchmarkError('the trainer failed (exit %d):\n%s' % (
        proc.returncode, _Read(log_path)[-3000:]))


class _Servers:
  """Worker processes serving a cluster file, started and replaced here."""

  def __init__(self, workdir, count):
    self.spec = os.path.join(workdir, 'cluster.json')
    self._workdir = workdir
    self.addresses = ['localhost:%d' % local_cluster.FreePort()
                      for _ in range(count)]
    self.procs = [None] * count
    self._Write()
    for task in range(count):
      self.Start(task)

  def _Write(self):
    with open(self.spec + '.new', 'w') as f:
      json.dump({'worker': self.addresses}, f)
    os.replace(self.spec + '.new', self.spec)

  def Start(self, task, timeout=120):
    """Starts worker `task` at its address; returns once it serves."""
    log = open(os.path.join(self._workdir, 'worker_%d_%s.log' % (
        task, self.addresses[task].split(':')[1])), 'w')
    self.procs[task] = subprocess.Popen(
        [sys.executable, '-m', 'gpipe.worker', '--cluster_spec=@' + self.spec,
         '--task=%d' % task], cwd=timed_run.ROOT, env=timed_run.Environment(),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.time() + timeout
    while liveness.Probe(self.addresses[task], timeout_secs=1.0):
      if self.procs[task].poll() is not None or time.time() > deadline:
        raise ElasticBenchmarkError('worker %d did not serve at %s' % (
            task, self.addresses[task]))
      time.sleep(POLL_SECS)

  def Kill(self, task):
    self.procs[task].kill()
    self.procs[task].wait()

  def Replace(self, task):
    """Starts `task` again at a new address and lists it in the file."""
    self.addresses[task] = 'localhost:%d' % local_cluster.FreePort()
    self._Write()
    self.Start(task)

  def Close(self):
    for proc in self.procs:
      if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _Rates(records, batch, first_steps=()):
  """[(time, examples/s)] of each step after the first of its run.

  A step's rate is the batch over the seconds since the previous record;
  a record whose step does not follow the previous one's starts a new run
  (a restart or move redoes steps from a checkpoint) and has no rate, nor
  has a run's first step after a move that redid none (`first_steps`: its
  interval holds the move).
  """
  rates = []
  for a, b in zip(records, records[1:]):
    if (b['step'] == a['step'] + 1 and b['time'] > a['time'] and
        b['step'] not in first_steps):
      rates.append((b['time'], batch / (b['time'] - a['time'])))
  return rates


def _Median(rates, start, end):
  values = [r for t, r in rates if start <= t < end]
  return statistics.median(values) if values else None


def _Batch(model):
  return model_select.ModelParams(model).input.batch_size


def _StartupSecs(log_path):
  """The run's own start-up: its first 'start-up: ... trainer's start' line.

  (startup.json holds the last loop's: after a move, the move's.)
  """
  found = re.search(r"start-up: ([\d.]+) s from the trainer's start",
                    _Read(log_path))
  return float(found.group(1)) if found else None


def _Override(args, *more):
  """The runs' --model_params_override: the benchmark's, then `more`."""
  text = '; '.join(t for t in (args.model_params_override,) + more if t)
  return ['--model_params_override=' + text] if text else []


def _CommonFlags(model, logdir, args):
  return ['--model=' + model, '--logdir=' + logdir,
          '--max_steps=%d' % args.steps,
          '--checkpoint_every_n_steps=%d' % args.checkpoint_every,
          '--log_every_n_steps=%d' % args.checkpoint_every,
          '--trace_every_n_steps=0', '--eval_after_train=false'
         ] + _Override(args)


def _FirstStepTime(records, step):
  times = [r['time'] for r in records if r['step'] == step]
  return times[-1] if times else None


def LossAndReturn(model, args, workdir):
  """Scenario 1; the figures and the per-step rates (see the module doc)."""
  logdir = os.path.join(workdir, 'loss_and_return')
  log_path = logdir + '.log'
  servers = _Servers(workdir, args.workers)
  last = args.workers - 1
  proc = _Trainer(_CommonFlags(model, logdir, args) + _ShapeFlags(args) + [
      '--cluster_spec=@' + servers.spec, '--elastic',
      '--worker_wait_secs=%g' % args.worker_wait_secs], log_path)
  marks = {}
  try:
    _WaitFor('step %d' % args.loss_step,
             lambda: len(_Steps(logdir)) >= args.loss_step, proc, log_path,
             args.timeout_secs)
    marks['loss'] = time.time()
    servers.Kill(last)
    shrink = _WaitFor('the first step after the shrink',
                      lambda: elastic_lib.ReadEvents(logdir), proc, log_path,
                      args.timeout_secs)[0]
    _WaitFor('%d steps on the shrunk shape' % args.return_after,
             lambda: _Steps(logdir)[-1]['step'] >=
             shrink['first_step'] + args.return_after, proc, log_path,
             args.timeout_secs)
    marks['return'] = time.time()
    servers.Replace(last)
    _Finish(proc, log_path, args.timeout_secs)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    servers.Close()
  events = elastic_lib.ReadEvents(logdir)
  kinds = [e['kind'] for e in events]
  if kinds != ['shrink', 'grow']:
    raise ElasticBenchmarkError('expected a shrink then a grow, got %s:\n%s'
                                % (kinds, _Read(log_path)[-3000:]))
  records = _Steps(logdir)
  shrink, grow = events
  compared = None
  if args.compare_losses:
    compared = CompareLosses(records, _ReferenceRecords(model, args,
                                                        workdir))
    # Rounding only where every shape kept R x M (the micro-batches).
    compared['rm_kept'] = len({_MicroBatchesPerStep(s) for s in (
        shrink['old'], shrink['new'], grow['new'])}) == 1
  rates = _Rates(records, _Batch(model), {grow['first_step']})
  shrunk_at = _FirstStepTime(records, shrink['first_step'])
  grown_at = _FirstStepTime(records, grow['first_step'])
  return dict(
      startup_secs=_StartupSecs(log_path),
      before=_Median(rates, 0, marks['loss']),
      shrunk=_Median(rates, shrunk_at, marks['return']),
      after=_Median(rates, grown_at, float('inf')),
      shrink_secs=shrink['secs'], shrink_redone=shrink['steps_redone'],
      kill_to_first_step=shrunk_at - marks['loss'],
      grow_secs=grow['secs'], grow_redone=grow['steps_redone'],
      shapes=[shrink['old'], shrink['new'], grow['new']],
      marks=dict(marks, shrunk=shrunk_at, grown=grown_at),
      rates=rates, steps=len(records), losses=compared)


def _ReferenceRecords(model, args, workdir):
  """The step log of an uninterrupted run in the starting shape."""
  logdir = os.path.join(workdir, 'reference')
  log_path = logdir + '.log'
  proc = _Trainer(_CommonFlags(model, logdir, args) + _ShapeFlags(args) + [
      '--worker_processes=%d' % args.workers], log_path)
  try:
    _Finish(proc, log_path, args.timeout_secs)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return _Steps(logdir)


def CompareLosses(records, reference):
  """How far a run's losses are from an uninterrupted run's, step by step.

  Args:
    records: the run's step log (one history: redone steps replace theirs).
    reference: the uninterrupted run's step log.

  Returns:
    dict(steps: the steps both logged, max_relative: the largest
    |loss - reference| / |reference| over them, at_step: where).
  """
  want = {r['step']: r['loss'] for r in reference}
  got = {r['step']: r['loss'] for r in records}  # A step's newest record.
  worst, at = 0.0, None
  steps = 0
  for step in sorted(got):
    if step not in want:
      continue
    steps += 1
    if not (math.isfinite(got[step]) and math.isfinite(want[step])):
      return dict(steps=steps, max_relative=math.inf, at_step=step)
    rel = abs(got[step] - want[step]) / max(abs(want[step]), 1e-30)
    if rel >= worst:
      worst, at = rel, step
  return dict(steps=steps, max_relative=worst if steps else None,
              at_step=at)


def _MicroBatchesPerStep(shape):
  """R x M of a shape's label ('R=2 K=2 M=2 gpipe')."""
  found = dict(re.findall(r'\b([RM])=(\d+)', shape))
  return int(found.get('R', 1)) * int(found.get('M', 1))


def _WorkerPids(log_path, count):
  found = re.search(r'pids \[([\d, ]+)\]', _Read(log_path))
  if not found:
    return None
  pids = [int(p) for p in found.group(1).split(',')]
  return pids if len(pids) == count else None


def Restart(model, args, workdir):
  """Scenario 2: a local worker restarted in place; its seconds."""
  logdir = os.path.join(workdir, 'restart')
  log_path = logdir + '.log'
  proc = _Trainer(_CommonFlags(model, logdir, args) + _ShapeFlags(args) + [
      '--worker_processes=%d' % args.workers, '--max_worker_restarts=1',
      '--elastic'],
                  log_path)
  try:
    pids = _WaitFor('the workers',
                    lambda: _WorkerPids(log_path, args.workers), proc,
                    log_path, args.timeout_secs)
    _WaitFor('step %d' % args.loss_step,
             lambda: len(_Steps(logdir)) >= args.loss_step, proc, log_path,
             args.timeout_secs)
    killed = time.time()
    os.kill(pids[-1], signal.SIGKILL)
    _Finish(proc, log_path, args.timeout_secs)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  events = elastic_lib.ReadEvents(logdir)
  if [e['kind'] for e in events] != ['restart']:
    raise ElasticBenchmarkError('expected one restart, got %s:\n%s' % (
        [e['kind'] for e in events], _Read(log_path)[-3000:]))
  first = _FirstStepTime(_Steps(logdir), events[0]['first_step'])
  return dict(startup_secs=_StartupSecs(log_path), secs=events[0]['secs'],
              redone=events[0]['steps_redone'],
              kill_to_first_step=first - killed)


# The rebalancing run traces every TRACE_EVERY-th step. A traced step costs
# more, and so does the next record's interval: the trainer turns the trace
# into TensorBoard's timeline image and a trace file after the traced step's
# record. Its step times are of the other steps.
TRACE_EVERY = 4


def _StepSecs(records, start_step, end_step, skip_every=0):
  """Median seconds of the steps in (start_step, end_step].

  Args:
    records: step-log records (with 'time').
    start_step: steps after this one...
    end_step: ...up to this one count.
    skip_every: leave out the steps that are multiples of it (traced) and
      the steps right after them (the trace's processing).
  """
  secs = [b['time'] - a['time'] for a, b in zip(records, records[1:])
          if b['step'] == a['step'] + 1 and start_step < b['step'] <= end_step
          and not (skip_every and b['step'] % skip_every in (0, 1))]
  return statistics.median(secs) if secs else None


def _ThrottledRun(model, args, logdir, extra, watch, throttle=True):
  """One run on 2 pinned workers, worker 1 under the CPU quota."""
  log_path = logdir + '.log'
  proc = _Trainer(_CommonFlags(model, logdir, args) + [
      '--worker_processes=2', '--pin_cores'] + extra, log_path)
  quota = None
  try:
    pids = _WaitFor('the workers', lambda: _WorkerPids(log_path, 2), proc,
                    log_path, args.timeout_secs)
    if throttle:
      quota = cpu_quota.CpuQuota('gpipe_elastic_bench_%d' % os.getpid(),
                                 args.throttle_cores)
      quota.Add(pids[1])
    if watch:
      _WaitFor('a rebalance', lambda: elastic_lib.ReadEvents(logdir), proc,
               log_path, args.timeout_secs)
    _Finish(proc, log_path, args.timeout_secs)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    if quota is not None:
      quota.Remove()
  return _Steps(logdir), log_path


def _CutOverride(model, cut):
  """--model_params_override text that sets every pipeline's cut."""
  paths = [path for path, _ in model_select.FindPipelines(
      model_select.ModelParams(model))]
  return '; '.join('%s.num_stages=%d; %s.stage_sizes=%s' % (
      p, len(cut), p, list(cut)) for p in paths)


def Throttled(model, args, workdir):
  """Scenario 3: the step before and after rebalancing, and static cuts."""
  logdir = os.path.join(workdir, 'throttled')
  records, log_path = _ThrottledRun(
      model, args, logdir,
      ['--elastic', '--trace_every_n_steps=%d' % TRACE_EVERY], True)
  events = [e for e in elastic_lib.ReadEvents(logdir)
            if e['kind'] == 'rebalance']
  if not events:
    raise ElasticBenchmarkError('no rebalance:\n%s' % _Read(log_path)[-3000:])
  move = events[0]
  # Steps after warm-up (the first checkpoint period) up to the move, and
  # after the move's first step plus one.
  before = _StepSecs(records, args.checkpoint_every, move['checkpoint_step'],
                     TRACE_EVERY)
  after = _StepSecs(records, move['first_step'] + 1, args.steps, TRACE_EVERY)
  static = {}
  for name, cut, throttle in (('old', move['old_cut'], True),
                              ('new', move['new_cut'], True),
                              ('unthrottled', move['old_cut'], False)):
    run, _ = _ThrottledRun(
        model, args, os.path.join(workdir, 'static_%s' % name),
        _Override(args, _CutOverride(model, cut)), False,
        throttle=throttle)
    static[name] = _StepSecs(run, args.checkpoint_every, args.steps)
  return dict(old_cut=move['old_cut'], new_cut=move['new_cut'],
              factors=move.get('factors'), before=before, after=after,
              predicted=(before / move['predicted_gain']
                         if before and move.get('predicted_gain') else None),
              static_old=static['old'], static_new=static['new'],
              unthrottled=static['unthrottled'],
              move_secs=move['secs'],
              rates=_Rates(records, _Batch(model), {move['first_step']}),
              moved_at=_FirstStepTime(records, move['first_step']))


def _Fmt(value, spec='%.1f'):
  return spec % value if value is not None else '-'


def _LossColumn(losses):
  if not losses or not losses['steps']:
    return '-'
  text = '%.1e (%d steps)' % (losses['max_relative'], losses['steps'])
  if losses.get('rm_kept') is False:
    text += ', R x M changed'
  return text


def Elastic(args):
  """A lost, a returned and a throttled worker (see the module doc)."""
  models = [m for m in args.models.split(',') if m] or list(MODELS)
  if args.workers < 2:
    raise ElasticBenchmarkError('--workers=%d: a run that loses a worker '
                                'needs 2 or more' % args.workers)
  for flag in _ShapeFlags(args):
    if flag.split('=')[0] in ('--model_params_override', '--worker_processes',
                              '--cluster_spec', '--elastic', '--model',
                              '--logdir'):
      raise ElasticBenchmarkError(
          '--shape_flags may not set %s (the benchmark sets it; use '
          '--model_params_override for the model)' % flag.split('=')[0])
  title, info = report.Header('--elastic: a lost, a returned and a slow worker',
                              dict(models=','.join(models), steps=args.steps,
                                   loss_step=args.loss_step,
                                   return_after=args.return_after,
                                   checkpoint_every=args.checkpoint_every,
                                   throttle_cores=args.throttle_cores,
                                   workers=args.workers,
                                   shape_flags=' '.join(_ShapeFlags(args)),
                                   model_params_override=(
                                       args.model_params_override),
                                   compare_losses=args.compare_losses))
  results = []
  for model in models:
    workdir = tempfile.mkdtemp(prefix='gpipe_elastic_bench_')
    result = dict(model=model)
    for name, fn in (('loss_and_return', LossAndReturn),
                     ('restart', Restart), ('throttled', Throttled)):
      if name not in args.scenarios.split(','):
        continue
      report.Log('%s: %s (%s)' % (model, name, workdir))
      os.makedirs(os.path.join(workdir, name))
      try:
        result[name] = fn(model, args, os.path.join(workdir, name))
      except ElasticBenchmarkError as e:  # The other runs still report.
        report.Log('%s: %s failed: %s' % (model, name, e))
        result.setdefault('errors', {})[name] = str(e)[-2000:]
    results.append(result)
  lines = [title]
  rows = []
  for r in results:
    lr = r.get('loss_and_return')
    if lr:
      rows.append([r['model'], ' -> '.join(lr['shapes']),
                   _Fmt(lr['before']), _Fmt(lr['shrunk']), _Fmt(lr['after']),
                   _Fmt(lr['startup_secs']), _Fmt(lr['kill_to_first_step']),
                   _Fmt(lr['shrink_secs']), lr['shrink_redone'],
                   _Fmt(lr['grow_secs']), lr['grow_redone'],
                   _LossColumn(lr.get('losses'))])
  if rows:
    lines += ['### A worker lost, then back (%d workers from a cluster '
              'file)' % args.workers,
              '', report.Table(
                  ['model', 'shapes', 'ex/s before', 'ex/s shrunk',
                   'ex/s after return', 'start-up s', 'kill to first step s',
                   'noticed to first step s', 'steps redone',
                   'grow: move to first step s', 'steps redone',
                   'loss vs uninterrupted, max rel.'], rows), '',
              '"kill to first step" is measured from outside (the kill to '
              'the step log\'s first record on the new shape); "noticed" '
              'starts when the trainer found the task lost (its '
              '`trainer/recovery_secs`). The last column compares every '
              'step\'s loss with an uninterrupted run in the starting shape '
              '(R x M is kept by every move).', '']
  rows = [[r['model'], _Fmt(r['restart']['startup_secs']),
           _Fmt(r['restart']['kill_to_first_step']),
           _Fmt(r['restart']['secs']), r['restart']['redone']]
          for r in results if r.get('restart')]
  if rows:
    lines += ['### A local worker restarted in place (same shape)', '',
              report.Table(['model', 'start-up s', 'kill to first step s',
                            'noticed to first step s', 'steps redone'],
                           rows), '']
  rows = []
  for r in results:
    t = r.get('throttled')
    if t:
      rows.append([r['model'], '%s -> %s' % (t['old_cut'], t['new_cut']),
                   _Fmt(t['before'] and 1e3 * t['before']),
                   _Fmt(t['after'] and 1e3 * t['after']),
                   _Fmt(t['predicted'] and 1e3 * t['predicted']),
                   _Fmt(t['static_old'] and 1e3 * t['static_old']),
                   _Fmt(t['static_new'] and 1e3 * t['static_new']),
                   _Fmt(t['unthrottled'] and 1e3 * t['unthrottled'])])
  if rows:
    lines += ['### Worker 1 of 2 held to %g core(s)' % args.throttle_cores,
              '', report.Table(
                  ['model', 'cut', 'step ms before', 'step ms after',
                   'predicted ms', 'static old cut ms', 'static new cut ms',
                   'old cut unthrottled ms'], rows), '',
              'Steps of the rebalancing run leave out its traced ones (every '
              '%d-th) and the ones after them (the trace is processed '
              'then); the static runs trace none.' % TRACE_EVERY, '']
  for r in results:
    for name, error in sorted(r.get('errors', {}).items()):
      lines += ['%s: %s failed: %s' % (r['model'], name,
                                       error.strip().splitlines()[-1]), '']
  print('\n'.join(lines))

  report.Write(args, dict(machine=info, results=results),
               lambda plt: Plot(results, plt))


def Plot(results, plt):
  """examples/s over time with the events marked: one panel per run."""
  panels = [(r['model'], name, r[name]) for r in results
            for name in ('loss_and_return', 'throttled') if r.get(name)]
  if not panels:
    return None  # The restart run alone: nothing over time to draw.
  fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)),
                           squeeze=False)
  for ax, (model, name, data) in zip(axes[:, 0], panels):
    t0 = data['rates'][0][0] if data['rates'] else 0
    ax.plot([t - t0 for t, _ in data['rates']],
            [r for _, r in data['rates']], '.', markersize=3)
    marks = (data['marks'] if name == 'loss_and_return'
             else {'moved': data['moved_at']})
    for label, when in marks.items():
      if when:
        ax.axvline(when - t0, color='gray', linestyle='--')
        ax.annotate(label, (when - t0, ax.get_ylim()[1]), fontsize=8,
                    rotation=90, va='top')
    ax.set_title('%s: %s' % (model, name.replace('_', ' ')))
    ax.set_xlabel('seconds since the first step')
    ax.set_ylabel('examples/s')
  return fig
