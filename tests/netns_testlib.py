"""Helpers for the trainer tests on network-namespace hosts (tools/netlab).

The trainer runs in the lab's client namespace as its own process (its gRPC
connections must start there); the reference runs use local worker
processes in this process's namespace.
"""

import subprocess
import sys

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
  """Runs the trainer in the lab's client host; returns CompletedProcess."""
  return subprocess.run(
      lab.Command(lab.client, trainer_testlib.TrainerCommand(*args)),
      cwd=netns.ROOT, env=netns.ChildEnvironment(), capture_output=True,
      text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def PopenTrainer(lab, args, log_path):
  """Starts the trainer in the lab's client host, output into log_path."""
  return lab.Popen(lab.client, trainer_testlib.TrainerCommand(*args),
                   log_path=log_path)


def ReadFile(path):
  with open(path) as f:
    return f.read()


def WaitFor(proc, log_path, ready, what, timeout=240):
  """Polls ready() until it is true (``polling.WaitUntil``).

  Args:
    proc: the trainer's Popen; its exit fails the wait at once.
    log_path: its output, shown when the wait fails.
    ready: a function returning true when the awaited state is reached.
    what: the awaited state, for the failure message.
    timeout: seconds before failing.

  Returns:
    The true value ready() returned.

  Raises:
    AssertionError: the trainer exited, or `timeout` passed, first.
  """
  return polling.WaitUntil(ready, what, timeout_secs=timeout, process=proc,
                           details=lambda: ReadFile(log_path))
