"""The trainer with its pipeline stages in 2 TensorFlow worker processes."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import tempfile

from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import summaries

TOY = trainer_testlib.TOY
STEPS = 4


class TrainerWorkersTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # The reference: the same training with both stages in this process.
    cls.local_dir = tempfile.mkdtemp()
    code, _, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=cls.local_dir, max_steps=STEPS,
        trace_every_n_steps=0, eval_after_train=False)
    assert code == 0, err

  def testTrainsAcrossTwoLocalWorkerProcesses(self):
    logdir = self.create_tempdir().full_path
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, max_steps=STEPS, checkpoint_every_n_steps=2,
        log_every_n_steps=2, trace_every_n_steps=STEPS, worker_processes=2,
        eval_after_train=False)
    self.assertEqual(0, code, err)
    self.assertRegex(out, r'started 2 worker processes \(pids \[\d+, \d+\]\)')
    self.assertIn('saved %s/ckpt-%d' % (logdir, STEPS), out)
    # Each stage ran in its own worker process.
    tags = summaries.Read(logdir)
    for k in range(2):
      self.assertIn('memory/peak_bytes/worker_%d_CPU_0' % k, tags)
      self.assertGreater(tags['pipeline/stage_%d/compute_sec' % k][0][1], 0)
    self.assertAllClose(trainer_testlib.Losses(self.local_dir),
                        trainer_testlib.Losses(logdir), rtol=1e-5)

  def testTrainsOnExistingServersFromClusterSpec(self):
    logdir = self.create_tempdir().full_path
    with local_cluster.LocalCluster(2) as servers:
      code, out, err = trainer_testlib.RunInProcess(
          model=TOY, logdir=logdir, max_steps=STEPS, trace_every_n_steps=0,
          eval_after_train=False,
          cluster_spec='worker=' + ','.join(servers.cluster_def['worker']))
    self.assertEqual(0, code, err)
    self.assertNotIn('started', out)
    self.assertAllClose(trainer_testlib.Losses(self.local_dir),
                        trainer_testlib.Losses(logdir), rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
