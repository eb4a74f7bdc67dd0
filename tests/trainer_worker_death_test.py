"""A pipeline worker process that dies stops the trainer within seconds."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re
import signal

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling
from tests import trainer_testlib
from tools.trainer import checkpoints

TOY = trainer_testlib.TOY
_Log = trainer_testlib.ReadLog
# How long a lost worker may take to stop the trainer (and the other worker).
STOP_SECS = 60


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
      polling.WaitUntil(
          lambda: (checkpoints.Newest(logdir) and
                   len(trainer_testlib.StepLog(logdir)) > 7),
          'a checkpoint and 8 steps', process=proc,
          details=lambda: _Log(log_path))
      pids = re.search(r'pids \[(\d+), (\d+)\]', _Log(log_path))
      os.kill(int(pids.group(2)), signal.SIGKILL)
      # The trainer notices the lost worker at its next step or RPC, well
      # within this bound.
      polling.WaitUntil(
          lambda: proc.poll() is not None,
          'the trainer to stop after worker 1 was killed',
          timeout_secs=STOP_SECS, details=lambda: _Log(log_path))
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    log = _Log(log_path)
    self.assertEqual(1, proc.returncode, log)
    self.assertRegex(
        log, r'trainer: error: pipeline worker 1 \(pid %s, localhost:\d+\) '
        r'exited with code -9 (during step|before step|while saving the '
        r'checkpoint of step) \d+' % pids.group(2))
    newest = checkpoints.Newest(logdir)
    self.assertIn('The last checkpoint (%s) is intact' % newest, log)
    # The other worker was stopped too.
    polling.WaitUntil(lambda: not _Running(pids.group(1)),
                      'worker 0 (pid %s) to exit' % pids.group(1),
                      timeout_secs=STOP_SECS, details=lambda: log)



def _Running(pid):
  """Whether process `pid` exists and is not a zombie."""
  try:
    with open('/proc/%s/status' % pid) as f:
      return 'State:\tZ' not in f.read()
  except OSError:
    return False


if __name__ == '__main__':
  tf.test.main()
