"""A pipeline worker process that dies stops the trainer within seconds."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling
from tests import trainer_testlib
from tools.trainer import checkpoints

TOY = trainer_testlib.TOY
# How long a lost worker may take to stop the trainer (and the other worker).
STOP_SECS = 60


class TrainerWorkerDeathTest(test_utils.TestCase):

  def testDeadWorkerStopsTrainingWithinSeconds(self):
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    with trainer_testlib.TrainerProcess([
        '--model=' + TOY, '--logdir=' + logdir, '--max_steps=1000000',
        '--worker_processes=2', '--checkpoint_every_n_steps=5',
        '--log_every_n_steps=1000', '--trace_every_n_steps=0'
    ], log_path) as trainer:
      trainer.WaitFor(
          lambda: (checkpoints.Newest(logdir) and
                   len(trainer_testlib.StepLog(logdir)) > 7),
          'a checkpoint and 8 steps')
      pids = trainer.WorkerPids()
      trainer_testlib.KillProcess(pids[1])
      # The trainer notices the lost worker at its next step or RPC, well
      # within this bound.
      polling.WaitUntil(
          lambda: trainer.proc.poll() is not None,
          'the trainer to stop after worker 1 was killed',
          timeout_secs=STOP_SECS, details=trainer.Log)
    log = trainer.Log()
    self.assertEqual(1, trainer.returncode, log)
    self.assertRegex(
        log, r'trainer: error: pipeline worker 1 \(pid %s, localhost:\d+\) '
        r'exited with code -9 (during step|before step|while saving the '
        r'checkpoint of step) \d+' % pids[1])
    newest = checkpoints.Newest(logdir)
    self.assertIn('The last checkpoint (%s) is intact' % newest, log)
    # The other worker was stopped too.
    trainer_testlib.WaitGone(pids[0], 'worker 0, its trainer stopped',
                             timeout=STOP_SECS)


if __name__ == '__main__':
  tf.test.main()
