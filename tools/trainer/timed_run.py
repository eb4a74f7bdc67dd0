"""A few timed steps of the trainer binary on a plan, in a child process.

The plan benchmark times the configurations it checks this way
(``tools/benchmark/plan_trainer.py``): the trainer itself (``StepSeconds``:
``python -m tools.trainer --plan=FILE``), on the pinned local worker
processes the planner's figures are for, logging every few steps as a run
does, its checkpoints out of the way.

The planner times its reference configurations (``tools/plan/
trainer_step.py``) with ``TrainerRuns``: one child process
(``python -m tools.trainer.timed_run``, the trainer's flags and ``--plans``)
starts the workers once and runs the trainer's own training (``cli.Main``:
its placement, graph, session and loop) on each plan in turn on those same
workers, each in a logdir of its own. It is started before the plans exist
(they are sent on its stdin), so its start overlaps the planner's
measuring of the layers. A trainer's start (its imports and its
workers: a third to a half of a short run's time) is paid once, not once
per configuration. The first configuration's graph is built ahead, while
the layers are measured (``WarmUp``, ``TrainLoop.BuildAhead``); each other
configuration builds its graph and every one pays its first steps as a run
of its own does.
"""

import dataclasses
import glob
import math
import os
import subprocess
import sys
import time
import traceback

from gpipe.measure import timeline
from gpipe.runtime import child_env
from tools.trainer import progress

# Steps between progress lines: each line's examples/s gives its interval's
# mean step, with the console, step-log and TensorBoard flushes a run pays.
LOG_EVERY = 4
# A model of a few milliseconds a step logs less often (``IntervalSteps``):
# an interval of at least this long, at most this many steps.
MIN_INTERVAL_SECONDS = 0.2
MAX_INTERVAL_STEPS = 128


def IntervalSteps(step_seconds, min_seconds=MIN_INTERVAL_SECONDS):
  """Steps between progress lines for a step of about `step_seconds`.

  Four steps of a few milliseconds are timed to within a few tens of
  percent only (the console and summary flushes of each line, the clock's
  and the scheduler's granularity): such a step is timed over an interval of
  at least `min_seconds`.

  Args:
    step_seconds: the step's expected length (a prediction will do).
    min_seconds: the shortest interval wanted.

  Returns:
    A multiple of LOG_EVERY in [LOG_EVERY, MAX_INTERVAL_STEPS].
  """
  wanted = min_seconds / max(step_seconds, 1e-6)
  steps = LOG_EVERY * int(math.ceil(wanted / LOG_EVERY))
  return int(min(max(steps, LOG_EVERY), MAX_INTERVAL_STEPS))

# The repository: the children's working directory and path.
ROOT = child_env.ROOT

# What the child of ``TracedRuns`` prints before each plan's run, and where
# that run's logdir is under the child's --logdir.
PLAN_MARKER = 'timed_run: plan %d'
# What it prints when that plan's run ended (its logdir flushed).
DONE_MARKER = 'timed_run: plan %d ended'
RUN_DIR = 'run_%d'


def Environment():
  """This process's environment with the repository on PYTHONPATH."""
  return child_env.Environment()


class TimedRunError(RuntimeError):
  """The trainer failed or printed no step times; the text says why."""


class _FailedAfterRuns(TimedRunError):
  """Every run printed its steps, then the child failed: `results` has them."""

  def __init__(self, message, results):
    super().__init__(message)
    self.results = results


def StepSeconds(model, plan_path, workers, batch, warmup, steps, logdir,
                override='', timeout=None, log_every=LOG_EVERY):
  """The mean step (seconds) of each logged interval after `warmup` steps.

  No step is traced (``TracedStepSeconds`` traces one).

  Args:
    model: the registered model.
    plan_path: a plan file (``--plan=FILE``) for `workers` devices.
    workers: local worker processes, pinned one per core.
    batch: examples per step.
    warmup: steps left out (a multiple of `log_every` keeps intervals
      whole).
    steps: steps timed after them.
    logdir: the run's directory.
    override: --model_params_override text.
    timeout: seconds the trainer may take, or None.
    log_every: steps between progress lines (``IntervalSteps``).

  Returns:
    A list of seconds, one per logged interval.

  Raises:
    TimedRunError: the trainer timed out, failed or printed no step times
      (with its last line).
  """
  return _Run(model, plan_path, workers, batch, warmup, steps, logdir,
              override, timeout, trace=False, log_every=log_every)


