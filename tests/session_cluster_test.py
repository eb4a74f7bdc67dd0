"""Sessions over the servers that still serve (runtime/session_cluster.py)."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import signal

from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from gpipe.runtime import session_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling


def _Step(cluster):
  """A variable on task 0, updated from task 1: (graph, init, update, var)."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.device(cluster.DeviceName(0)):
      var = tf.compat.v1.get_variable(
          'v', initializer=tf.constant(1.0, tf.float64), use_resource=True)
      doubled = var * 2
    with tf.device(cluster.DeviceName(1)):
      update = var.assign_add(doubled + 1)
    init = tf.compat.v1.global_variables_initializer()
  return graph, init, update, var


class SessionClusterTest(test_utils.TestCase):

  def testNamesAndConfig(self):
    cluster = session_cluster.SessionCluster(['a:1', 'b:2'])
    self.assertEqual('grpc://a:1', cluster.target)
    self.assertEqual('/job:elastic/replica:0/task:1/device:GPU:3',
                     cluster.DeviceName(1, 'gpu', 3))
    self.assertEqual(
        ['/job:elastic/replica:0/task:1/device:CPU:0'],
        cluster.Rename(['/job:worker/replica:0/task:7/device:CPU:0'], 1))
    config = cluster.Configure(tf.compat.v1.ConfigProto())
    self.assertTrue(config.isolate_session_state)
    self.assertEqual({0: 'a:1', 1: 'b:2'},
                     dict(config.cluster_def.job[0].tasks))
    with self.assertRaisesRegex(ValueError, 'lists a server twice'):
      session_cluster.SessionCluster(['a:1', 'a:1'])
    with self.assertRaisesRegex(ValueError, 'at least one'):
      session_cluster.SessionCluster([])
    with self.assertRaisesRegex(ValueError, 'not a full device string'):
      cluster.Rename(['/device:CPU:0'], 0)

  def testSurvivorsOfALostMasterRunOnTheirOwnAndAReplacementJoins(self):
    with local_cluster.LocalCluster(3) as workers:
      addresses = list(workers.cluster_def['worker'])
      # Task 0, the master of the servers' own cluster, is lost for good.
      os.kill(workers.pids[0], signal.SIGKILL)
      polling.WaitUntil(lambda: liveness.Probe(addresses[0], 1.0),
                        'worker 0 to stop answering')
      survivors = session_cluster.SessionCluster(addresses[1:])
      self.assertEqual(['/job:elastic/replica:0/task:0/device:CPU:0',
                        '/job:elastic/replica:0/task:1/device:CPU:0'],
                       survivors.ListDevices())
      graph, init, update, var = _Step(survivors)
      config = survivors.Configure(tf.compat.v1.ConfigProto(
          operation_timeout_in_ms=30000))
      first = tf.compat.v1.Session(survivors.target, graph=graph,
                                   config=config)
      first.run(init)
      self.assertEqual(4.0, first.run(update))
      # Each session keeps its own state: a second one starts afresh and
      # leaves the first one's alone.
      with tf.compat.v1.Session(survivors.target, graph=graph,
                                config=config) as second:
        second.run(init)
        self.assertEqual(1.0, second.run(var))
      self.assertEqual(4.0, first.run(var))
      first.close()
      # A fresh worker 0 at a new port; the others were started with the
      # old one, and a session cluster reaches it all the same.
      workers.ReplaceWorker(0)
      self.assertNotEqual(addresses[0], workers.cluster_def['worker'][0])
      workers.CheckAlive()
      grown = session_cluster.SessionCluster(
          [workers.cluster_def['worker'][0]] + addresses[1:])
      self.assertLen(grown.ListDevices(), 3)
      graph, init, update, _ = _Step(grown)
      with tf.compat.v1.Session(
          grown.target, graph=graph,
          config=grown.Configure(tf.compat.v1.ConfigProto())) as sess:
        sess.run(init)
        self.assertEqual(4.0, sess.run(update))

  def testAReplacementThatDoesNotStartLeavesTheOthersRunning(self):
    with local_cluster.LocalCluster(2) as workers:
      # A flag the worker binary refuses: the replacement exits at once.
      # pylint: disable=protected-access
      workers._options['cpu_devices'] = 'none'
      with self.assertRaisesRegex(local_cluster.WorkerDiedError,
                                  'pipeline worker 1 .* exited with code 2'):
        workers.ReplaceWorker(1, start_timeout=60)
      workers.CheckAlive([0])
      with self.assertRaises(local_cluster.WorkerDiedError):
        workers.CheckAlive()


if __name__ == '__main__':
  tf.test.main()
