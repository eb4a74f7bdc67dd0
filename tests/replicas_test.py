"""R data-parallel replicas x K stages compute what one pipeline computes.

On worker processes against one pipeline; in one process on virtual CPUs,
every registered schedule with and without batched weight gradients against
the unpipelined model; the placement of the replicas' gradient sums; errors.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe.runtime import local_cluster
from gpipe import micro_batch
from gpipe import pipeline
from gpipe import replicas
from gpipe import schedules
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import schedule_testlib as spt

graph_rewrites.Off()


def _Net(devices, m, use_bn=True):
  """A 4-layer pipeline; `devices` is one list (R=1) or R lists of stages."""
  p = pipeline.PipeliningLayer.Params().Set(
      name='pipe', num_micro_batches=m, dtype=tf.float64,
      layers=pipeline_testlib.DenseLayers(4, keep_prob=0.8, use_bn=use_bn),
      partition_cost='uniform')
  if isinstance(devices[0], list):
    p.Set(num_stages=len(devices[0]), replica_devices=devices)
  else:
    p.Set(num_stages=len(devices), stage_devices=devices)
  return p.Instantiate()


def _ScheduleCases():
  """(case name, schedule, K, batched) per schedule, batched W or not.

  K = 4 for the schedules of two stages per device (a V or round-robin over
  a replica's two devices), else 2.
  """
  for name in schedules.Names():
    k = 4 if schedules.Get(name).stages_per_device > 1 else 2
    for batched in (False, True):
      yield ('%s_%s' % (name, 'BatchedWeightGradients' if batched else
                        'PerMicroBatchWeightGradients'), name, k, batched)


def _Step(devices, m, x_np, y_np, target=''):
  """Loss, gradients (variables and input) and moving averages of one step."""
  with tf.Graph().as_default() as graph:
    tf.compat.v1.train.get_or_create_global_step()
    net = _Net(devices, m)
    x, y = tf.constant(x_np), tf.constant(y_np)
    out = net.FProp(net.theta, x)
    loss = tf.reduce_sum(tf.square(out - y)) + tf.reduce_sum(out)
    variables = net.vars.Flatten()
    trainable = [v for v in variables if v.trainable]
    grads = tf.gradients(loss, trainable + [x],
                         colocate_gradients_with_ops=True)
    updates = tf.compat.v1.get_collection(py_utils.BATCH_NORM_UPDATES)
    moving = [v for v in variables if 'moving' in v.name]
    with tf.compat.v1.Session(target, graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      values = sess.run([loss, grads, updates])[:2]
      values.append(sess.run(moving))
    names = [v.name for v in variables]
  return net, graph, names, values


class ReplicasOnWorkerProcessesTest(test_utils.TestCase):
  """R=2, K=2 on 4 local worker processes against R=1 with R x M batches."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cluster = local_cluster.LocalCluster(4)

  @classmethod
  def tearDownClass(cls):
    cls.cluster.Stop()
    super().tearDownClass()

  def testLossGradientsAndMovingAveragesEqualOnePipeline(self):
    rng = np.random.RandomState(0)
    x_np, y_np = rng.randn(16, 8) * 2.0 + 0.5, rng.randn(16, 8)
    d = self.cluster.devices
    net, graph, names, got = _Step([d[0:2], d[2:4]], 2, x_np, y_np,
                                   self.cluster.target)
    _, _, ref_names, want = _Step(d[0:2], 4, x_np, y_np, self.cluster.target)
    # One copy of every variable, named as without replicas (checkpoints do
    # not depend on R), on the first replica's devices.
    self.assertEqual(ref_names, names)
    self.assertEqual(2, net.num_replicas)
    for var in net.vars.Flatten():
      self.assertRegex(var.device, '/task:[01]/')
    # Each replica's stage calls run on its own workers.
    calls = {
        op.name: op.device for op in graph.get_operations()
        if op.type == 'PartitionedCall' and '_F' in op.name
    }
    for m, task in ((0, 0), (1, 0), (2, 2), (3, 2)):
      self.assertIn('/task:%d/' % task, calls['stage0_F%d/PartitionedCall' % m])
      self.assertIn('/task:%d/' % (task + 1),
                    calls['stage1_F%d/PartitionedCall' % m])
    loss, grads, moving = got
    ref_loss, ref_grads, ref_moving = want
    self.assertAllClose(ref_loss, loss, rtol=1e-12, atol=0)
    self.assertLen(grads, len(ref_grads))
    for g, r in zip(grads, ref_grads):
      self.assertAllClose(r, g, rtol=1e-10, atol=1e-12)
      self.assertGreater(np.abs(r).max(), 1e-3)  # Every gradient is live.
    # Moving averages from the statistics of all 16 examples (both
    # replicas), once: as with one pipeline, and moved from (0, 1).
    self.assertLen(moving, 8)
    for v, r in zip(moving, ref_moving):
      self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)
    self.assertNotAllClose(np.zeros(8), moving[0])


