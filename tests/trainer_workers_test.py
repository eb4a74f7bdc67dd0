"""The trainer with its pipeline stages in 2 local worker processes."""

from gpipe import lingvo_import  # pylint: disable=unused-import

import os
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools import progress
from tools import summaries

TOY = trainer_testlib.TOY


def _Losses(logdir):
  return [(r['step'], r['loss'])
          for r in progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))]


class TrainerWorkersTest(test_utils.TestCase):

  def testTrainsAcrossTwoWorkerProcesses(self):
    logdir = self.create_tempdir().full_path
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, max_steps=4, checkpoint_every_n_steps=2,
        log_every_n_steps=2, trace_every_n_steps=4, worker_processes=2,
        eval_after_train=False)
    self.assertEqual(0, code, err)
    self.assertRegex(out, r'started 2 worker processes \(pids \[\d+, \d+\]\)')
    self.assertIn('saved %s/ckpt-4' % logdir, out)
    # Each stage ran in its own worker process.
    tags = summaries.Read(logdir)
    for k in range(2):
      self.assertIn('memory/peak_bytes/worker_%d_CPU_0' % k, tags)
      self.assertGreater(tags['pipeline/stage_%d/compute_sec' % k][0][1], 0)
    # The same training as with the stages in this process.
    local_dir = self.create_tempdir().full_path
    code, _, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=local_dir, max_steps=4, trace_every_n_steps=0,
        eval_after_train=False)
    self.assertEqual(0, code, err)
    self.assertAllClose(_Losses(local_dir), _Losses(logdir), rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
