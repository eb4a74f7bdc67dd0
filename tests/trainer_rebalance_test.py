"""--elastic rebalancing: a throttled worker's stage gets fewer layers.

Worker 1 of two runs under a CPU quota of 0.3 cores (a cgroup v1 cpu
controller, gpipe/runtime/cpu_quota.py; as root, skipped elsewhere). The toy
model is widened to 512-unit layers on a batch of 512 and cut by flops, so
its stages' work outweighs a step's fixed costs: the trainer sees stage 1
slower than its share in traced steps, moves layer 2 to stage 0 at the next
checkpoint, and the step gets faster with the same losses.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os

from gpipe.runtime import cgroups
from gpipe.runtime import cpu_quota
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import elastic

# The move comes at the checkpoint of step 10 (20 or 30 on a loaded
# machine): at least 9 traced steps after it up to a move at step 30.
STEPS = 50
EVERY = 10


class TrainerRebalanceTest(test_utils.TestCase):

  def testAThrottledWorkerGetsFewerLayersAndTheStepGetsFaster(self):
    try:
      cgroups.ParentDirectory('cpu', 'this test', cpu_quota.CpuQuotaError)
    except cpu_quota.CpuQuotaError as e:
      self.skipTest(str(e))
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    with trainer_testlib.TrainerProcess(
        trainer_testlib.ResumableFlags(EVERY) + [
            '--model_params_override=' + trainer_testlib.WIDE_TOY,
            '--logdir=' + logdir,
            '--worker_processes=2', '--elastic', '--max_steps=%d' % STEPS,
            '--trace_every_n_steps=2'], log_path) as trainer:
      pids = trainer.WorkerPids()
      with cpu_quota.CpuQuota('gpipe_rebalance_test_%d' % os.getpid(),
                              0.3) as quota:
        quota.Add(pids[1])
        code, log = trainer.Wait(240)
    self.assertEqual(0, code, log)
    self.assertRegex(
        log, r'elastic: rebalancing after step \d+: stage\(s\) 1 slower than '
        r'their share of the cost \(seconds per unit of cost 1.00, [\d.]+ '
        r'times the fastest device\'s\): cut \[2, 2\] -> \[3, 1\]')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['rebalance'], [e['kind'] for e in events], log)
    move = events[0]
    self.assertEqual([2, 2], move['old_cut'])
    self.assertEqual([3, 1], move['new_cut'])
    self.assertEqual(0, move['steps_redone'])
    self.assertEqual(0, move['checkpoint_step'] % EVERY)
    # Faster after the move, with an uninterrupted run's losses.
    trainer_testlib.AssertFasterAfterTheMoveWithUninterruptedLosses(
        self, logdir, move, STEPS, self.create_tempdir().full_path)


if __name__ == '__main__':
  tf.test.main()