def TracedStepSeconds(model, plan_path, workers, batch, warmup, steps,
                      logdir, override='', timeout=None):
  """``StepSeconds``, and the stage tasks of the run's second step, traced.

  The trainer traces its second step (``--trace_every_n_steps`` beyond the
  run's end: no other), which lies in the `warmup` steps (at least 2) left
  out of the timed intervals.

  Returns:
    (seconds per logged interval, that step's timeline.TaskTimes: empty
    when it ran no pipeline stage).

  Raises:
    TimedRunError: as ``StepSeconds``, or `warmup` < 2.
  """
  if warmup < 2:
    raise TimedRunError('the traced step is the second: warm up for at '
                        'least 2 steps, not %d' % warmup)
  seconds = _Run(model, plan_path, workers, batch, warmup, steps, logdir,
                 override, timeout, trace=True)
  return seconds, _TracedTasks(logdir)


def _Args(model, workers, total, logdir, override, trace,
          log_every=LOG_EVERY):
  """The trainer's flags of a timed run of `total` steps."""
  args = ['--model=' + model, '--logdir=' + logdir,
          '--worker_processes=%d' % workers, '--pin_cores',
          '--eval_after_train=false'] + _StepFlags(total, log_every, trace)
  if override:
    args.append('--model_params_override=' + override)
  return args


