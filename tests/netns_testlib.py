"""Helpers for the trainer tests on network-namespace hosts (tools/netlab).

The trainer runs in the lab's client namespace as its own process (its gRPC
connections must start there); the reference runs use local worker
processes in this process's namespace.
"""

import os
import subprocess
import sys
import tempfile

from tests import polling
from tests import trainer_testlib
from tools.netlab import netns

TOY = trainer_testlib.TOY
# The one-way delay the tests add to every link.
DELAY_MS = 5.0
# Trainer flags of every run: no tracing, evaluation or console noise.
QUIET = ['--trace_every_n_steps=0', '--eval_after_train=false',
         '--log_every_n_steps=1000']


def SkipUnlessNamespaces(test):
  """Skips `test` (a TestCase), saying why, where labs cannot be made."""
  reason = netns.Unavailable()
  if reason:
    print('skipped: %s' % reason, file=sys.stderr)
    test.skipTest('network namespaces are not available here: %s' % reason)


def RunTrainer(lab, args, timeout=300):
  """Runs the trainer in the lab's client host; returns CompletedProcess.

  Raises:
    subprocess.TimeoutExpired: it still ran after `timeout` seconds (it is
      killed).
  """
  with tempfile.TemporaryDirectory() as outputs:
    out, err = (os.path.join(outputs, n) for n in ('stdout', 'stderr'))
    proc = PopenTrainer(lab, args, out, err_path=err)
    try:
      proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      raise
    return subprocess.CompletedProcess(
        trainer_testlib.TrainerCommand(*args), proc.returncode,
        ReadFile(out), ReadFile(err))


def PopenTrainer(lab, args, log_path, err_path=None):
  """Starts the trainer in the lab's client host, output into log_path.

  A fork of a process that imported the trainer once (trainer_testlib), or
  a command with GPIPE_FORK_WORKERS=0.
  """
  return lab.StartProgram(lab.client, 'tools.trainer', args, log_path,
                          err_path=err_path, preload=trainer_testlib.PRELOAD)


def ReadFile(path):
  with open(path) as f:
    return f.read()


def WaitFor(proc, log_path, ready, what, timeout=240, interval_secs=0.05):
  """Polls ready() until it is true (``polling.WaitUntil``).

  Args:
    proc: the trainer's Popen; its exit fails the wait at once.
    log_path: its output, shown when the wait fails.
    ready: a function returning true when the awaited state is reached.
    what: the awaited state, for the failure message.
    timeout: seconds before failing.
    interval_secs: the pause between two polls.

  Returns:
    The true value ready() returned.

  Raises:
    AssertionError: the trainer exited, or `timeout` passed, first.
  """
  return polling.WaitUntil(ready, what, timeout_secs=timeout, process=proc,
                           interval_secs=interval_secs,
                           details=lambda: ReadFile(log_path))
