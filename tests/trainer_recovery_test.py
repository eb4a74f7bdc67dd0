"""--max_worker_restarts: a killed worker is replaced and training goes on."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re
import signal
import subprocess
import sys

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling
from tests import trainer_testlib
from tools.trainer import checkpoints
from tools.trainer import summaries

_Log = trainer_testlib.ReadLog
EVERY = 10
FLAGS = trainer_testlib.ResumableFlags(EVERY) + [
    '--worker_processes=2', '--max_steps=1000000']


class TrainerRecoveryTest(test_utils.TestCase):

  def _WaitFor(self, proc, log_path, ready, what):
    polling.WaitUntil(ready, what, process=proc,
                      details=lambda: _Log(log_path))

  def _KillMidInterval(self, proc, logdir, log_path, pid):
    """SIGKILLs `pid` a few steps after a checkpoint: those steps are lost."""

    def Ready():
      newest = checkpoints.Newest(logdir)
      records = trainer_testlib.StepLog(logdir)
      if not newest or not records:
        return False
      return 2 < records[-1]['step'] - checkpoints.GlobalStepOf(newest) <= 5

    self._WaitFor(proc, log_path, Ready, 'checkpoint and steps after it')
    os.kill(pid, signal.SIGKILL)
    return checkpoints.GlobalStepOf(checkpoints.Newest(logdir))

  def testKilledWorkerIsReplacedUntilTheRestartsRunOut(self):
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    proc = trainer_testlib.Popen(
        FLAGS + ['--logdir=' + logdir, '--max_worker_restarts=1'], log_path)
    try:
      self._WaitFor(proc, log_path,
                    lambda: re.search(r'pids \[\d+, \d+\]', _Log(log_path)),
                    'workers')
      first = re.search(r'pids \[(\d+), (\d+)\]', _Log(log_path))
      resume_step = self._KillMidInterval(proc, logdir, log_path,
                                          int(first.group(2)))
      # Training goes on with fresh workers from the newest checkpoint.
      restarted = r'restarted 2 worker processes \(pids \[(\d+), (\d+)\]\)'
      self._WaitFor(
          proc, log_path,
          lambda: (re.search(restarted, _Log(log_path)) and len(
              trainer_testlib.StepLog(logdir)) > resume_step + 2 * EVERY),
          'steps after the restart')
      second = re.search(restarted, _Log(log_path))
      # A second loss exceeds --max_worker_restarts=1: a clear error.
      os.kill(int(second.group(1)), signal.SIGKILL)
      proc.wait(timeout=60)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    log = _Log(log_path)
    self.assertEqual(1, proc.returncode, log)
    self.assertRegex(
        log, r'worker lost: pipeline worker 1 \(pid %s, localhost:\d+\) '
        r'exited with code -9' % first.group(2))
    self.assertIn('restarting the worker processes (restart 1 of 1), then '
                  'resuming from the newest checkpoint', log)
    self.assertIn('resumed from %s/ckpt-%d at step %d' %
                  (logdir, resume_step, resume_step), log)
    self.assertRegex(
        log, r'trainer: error: pipeline worker 0 \(pid %s, localhost:\d+\) '
        r'exited with code -9 .*\(gave up after 1 worker restart\(s\), '
        r'--max_worker_restarts=1\)' % second.group(1))
    self.assertIn('trainer/worker_restarts', summaries.Read(logdir))
    self.assertEqual([(resume_step, 1.0)],
                     summaries.Read(logdir)['trainer/worker_restarts'])
    # One history, with the redone steps: the losses of an uninterrupted run.
    recovered = trainer_testlib.Losses(logdir, 'accuracy')
    steps = [s for s, _, _ in recovered]
    self.assertEqual(list(range(1, len(steps) + 1)), steps)
    self.assertAllClose(
        trainer_testlib.UninterruptedLosses(
            self.create_tempdir().full_path, len(steps), 1000),
        recovered, rtol=1e-5)

  def testWorkersThatCannotBeRestartedStopTheRun(self):
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    with open(log_path, 'w') as log:
      proc = subprocess.Popen(
          [sys.executable, '-m', 'tests.restart_failure_probe'] + FLAGS +
          ['--logdir=' + logdir, '--max_worker_restarts=2'],
          cwd=trainer_testlib.ROOT, env=trainer_testlib.Environment(),
          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
      self._WaitFor(proc, log_path,
                    lambda: re.search(r'pids \[\d+, \d+\]', _Log(log_path)),
                    'workers')
      pids = re.search(r'pids \[(\d+), (\d+)\]', _Log(log_path))
      self._KillMidInterval(proc, logdir, log_path, int(pids.group(2)))
      proc.wait(timeout=60)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    log = _Log(log_path)
    self.assertEqual(1, proc.returncode, log)
    self.assertIn(
        'trainer: error: could not restart the 2 local worker processes '
        '(restart 1): worker 0 exited with code 1 while starting', log)
    self.assertIn('then run the same command again to resume from the '
                  'newest checkpoint', log)


if __name__ == '__main__':
  tf.test.main()
