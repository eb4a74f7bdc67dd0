"""A pipeline worker process that dies stops the trainer within seconds."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re
import signal
import time

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import checkpoints
from tools.trainer import progress

TOY = trainer_testlib.TOY


class TrainerWorkerDeathTest(test_utils.TestCase):

  def testDeadWorkerStopsTrainingWithinSeconds(self):
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    proc = trainer_testlib.Popen([
        '--model=' + TOY, '--logdir=' + logdir, '--max_steps=1000000',
        '--worker_processes=2', '--checkpoint_every_n_steps=5',
        '--log_every_n_steps=1000', '--trace_every_n_steps=0'
    ], log_path)
    try:
      deadline = time.time() + 240
      while True:
        self.assertIsNone(proc.poll(), open(log_path).read())
        self.assertLess(time.time(), deadline, 'the trainer made no progress')
        records = progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))
        if checkpoints.Newest(logdir) and len(records) > 7:
          break
        time.sleep(0.1)
      pids = re.search(r'pids \[(\d+), (\d+)\]', open(log_path).read())
      os.kill(int(pids.group(2)), signal.SIGKILL)
      killed_at = time.time()
      proc.wait(timeout=60)
      elapsed = time.time() - killed_at
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    log = open(log_path).read()
    self.assertEqual(1, proc.returncode, log)
    self.assertLess(elapsed, 20, log)
    self.assertRegex(
        log, r'trainer: error: pipeline worker 1 \(pid %s, localhost:\d+\) '
        r'exited with code -9 (during step|before step|while saving the '
        r'checkpoint of step) \d+' % pids.group(2))
    newest = checkpoints.Newest(logdir)
    self.assertIn('The last checkpoint (%s) is intact' % newest, log)
    # The other worker was stopped too.
    time.sleep(1)
    self.assertFalse(_Running(pids.group(1)))


def _Running(pid):
  """Whether process `pid` exists and is not a zombie."""
  try:
    with open('/proc/%s/status' % pid) as f:
      return 'State:\tZ' not in f.read()
  except OSError:
    return False


if __name__ == '__main__':
  tf.test.main()