class TrainerRuns:
  """One child process training on several plans in turn, on the same workers.

  The child (this module's ``main``) imports the trainer and starts
  `workers` pinned local worker processes as soon as it is created, then
  waits for plan files on its stdin: ``Run`` sends them and collects each
  run's logged intervals and traced step. The caller may do other work
  meanwhile (the planner measures the layers whose costs the reference
  plans' cuts need). Use as a context manager: the child is killed if it
  is still running at the end.
  """

  def __init__(self, model, workers, warmup, steps, logdir, override='',
               command=None):
    """Starts the child.

    Args:
      model: the registered model.
      workers: local worker processes, pinned one per core.
      warmup: steps left out of each run's timed intervals (at least 2: the
        second is traced).
      steps: steps timed after them.
      logdir: the child's directory (each run's is RUN_DIR under it).
      override: --model_params_override text.
      command: the child's command line, or None for this module's
        ``main`` with the trainer's flags (a test's stand-in speaks its
        protocol: PLAN_MARKER, progress lines, DONE_MARKER per stdin line).

    Raises:
      TimedRunError: `warmup` < 2.
    """
    if warmup < 2 or warmup % LOG_EVERY or steps % LOG_EVERY:
      raise TimedRunError('warm up for at least 2 steps (the second is '
                          'traced) and time whole intervals: multiples of '
                          '%d, not %d and %d' % (LOG_EVERY, warmup, steps))
    self._warmup = warmup
    self._total = warmup + steps
    self._logdir = logdir
    os.makedirs(logdir, exist_ok=True)
    self._output_path = os.path.join(logdir, 'output.txt')
    self._output = open(self._output_path, 'w')
    self._started = time.time()
    args = command or (
        [sys.executable, '-m', 'tools.trainer.timed_run'] +
        _Args(model, workers, self._total, logdir, override, trace=True) +
        ['--plans=-'])
    self._child = subprocess.Popen(
        args, cwd=ROOT, env=Environment(), stdin=subprocess.PIPE,
        stdout=self._output, stderr=subprocess.STDOUT, text=True)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Close()

  def Close(self):
    """Kills the child if it still runs; closes its output."""
    if self._child.poll() is None:
      self._child.kill()
      self._child.wait()
    self._output.close()

  def WarmUp(self, plan_path):
    """Has the child build the first run's training graph while it waits.

    Client work only (one core; nothing runs on the workers). `plan_path`
    must be the configuration of the first plan ``Run`` sends (its
    predictions may differ): that run then takes the graph as built
    (``train_loop.TrainLoop.BuildAhead``); another configuration builds its
    own, as without this.
    """
    try:
      self._child.stdin.write(WARM_UP + plan_path + '\n')
      self._child.stdin.flush()
    except BrokenPipeError:
      pass  # It failed: Run says why.

  def Run(self, plan_paths, batch, timeout=None, log=None, intervals=None,
          again=None):
    """``TracedStepSeconds`` of each plan, run one after another.

    Args:
      plan_paths: plan files, each for the child's workers.
      batch: examples per step.
      timeout: seconds the child may take from now for `plan_paths`' runs,
        or None; a second round (`again`) adds as much per run.
      log: a print-like function, or None.
      intervals: per plan, the steps between progress lines
        (``IntervalSteps``), or None for LOG_EVERY: the run's warm-up and
        timed steps are as many intervals as ``__init__``'s take of four
        steps.
      again: None, or a function called with the results of `plan_paths`'
        runs once they ended (as returned) that returns the indices of the
        plans to run again after them, in that order ([]: none), each with
        its interval; their results follow the others'.

    Returns:
      A list, per run (each of `plan_paths`, then the runs `again` asked
      for), of (seconds per logged interval, the traced step's
      timeline.TaskTimes); only the first round's when a later round
      failed or timed out (logged, the child stopped); all when every run
      ended (its end marker printed) and the child failed after them
      (logged).

    Raises:
      TimedRunError: the child timed out, failed, or printed no step times
        for a plan of the first round, or failed before a run of the first
        round ended (with its last line).
    """
    sent = time.time()
    deadline = None if timeout is None else sent + timeout
    paths = list(plan_paths)
    intervals = list(intervals or [LOG_EVERY] * len(paths))
    self._Send(paths, intervals)
    if again is not None:
      self._AwaitRun(len(paths), deadline, timeout, paths, intervals)
    first = None
    if again is not None and self._child.poll() is None:
      # The same intervals: the rounds' runs are measured alike.
      first = self._Results(paths, intervals, batch)
      repeat = list(again(first))
      if deadline is not None and repeat:
        # As much time per run as the first round had.
        extra = timeout * len(repeat) / len(plan_paths)
        deadline += extra
        timeout += extra
      paths += [paths[k] for k in repeat]
      intervals += [intervals[k] for k in repeat]
      self._Send(paths[len(plan_paths):], intervals[len(plan_paths):])
      if not repeat:
        first = None
    try:
      return self._Finish(paths, intervals, batch, sent, deadline, timeout,
                          log)
    except _FailedAfterRuns as e:
      # Every run ended (its end marker printed), then the child failed.
      if log:
        log('the trainer failed after all its runs ended; their runs '
            'count: %s' % e)
      return e.results
    except TimedRunError as e:
      if first is None:
        raise
      # The first round's runs ended: a failed later round loses nothing
      # of theirs.
      self.Close()
      if log:
        log('the second round of trainer runs failed; the first round\'s '
            'runs count: %s' % e)
      return first

  def _Finish(self, paths, intervals, batch, sent, deadline, timeout, log):
    """Waits for the child's end: ``Run``'s results of all `paths`."""
    try:
      self._child.stdin.close()
    except BrokenPipeError:
      pass  # It failed before reading them: its output says why.
    try:
      self._child.wait(None if deadline is None
                       else max(deadline - time.time(), 0))
    except subprocess.TimeoutExpired as e:
      self.Close()
      raise TimedRunError(_TimedOut(self._Steps(intervals), paths,
                                    timeout)) from e
    out = self._Results(paths, intervals, batch)
    output = self._Output()
    if self._child.returncode:
      lines = [l for l in output.splitlines() if l.strip()]
      last = lines[-1] if lines else 'no output'
      ended = [_Ended(output, i + 1) for i in range(len(paths))]
      if not all(ended):
        # Steps were logged, but a run did not end: its figures may be
        # those of a few intervals.
        raise TimedRunError(
            'the trainer failed before its run %d (of %s) ended (exit '
            'status %d): %s' % (ended.index(False) + 1,
                                paths[ended.index(False)],
                                self._child.returncode, last))
      raise _FailedAfterRuns(
          'the trainer failed after its runs (exit status %d): %s' % (
              self._child.returncode, last), out)
    if log:
      for line in output.splitlines():
        if line.startswith(BUILT_AHEAD_LINE):
          log(line)
      for i, text in enumerate(SplitByPlan(output, len(paths))):
        for line in text.splitlines():
          if line.startswith(('built the training graph',
                              'kept the training graph')):
            log('%s: %s' % (PLAN_MARKER % (i + 1), line))
      log('%d trainer runs in one process took %.1f s after the plans were '
          'sent (%.1f s after it started)' % (
              len(paths), time.time() - sent,
              time.time() - self._started))
    return out

  def _Send(self, paths, intervals):
    """Writes the lines of runs of `paths` on the child's stdin."""
    lines = ['%s\t%d\t%d\n' % (p, self._total * n // LOG_EVERY, n)
             for p, n in zip(paths, intervals)]
    try:
      self._child.stdin.write(''.join(lines))
      self._child.stdin.flush()
    except BrokenPipeError:
      pass  # It failed before reading them: its output says why.

  def _Output(self):
    self._output.flush()
    with open(self._output_path) as f:
      return f.read()

  def _Steps(self, intervals):
    """The most steps of one of the runs logged every `intervals`."""
    return max(self._total * n // LOG_EVERY for n in intervals)

  def _AwaitRun(self, count, deadline, timeout, paths, intervals):
    """Waits until the child ended run `count` (1-based) or exited.

    The marker may end a line that a library's unterminated output began.
    """
    while not _Ended(self._Output(), count):
      if self._child.poll() is not None:
        return  # _Results says why.
      if deadline is not None and time.time() > deadline:
        self.Close()
        raise TimedRunError(_TimedOut(self._Steps(intervals), paths,
                                      timeout))
      time.sleep(0.25)

  def _Results(self, paths, intervals, batch):
    """(seconds per interval, traced tasks) of each run of `paths`."""
    output = self._Output()
    parts = SplitByPlan(output, len(paths))
    out = []
    for i, (path, text) in enumerate(zip(paths, parts)):
      warmup = self._warmup * intervals[i] // LOG_EVERY
      seconds = progress.StepSeconds(text, batch, warmup)
      if not seconds:
        lines = [l for l in (text or output).splitlines() if l.strip()]
        code = self._child.poll()
        raise TimedRunError('the trainer failed with %s (%s): %s' % (
            path, 'exit status %d' % code if code is not None else 'running',
            lines[-1] if lines else 'no output'))
      out.append((seconds, _TracedTasks(os.path.join(self._logdir,
                                                     RUN_DIR % i))))
    return out


def _Ended(output, count):
  """Whether the child's `output` has run `count`'s (1-based) end marker.

  The marker may end a line that a library's unterminated output began.
  """
  marker = DONE_MARKER % count
  return any(l.rstrip().endswith(marker) for l in output.splitlines())


def _TimedOut(steps, paths, timeout):
  """The error of runs of `paths` (up to `steps` each) past `timeout` s."""
  distinct = list(dict.fromkeys(paths))
  return ('the trainer did not finish its %d run(s) of up to %d steps (of %s) '
          'in %d s' % (len(paths), steps, ', '.join(distinct), timeout))


def SplitByPlan(output, count):
  """The child's output of each of `count` plans (PLAN_MARKER lines apart).

  Returns:
    `count` strings; '' for a plan the child did not reach.
  """
  parts = [''] * count
  current = None
  for line in output.splitlines(keepends=True):
    for i in range(count):
      # The marker may end a line a library's unterminated output began.
      if line.rstrip().endswith(PLAN_MARKER % (i + 1)):
        current = i
        break
    else:
      if current is not None:
        parts[current] += line
  return parts


def _TracedTasks(logdir):
  """The stage tasks of the trace the run in `logdir` wrote ([]: none)."""
  paths = sorted(glob.glob(os.path.join(logdir, '**', '*.trace.json'),
                           recursive=True))
  return timeline.ReadChromeTrace(paths[0]) if paths else []


def _StepFlags(total, log_every, trace):
  """The flags of a run's steps: `total`, logged, checkpointed at the end."""
  return ['--max_steps=%d' % total, '--log_every_n_steps=%d' % log_every,
          '--checkpoint_every_n_steps=%d' % (10 * total),
          '--trace_every_n_steps=%d' % (10 * total if trace else 0)]


def _Run(model, plan_path, workers, batch, warmup, steps, logdir, override,
         timeout, trace, log_every=LOG_EVERY):
  """The trainer's logged intervals (see ``StepSeconds``)."""
  total = warmup + steps
  args = ([sys.executable, '-m', 'tools.trainer', '--plan=' + plan_path] +
          _Args(model, workers, total, logdir, override, trace, log_every))
  try:
    done = subprocess.run(args, cwd=ROOT, env=Environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout,
                          check=False)
  except subprocess.TimeoutExpired as e:
    raise TimedRunError('the trainer did not finish %d steps with %s in %d s'
                        % (total, plan_path, timeout)) from e
  seconds = progress.StepSeconds(done.stdout, batch, warmup)
  if done.returncode or not seconds:
    lines = [l for l in done.stdout.splitlines() if l.strip()]
    raise TimedRunError('the trainer failed with %s (exit status %d): %s' % (
        plan_path, done.returncode, lines[-1] if lines else 'no output'))
  return seconds


# A line of the child's stdin asking it to build the next run's training
# graph ahead (``TrainerRuns.WarmUp``), not to train yet; and the start of
# the line it prints then.
WARM_UP = 'warm-up:'
BUILT_AHEAD_LINE = 'timed_run: built the graph of run'


def _Plans(flag, stdin):
  """The plan files of --plans: its list, or ['-']: stdin's lines to EOF.

  A line of stdin may be WARM_UP and a plan file: yielded as it is.
  """
  if list(flag) != ['-']:
    yield from flag
    return
  for line in stdin:
    if line.strip():
      yield line.strip()


def _PlanLine(line):
  """(plan file, max_steps or None, log_every or None) of a stdin line.

  A line is a plan file, or a plan file, its run's steps and the steps
  between its progress lines, tab-separated (``TrainerRuns.Run``).
  """
  parts = line.split('\t')
  if len(parts) == 3:
    return parts[0], int(parts[1]), int(parts[2])
  return line, None, None


def _Main(unused_argv):
  """The child of ``TrainerRuns``: each of --plans on the same workers.

  Ends the process without the interpreter's cleanup, which would close
  the runs' sessions left open on the stopped workers.
  """
  code = 1
  try:
    code = _RunPlans()
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def _RunPlans():
  """_Main's runs; returns the exit status (a failed run's)."""
  # pylint: disable=g-import-not-at-top
  from absl import flags
  from tools.trainer import cli
  from tools.trainer import placement as placement_lib
  from tools.trainer import train_loop
  # pylint: enable=g-import-not-at-top
  flags_ = flags.FLAGS
  if not flags_.plans or not flags_.worker_processes:
    raise ValueError('give --plans and --worker_processes')
  # As the trainer binary's (tools/trainer/__main__.py): each run's session
  # is left open, not closed (which deregisters its graph on every worker:
  # seconds between two runs); the workers stop with the process.
  train_loop.LEAVE_LOCAL_SESSIONS_OPEN = True
  base = flags_.logdir
  echo = lambda *a: print(*a, flush=True)
  workers = placement_lib.StartLocalWorkers(
      flags_.worker_processes, pin_cores=flags_.pin_cores,
      log_dir=os.path.join(base, 'workers'),
      devices_per_task=flags_.devices_per_task)
  try:
    i = 0
    for plan in _Plans(flags_.plans, sys.stdin):
      if plan.startswith(WARM_UP):
        flags_.plan = plan[len(WARM_UP):]
        flags_.logdir = os.path.join(base, RUN_DIR % i)
        _BuildAhead(cli.SettleFromFlags(workers=workers), i, echo)
        continue
      flags_.plan, total, log_every = _PlanLine(plan)
      if total:
        flags_.max_steps = total
        flags_.log_every_n_steps = log_every
        flags_.checkpoint_every_n_steps = 10 * total
        flags_.trace_every_n_steps = 10 * total
      flags_.logdir = os.path.join(base, RUN_DIR % i)
      i += 1
      echo(PLAN_MARKER % i)
      # A reference's plan holds the layers' prediction alone (no trainer
      # part): nothing for the trainer to set beside its speed.
      code = cli.Main(dataclasses.replace(cli.SettleFromFlags(workers=workers),
                                          planned_examples_per_second=None),
                      echo)
      if code:
        return code
      echo(DONE_MARKER % i)
  finally:
    workers.Stop()
  return 0


def _BuildAhead(run, index, echo):
  """Builds the training graph of run `index` (0-based) ahead of its run.

  Nothing runs on a worker: the run's loop takes the graph when its plan
  arrives (``train_loop.TrainLoop.BuildAhead``).
  """
  # pylint: disable=g-import-not-at-top
  from tools.trainer import train_loop
  # pylint: enable=g-import-not-at-top
  started = time.time()
  train_loop.TrainLoop.BuildAhead(run, echo=lambda *a: None)
  echo('%s %d ahead in %.1f s' % (BUILT_AHEAD_LINE, index + 1,
                                  time.time() - started))


def main():
  """``python -m tools.trainer.timed_run``: the trainer's flags, --plans."""
  # pylint: disable=g-import-not-at-top
  from tools.trainer import cli  # First: it makes Lingvo importable.
  from absl import app
  from absl import flags
  from absl import logging
  from lingvo import compat as tf
  from tools.trainer import settings
  # pylint: enable=g-import-not-at-top
  del cli  # Imported for its flags and its imports' order.
  flags.adopt_module_key_flags(settings)
  flags.DEFINE_list('plans', [], 'plan files (--plan=FILE), trained one '
                    "after another on the same local workers; '-': the "
                    'lines of stdin, read as each run ends')
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('WARNING')
  app.run(_Main)


if __name__ == '__main__':
  main()