class ReplicasTest(test_utils.TestCase, parameterized.TestCase):
  """In one process on virtual CPU devices (fast): schedules and errors."""

  @parameterized.named_parameters(*_ScheduleCases())
  def testSchedulesMatchUnpipelined(self, name, k, batched):
    # R=2 replicas of the schedule's placement on two devices each (a V or
    # round-robin for two stages per device), M=2 each, dropout on: the
    # loss and every gradient of the unpipelined model.
    placement = spt.Placement(name, k)
    self.assertLen(set(placement), 2)
    with self.session(graph=tf.Graph(), config=spt.CONFIG) as sess:
      net = spt.Net(
          name, k, 2, 'always', batched_weight_gradients=batched,
          replica_devices=[['/device:CPU:%d' % (2 * r + d) for d in placement]
                           for r in range(2)])
      self.assertEqual(net.num_replicas, 2)
      rng = np.random.RandomState(9)
      x = tf.constant(rng.randn(8, 8))
      # One unpipelined model for every case (R x M = 4 micro-batches of
      # these inputs): its values are computed once.
      spt.AssertMatches(self, net, (x,), tf.constant(rng.randn(8, 8)), sess,
                        reference_key='R2_M2')

  def testReplicaGradientsAddedOnTheVariablesDevice(self):
    d = ['/device:CPU:%d' % i for i in range(4)]
    with tf.Graph().as_default():
      net = _Net([d[0:2], d[2:4]], 2, use_bn=False)
      out = net.FProp(net.theta, tf.zeros([16, 8], tf.float64))
      variables = net.vars.Flatten()
      grads = tf.gradients(tf.reduce_sum(out), variables,
                           colocate_gradients_with_ops=True)
      for var, grad in zip(variables, grads):
        # One AddN of the two replicas' sums, where the variable lives.
        self.assertEqual('AddN', grad.op.type, var.name)
        self.assertEqual(var.device, grad.op.device)
        stage = 0 if var.device.endswith(':0') else 1
        self.assertCountEqual([d[stage], d[stage + 2]],
                              [t.device for t in grad.op.inputs])

  def testBatchNotDivisibleByReplicasTimesMicroBatches(self):
    d = ['/device:CPU:%d' % i for i in range(4)]
    with tf.Graph().as_default():
      net = _Net([d[0:2], d[2:4]], 4)
      with self.assertRaisesRegex(
          ValueError, r'pipe: batch 12 is not divisible by R x M = 2 '
          r'replicas x 4 micro-batches = 8'):
        net.FProp(net.theta, tf.zeros([12, 8], tf.float64))

  def testBadReplicaDevices(self):
    d = ['/device:CPU:%d' % i for i in range(4)]
    with self.assertRaisesRegex(ValueError, 'replica 1 has 1 device'):
      replicas.Resolve('pipe', 2, [d[0:2], d[2:3]])
    with self.assertRaisesRegex(
        ValueError, r'device .*CPU:1 is in replica 0 and replica 1'):
      replicas.Resolve('pipe', 2, [d[0:2], d[1:3]])
    with self.assertRaisesRegex(ValueError, 'differ from the first replica'):
      replicas.Resolve('pipe', 2, [d[0:2], d[2:4]], stage_devices=d[2:4])
    self.assertEqual([d[0:2], d[2:4]],
                     replicas.Resolve('pipe', 2, [d[0:3], d[2:4]][:1] +
                                      [d[2:4]]))
    with self.assertRaisesRegex(ValueError, 'R x micro_batch_size = 2 x 3'):
      micro_batch.NumMicroBatches(8, micro_batch_size=3, num_replicas=2)
    self.assertEqual(4, micro_batch.NumMicroBatches(8, micro_batch_size=2,
                                                    num_replicas=2))


if __name__ == '__main__':
  tf.test.main()
