"""Helpers for the trainer tests: run tools.trainer in-process or as binary."""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tempfile

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import flags
from absl.testing import flagsaver
import numpy as np
from gpipe.runtime import child_env
from gpipe.runtime import forked_workers
from tests import polling
from tests import procfs
from tools.trainer import checkpoints
from tools.trainer import cli
from tools.trainer import progress
from tools.trainer import summaries

if not flags.FLAGS.is_parsed():
  # Under pytest nobody parses the flags: use their defaults (tf.test.main
  # parses them again when the file runs as a test binary).
  flags.FLAGS.mark_as_parsed()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = 'toy.PipelinedDigitsMlp'
# The toy model widened to 512-unit layers on a batch of 512 and cut by
# flops: its stages' work outweighs a step's fixed costs (the rebalancing
# tests, whose throttled stage must show in the step).
WIDE_TOY = (
    'task.network.layers[0].output_dim=512; '
    'task.network.layers[1].input_dim=512; '
    'task.network.layers[1].output_dim=512; '
    'task.network.layers[2].input_dim=512; '
    'task.network.layers[2].output_dim=512; '
    'task.network.layers[3].input_dim=512; input.batch_size=512; '
    'task.network.partition_cost=flops; '
    'task.network.input_shapes=[[128, 64]]')


def RunInProcess(**flag_values):
  """Runs the trainer in-process; returns (exit code, stdout, stderr)."""
  out, err = io.StringIO(), io.StringIO()
  with flagsaver.flagsaver(**flag_values), contextlib.redirect_stdout(
      out), contextlib.redirect_stderr(err):
    code = cli.main(['trainer'])
  return code, out.getvalue(), err.getvalue()


def StepLog(logdir):
  """The records of a run's step log (tools/trainer/progress.py)."""
  return progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))


def Losses(logdir, *fields):
  """[(step, loss, *fields)] of each record of a run's step log.

  Args:
    logdir: the run directory.
    *fields: more fields of each record to return, e.g. 'accuracy'.

  Returns:
    A list of tuples, in the log's order.
  """
  names = ('step', 'loss') + fields
  return [tuple(r[name] for name in names) for r in StepLog(logdir)]


def ResumableFlags(checkpoint_every_n_steps):
  """The trainer's flags for the toy model run to be stopped and resumed.

  Quiet (no console lines, traces or final evaluation), checkpointing every
  `checkpoint_every_n_steps`; --logdir and --max_steps are the caller's.

  Args:
    checkpoint_every_n_steps: the checkpoint period.

  Returns:
    A list of command-line flags.
  """
  return ['--%s=%s' % (name, str(value).lower() if isinstance(value, bool)
                       else value)
          for name, value in ResumableSettings(
              checkpoint_every_n_steps).items()]


def ResumableSettings(checkpoint_every_n_steps):
  """ResumableFlags as flag values, for RunInProcess."""
  return dict(model=TOY, checkpoint_every_n_steps=checkpoint_every_n_steps,
              log_every_n_steps=1000, trace_every_n_steps=0,
              eval_after_train=False)


def UninterruptedLosses(logdir, max_steps, checkpoint_every_n_steps):
  """Trains ResumableFlags' run to `max_steps` in this process, uninterrupted.

  The reference a stopped and resumed run must equal bit for bit (same
  data order, dropout masks and optimizer state).

  Args:
    logdir: a fresh run directory.
    max_steps: the last step.
    checkpoint_every_n_steps: the checkpoint period of the run compared.

  Returns:
    Losses(logdir, 'accuracy'): [(step, loss, accuracy)] of every step.

  Raises:
    AssertionError: the run failed (with its stderr).
  """
  code, _, err = RunInProcess(
      logdir=logdir, max_steps=max_steps,
      **ResumableSettings(checkpoint_every_n_steps))
  if code:
    raise AssertionError('the uninterrupted run failed (%d): %s' % (code, err))
  return Losses(logdir, 'accuracy')


def OnePipelineFloat64Losses(logdir, max_steps):
  """The elastic runs' reference: one pipeline of 4 micro-batches, here.

  The toy model in float64 (params/toy.py FLOAT64_OVERRIDE), uninterrupted:
  every shape an --elastic run of R x M = 4 moves to has these losses, up
  to the order of floating-point sums.

  Args:
    logdir: a fresh run directory.
    max_steps: the last step.

  Returns:
    Losses(logdir): [(step, loss)] of every step.

  Raises:
    AssertionError: the run failed (with its stderr).
  """
  from params import toy  # pylint: disable=g-import-not-at-top
  code, _, err = RunInProcess(
      logdir=logdir, max_steps=max_steps, num_micro_batches=4,
      model_params_override=toy.FLOAT64_OVERRIDE,
      **ResumableSettings(100000))
  if code:
    raise AssertionError('the reference run failed (%d): %s' % (code, err))
  return Losses(logdir)


