"""The trainer with --data_parallel=R: R replicas of a K-stage pipeline."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import shutil
import tempfile

from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tasks import dense
from tests import trainer_testlib
from tools.trainer import model_select
from tools.trainer import summaries

TOY = trainer_testlib.TOY  # K=2, M=4, batch 32.
STEPS = 6
SAVED = 4


def _Run(**flags):
  flags.setdefault('model', TOY)
  flags.setdefault('trace_every_n_steps', 0)
  flags.setdefault('eval_after_train', False)
  return trainer_testlib.RunInProcess(**flags)


class TrainerDataParallelTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # The reference: one pipeline with R x M = 8 micro-batches of the same
    # mini-batches, both stages in this process.
    cls.ref_dir = tempfile.mkdtemp()
    code, _, err = _Run(logdir=cls.ref_dir, max_steps=STEPS,
                        num_micro_batches=8)
    assert code == 0, err

  def testTwoReplicasOfTwoStagesTrainLikeOnePipelineAndResumeWithOtherRK(self):
    logdir = self.create_tempdir().full_path
    code, out, err = _Run(logdir=logdir, max_steps=SAVED, data_parallel=2,
                          worker_processes=4, checkpoint_every_n_steps=SAVED,
                          log_every_n_steps=2)
    self.assertEqual(0, code, err)
    self.assertRegex(out, r'started 4 worker processes')
    self.assertIn('2 data-parallel replicas, on /job:worker/replica:0/task:0/'
                  'device:CPU:0, /job:worker/replica:0/task:1/device:CPU:0 | '
                  '/job:worker/replica:0/task:2/device:CPU:0, '
                  '/job:worker/replica:0/task:3/device:CPU:0', out)
    self.assertRegex(out, r'step 2/%d .* examples/s \([\d.]+ per replica x 2\)'
                     % SAVED)
    tags = summaries.Read(logdir)
    total = dict(tags['examples_per_sec'])
    per_replica = dict(tags['examples_per_sec_per_replica'])
    self.assertAllClose(total[2] / 2, per_replica[2])
    ref = trainer_testlib.Losses(self.ref_dir)
    self.assertAllClose(ref[:SAVED], trainer_testlib.Losses(logdir), rtol=1e-5)
    # The checkpoint of R=2, K=2 resumes with R=1, K=4 and with R=1, K=1:
    # the same micro-batches, so the same losses as the uninterrupted run.
    for stages in (4, 1):
      resumed = self.create_tempdir().full_path
      shutil.rmtree(resumed)
      shutil.copytree(logdir, resumed)
      code, out, err = _Run(logdir=resumed, max_steps=STEPS,
                            num_stages=stages, num_micro_batches=8)
      self.assertEqual(0, code, err)
      self.assertIn('resumed from %s/ckpt-%d at step %d' %
                    (resumed, SAVED, SAVED), out)
      self.assertIn('%d stages' % stages, out)
      self.assertAllClose(ref, trainer_testlib.Losses(resumed), rtol=1e-5)

  def testReplicasTimesStagesMustEqualTheWorkers(self):
    logdir = self.create_tempdir().full_path
    # Running workers: the trainer asks them for their devices first.
    with local_cluster.LocalCluster(3) as servers:
      code, _, err = _Run(logdir=logdir, max_steps=1, data_parallel=2,
                          cluster_spec=servers.ClusterSpec())
    self.assertEqual(1, code)
    self.assertIn(
        '--data_parallel=2: the pipeline at task.network needs 2 device(s) '
        'per replica (2 stages), so R x K = 4 workers/devices, but 3 were '
        'given: set --worker_processes=4 (or --cluster_spec with 4 servers)',
        err)

  def testBatchMustBeDivisibleByReplicasTimesMicroBatches(self):
    logdir = self.create_tempdir().full_path
    # 36 examples: 4 micro-batches of 9 for one pipeline, but not 2 x 4.
    code, _, err = _Run(logdir=logdir, max_steps=1, data_parallel=2,
                        model_params_override='input.batch_size=36')
    self.assertEqual(1, code)
    self.assertIn('network: batch 36 is not divisible by R x M = 2 replicas '
                  'x 4 micro-batches = 8: choose a batch size that is a '
                  'multiple of 8', err)

  def testDataParallelNeedsAPipeline(self):
    cfg = model_select.ModelParams(TOY)
    cfg.task.network = dense.DenseLayer.Params().Set(
        name='network', input_dim=64, output_dim=10)
    with self.assertRaisesRegex(
        ValueError, '--data_parallel=2: this model has no gpipe '
        'PipeliningLayer in its params'):
      model_select.CheckDataParallel(cfg, 2)
    model_select.CheckDataParallel(cfg, 1)

  def testRestartsNeedWorkers(self):
    logdir = self.create_tempdir().full_path
    code, _, err = _Run(logdir=logdir, max_steps=1, max_worker_restarts=1)
    self.assertEqual(1, code)
    self.assertIn('--max_worker_restarts=1: there are no workers to restart; '
                  'the stages run on devices of this process', err)


if __name__ == '__main__':
  tf.test.main()
