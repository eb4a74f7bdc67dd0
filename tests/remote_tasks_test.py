"""tools/trainer/remote_tasks.py: naming and waiting for tasks."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import functools
import time
from unittest import mock

from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import model_select
from tools.trainer import remote_tasks
from tools.trainer import run_config
from tools.trainer import settings


def _Free():
  return 'localhost:%d' % local_cluster.FreePort()


class RemoteTasksTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cluster = local_cluster.LocalCluster(2)
    cls.addresses = cls.cluster.cluster_def['worker']

  @classmethod
  def tearDownClass(cls):
    cls.cluster.Stop()
    super().tearDownClass()

  def testUnreachableTasksAreNamedWithTheirStages(self):
    free = _Free()
    tasks = remote_tasks.RemoteTasks([self.addresses[0], free])
    cfg = model_select.ModelParams(trainer_testlib.TOY)
    model_select.SetStageDevices(
        cfg, ['/job:worker/replica:0/task:%d/device:CPU:0' % t
              for t in range(2)])
    tasks.SetStages(cfg)
    lost = tasks.Unreachable()
    self.assertEqual([(1, 'cannot connect: Connection refused')], lost)
    self.assertEqual('task 1 at %s (stage 1) does not answer (cannot '
                     'connect: Connection refused)' % free,
                     tasks.Explain(lost))
    self.assertEqual('every task answers again', tasks.Explain([]))
    # No wait: the last round's answer.
    self.assertEqual(lost, tasks.WaitServing(0))

  def testStagesOfReplicasAreNamedByReplica(self):
    cfg = model_select.ModelParams(trainer_testlib.TOY)
    model_select.SetStageDevices(
        cfg, ['/job:worker/replica:0/task:%d/device:CPU:0' % t
              for t in range(4)], data_parallel=2)
    self.assertEqual({0: ['replica 0 stage 0'], 1: ['replica 0 stage 1'],
                      2: ['replica 1 stage 0'], 3: ['replica 1 stage 1']},
                     remote_tasks.StagesByTask(cfg))

  def testConnectRunsAStepAcrossEveryTask(self):
    tasks = remote_tasks.RemoteTasks(self.addresses)
    tasks.Connect(self.cluster.target, wait_secs=10)
    free = _Free()
    with self.assertRaisesRegex(
        remote_tasks.TaskUnreachableError,
        r'task 1 at %s \(no stage\) does not answer \(cannot connect: '
        r'Connection refused\) \(--cluster_spec %s,%s\)' %
        (free, self.addresses[0], free)):
      remote_tasks.RemoteTasks([self.addresses[0], free]).Connect(
          self.cluster.target, wait_secs=1)

  def testConnectDoesNotWaitForATaskKnownToBeGone(self):
    free = _Free()
    tasks = remote_tasks.RemoteTasks([self.addresses[0], free])
    asked = []

    def Gone():
      asked.append(True)
      return True

    start = time.monotonic()
    with self.assertRaisesRegex(
        remote_tasks.TaskUnreachableError,
        r'task 1 at %s \(no stage\) does not answer' % free):
      tasks.Connect(self.cluster.target, wait_secs=600, gone=Gone)
    # One round of probes, not the 600 s of retries.
    self.assertLess(time.monotonic() - start, 60)
    self.assertEqual([True], asked)
    # Every task answers: gone() is not asked.
    remote_tasks.RemoteTasks(self.addresses).Connect(
        self.cluster.target, wait_secs=10, gone=Gone)
    self.assertEqual([True], asked)

  def testAFailedMeshStepIsTriedAgainEvenPastTheWait(self):
    # A connection a healed partition left stalled holds the first step
    # for the whole step timeout: the next try is the one that tells.
    tasks = remote_tasks.RemoteTasks(self.addresses)
    stalled = tf.errors.DeadlineExceededError(None, None, 'stalled')
    refused = tf.errors.InvalidArgumentError(None, None, 'no such device')

    def Tries(errors, error_text=None):
      """How many check steps Connect runs; each raises the next error."""
      tries = []

      def Step(unused_target, unused_timeout):
        tries.append(1)
        if len(tries) <= len(errors) and errors[len(tries) - 1]:
          raise errors[len(tries) - 1]

      with mock.patch.object(tasks, '_MeshStep', Step):
        if error_text is None:
          tasks.Connect(self.cluster.target, wait_secs=0)
        else:
          with self.assertRaisesRegex(remote_tasks.TaskUnreachableError,
                                      error_text):
            tasks.Connect(self.cluster.target, wait_secs=0)
      return len(tries)

    self.assertEqual(2, Tries([stalled]))
    # A step that keeps failing: the error after the second try.
    self.assertEqual(2, Tries(
        [stalled] * 3, 'answer, but a step across them fails: '
        'DeadlineExceededError: stalled'))
    # An error that another try would not change: said after the first.
    self.assertEqual(1, Tries([refused] * 3,
                              'InvalidArgumentError: no such device'))

  def testWaitFlagsAreChecked(self):
    inspect = functools.partial(settings.Settings, model=trainer_testlib.TOY,
                                mode='inspect_model')
    with self.assertRaisesRegex(ValueError,
                                '--worker_wait_secs=-1: give seconds >= 0'):
      run_config.Settle(inspect(worker_wait_secs=-1))
    with self.assertRaisesRegex(
        ValueError, '--max_worker_restarts=1: there are no workers to '
        'restart'):
      run_config.Settle(inspect(max_worker_restarts=1))
    # A running cluster's servers are waited for: accepted.
    run = run_config.Settle(inspect(
        max_worker_restarts=1, worker_wait_secs=5,
        cluster_spec='worker=' + ','.join(self.addresses)))
    self.assertEqual(1, run.max_worker_restarts)


if __name__ == '__main__':
  tf.test.main()