def AssertFasterAfterTheMoveWithUninterruptedLosses(test, logdir, move, steps,
                                                    reference_logdir):
  """A WIDE_TOY run's rebalance `move` made it faster and kept its losses.

  The traced steps after the move take less time than before it (the first
  traced step of each run left out: it builds and warms up), and every loss
  equals an uninterrupted run's (the trainer on two local worker processes,
  in `reference_logdir`).

  Args:
    test: the TestCase.
    logdir: the rebalanced run's logdir (its summaries and step log).
    move: its rebalance event (tools.trainer.elastic.ReadEvents).
    steps: the steps it trained.
    reference_logdir: a fresh logdir for the uninterrupted run.
  """
  spans = summaries.Read(logdir)['pipeline/span_sec']
  before = [v for s, v in spans if 2 < s <= move['checkpoint_step']]
  after = [v for s, v in spans if s > move['first_step']]
  test.assertLess(np.median(after), 0.8 * np.median(before), (before, after))
  # On two worker processes as the moved run's stages are: a worker runs an
  # op on one thread, this process on its pool, and on the machine of
  # 2026-11-28 the in-process run's losses left the workers' by 4e-5 at
  # step 6, before any move (both rebalancing tests failed on it). A
  # trainer process (Run), as the moved run is: forked from the fork server
  # that imported the trainer for that run, its workers forks too, where
  # this process's first local workers would wait for a fork server of
  # their own to import TensorFlow (about 9 s).
  done = Run(ResumableFlags(1000) + [
      '--logdir=' + reference_logdir, '--max_steps=%d' % steps,
      '--model_params_override=' + WIDE_TOY, '--worker_processes=2'])
  test.assertEqual(0, done.returncode, (done.stdout + done.stderr)[-6000:])
  got, want = Losses(logdir), Losses(reference_logdir)
  test.assertEqual([s for s, _ in want], [s for s, _ in got])
  test.assertAllClose([l for _, l in want], [l for _, l in got], rtol=1e-5)


def TrainerCommand(*args, module='tools.trainer'):
  """The command line of the trainer binary with `args`.

  Args:
    *args: the trainer's flags.
    module: the binary's module: the trainer, or a probe wrapping it (e.g.
      tests.trainer_signal_probe).
  """
  return [sys.executable, '-m', module] + list(args)


def Environment():
  """The environment for a trainer subprocess (repository on the path)."""
  env = child_env.Environment()
  # The tests read the log while the trainer runs.
  env['PYTHONUNBUFFERED'] = '1'
  return env


# What a forked trainer's fork server imports once (TensorFlow, Lingvo, the
# trainer and every registered model): a trainer as a command spends about
# 6 CPU-seconds importing them, and its local workers' fork server 3 more.
PRELOAD = ('tools.trainer.cli', 'params.image', 'params.mt', 'params.toy')


def _Start(args, log_path, err_path, module):
  """The trainer's process: a fork of a fork server, else a command.

  A forked trainer (gpipe.runtime.forked_workers.StartProgram) runs as
  `python -m module args` would, from a process that imported the trainer
  once; its workers are forks too. GPIPE_FORK_WORKERS=0 makes it a command.

  Args:
    args: the trainer's flags.
    log_path: its stdout (and stderr unless err_path).
    err_path: its stderr, or None.
    module: the binary's module (TrainerCommand).

  Returns:
    A subprocess.Popen, or a forked_workers.ForkedProcess (the same calls).
  """
  if forked_workers.Supported():
    try:
      return forked_workers.StartProgram(
          module, list(args), log_path, err_path=err_path, env=Environment(),
          cwd=ROOT, preload=PRELOAD)
    except forked_workers.ForkServerError as e:
      print('trainer_testlib: %s; the trainer starts as a command' % e,
            file=sys.stderr)
  with contextlib.ExitStack() as files:
    out = files.enter_context(open(log_path, 'w'))
    err = files.enter_context(open(err_path, 'w')) if err_path else None
    return subprocess.Popen(
        TrainerCommand(*args, module=module), cwd=ROOT, env=Environment(),
        stdout=out, stderr=err or subprocess.STDOUT,
        stdin=subprocess.DEVNULL)


def Popen(args, log_path, module='tools.trainer'):
  """Starts the trainer with `args`, stdout and stderr into log_path."""
  return _Start(args, log_path, None, module)


def StepsAfterCheckpoint(logdir, low=2, high=5):
  """Whether the run is low < n <= high steps past its newest checkpoint.

  A worker (or the trainer) killed then loses those steps: a resumed run
  must redo them.
  """
  newest = checkpoints.Newest(logdir)
  records = StepLog(logdir)
  if not newest or not records:
    return False
  return low < records[-1]['step'] - checkpoints.GlobalStepOf(newest) <= high


def KillProcess(pid):
  """SIGKILLs process `pid` (a worker the test loses), without waiting."""
  os.kill(pid, signal.SIGKILL)


Alive = procfs.Alive


def WaitGone(pid, why='', timeout=60):
  """Polls until process `pid` has exited (``polling.WaitUntil``).

  Args:
    pid: the process.
    why: why it should exit, for the failure message.
    timeout: seconds before failing.

  Raises:
    AssertionError: `pid` still runs after `timeout` seconds.
  """
  polling.WaitUntil(lambda: not Alive(pid),
                    'process %d to exit%s' % (pid, why and ' (%s)' % why),
                    timeout_secs=timeout, interval_secs=0.1)


def Kill(pids):
  """Kills the given processes (those still running) and waits for them."""
  for pid in pids:
    try:
      KillProcess(pid)
    except OSError:
      pass
  for pid in pids:
    WaitGone(pid, timeout=10)


class TrainerProcess:
  """A trainer child process that a test waits on and kills workers of.

  A context manager: on leaving it, a trainer still running is killed and
  reaped, so a failed test leaves no process behind.

  Attributes:
    proc: the trainer's subprocess.Popen.
    log_path: the file holding its stdout and stderr.
  """

  def __init__(self, args, log_path, module='tools.trainer', proc=None):
    """Starts the trainer.

    Args:
      args: the trainer's flags.
      log_path: where its output goes.
      module: the binary's module (TrainerCommand).
      proc: an already started trainer (e.g. in another network
        namespace) to wrap instead; `args` and `module` are then unused.
    """
    self.log_path = log_path
    self.proc = proc or Popen(args, log_path, module=module)

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()

  @property
  def returncode(self):
    return self.proc.returncode

  def Log(self):
    """Its output so far."""
    return ReadLog(self.log_path)

  def WaitFor(self, ready, what, timeout_secs=240.0, interval_secs=0.05):
    """Polls `ready()` while the trainer runs (``polling.WaitUntil``).

    Args:
      ready: a callable polled until it returns a true value.
      what: what is awaited, for the failure message.
      timeout_secs: give up after this many seconds.
      interval_secs: the pause between two polls.

    Returns:
      The true value `ready()` returned.

    Raises:
      AssertionError: the trainer exited, or the time ran out, first (the
        message ends with its output).
    """
    return polling.WaitUntil(ready, what, timeout_secs=timeout_secs,
                             interval_secs=interval_secs, process=self.proc,
                             details=self.Log)

  def WaitForLog(self, pattern, what):
    """Waits until the output matches regex `pattern`; returns the match."""
    return self.WaitFor(lambda: re.search(pattern, self.Log()), what)

  def WorkerPids(self, pattern=r'pids \[([\d, ]+)\]'):
    """Waits for the pids of the workers it started; returns them.

    Args:
      pattern: a regex whose first group lists the pids (by default the
        line of --worker_processes' start).

    Returns:
      The pids, in task order.
    """
    found = self.WaitForLog(pattern, 'the worker processes\' pids')
    return [int(p) for p in found.group(1).split(',')]

  def WaitForStepsAfterCheckpoint(self, logdir, low=2, high=5):
    """Waits for StepsAfterCheckpoint; returns the checkpoint's step."""
    self.WaitFor(lambda: StepsAfterCheckpoint(logdir, low, high),
                 'a checkpoint and %d to %d steps after it' % (low + 1, high))
    return checkpoints.GlobalStepOf(checkpoints.Newest(logdir))

  def Wait(self, timeout_secs=300):
    """Waits for the trainer to exit; returns (exit code, output).

    Args:
      timeout_secs: seconds to allow (less if Bazel's limit for the test
        comes sooner, see polling.TimeLimit).

    Raises:
      subprocess.TimeoutExpired: it still runs after that.
    """
    self.proc.wait(timeout=polling.TimeLimit(timeout_secs)[0])
    return self.proc.returncode, self.Log()


def ReadLog(path):
  """The text of a log file written by a trainer subprocess."""
  with open(path) as f:
    return f.read()


def Run(args, timeout=300, module='tools.trainer'):
  """Runs the trainer to completion; returns the CompletedProcess.

  Args:
    args: the trainer's flags.
    timeout: seconds to allow (less if Bazel's limit for the test comes
      sooner, see polling.TimeLimit).
    module: the binary's module (TrainerCommand).

  Returns:
    A subprocess.CompletedProcess with text stdout and stderr.

  Raises:
    AssertionError: the trainer was still running at the deadline; the
      message says which limit that was and ends with the trainer's last
      output and its threads' stacks.
  """
  limit, reason = polling.TimeLimit(timeout)
  with tempfile.TemporaryDirectory() as outputs:
    out, err = (os.path.join(outputs, n) for n in ('stdout', 'stderr'))
    proc = _Start(args, out, err, module)
    try:
      proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
      # The trainer prints every thread's stack on SIGUSR1 (faulthandler).
      proc.send_signal(signal.SIGUSR1)
      try:
        proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        pass
      proc.kill()
      proc.wait()
      raise AssertionError(
          'the trainer (%s) was still running after %.0f s (%s); its last '
          'output:\n%s' % (' '.join(args), limit, reason,
                           (ReadLog(out) + ReadLog(err))[-6000:])) from None
    return subprocess.CompletedProcess(
        TrainerCommand(*args, module=module), proc.returncode, ReadLog(out),
        ReadLog(err))
