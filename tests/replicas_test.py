"""R data-parallel replicas x K stages compute what one pipeline computes."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe.runtime import local_cluster
from gpipe import micro_batch
from gpipe import pipeline
from gpipe import replicas
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import toy_layers

graph_rewrites.Off()


def _Layers(use_bn=True):
  return [
      toy_layers.DenseDropout.Params().Set(
          name='dense%d' % i, keep_prob=0.8, use_bn=use_bn, dtype=tf.float64,
          params_init=py_utils.WeightInit.Gaussian(0.5, seed=100 + i))
      for i in range(4)
  ]


def _Net(devices, m, schedule='gpipe', use_bn=True):
  """A 4-layer pipeline; `devices` is one list (R=1) or R lists of stages."""
  p = pipeline.PipeliningLayer.Params().Set(
      name='pipe', layers=_Layers(use_bn), num_micro_batches=m,
      dtype=tf.float64, schedule=schedule, partition_cost='uniform')
  if isinstance(devices[0], list):
    p.Set(num_stages=len(devices[0]), replica_devices=devices)
  else:
    p.Set(num_stages=len(devices), stage_devices=devices)
  if schedule != 'gpipe':
    p.loss_tpl = toy_layers.SquaredErrorLoss.Params().Set(dtype=tf.float64)
  return p.Instantiate()


def _Step(devices, m, x_np, y_np, target='', config=None, schedule='gpipe',
          use_bn=True):
  """Loss, gradients (variables and input) and moving averages of one step."""
  with tf.Graph().as_default() as graph:
    tf.compat.v1.train.get_or_create_global_step()
    net = _Net(devices, m, schedule, use_bn)
    x, y = tf.constant(x_np), tf.constant(y_np)
    if net.params.loss_tpl is None:
      out = net.FProp(net.theta, x)
      loss = tf.reduce_sum(tf.square(out - y)) + tf.reduce_sum(out)
    else:
      loss = tf.reduce_sum(net.FProp(net.theta, x, targets=y).per_example)
    variables = net.vars.Flatten()
    trainable = [v for v in variables if v.trainable]
    grads = tf.gradients(loss, trainable + [x],
                         colocate_gradients_with_ops=True)
    updates = tf.compat.v1.get_collection(py_utils.BATCH_NORM_UPDATES)
    moving = [v for v in variables if 'moving' in v.name]
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
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

  @parameterized.parameters('gpipe', '1f1b', 'zb_h1')
  def testSchedulesEqualOnePipeline(self, schedule):
    rng = np.random.RandomState(1)
    x_np, y_np = rng.randn(16, 8), rng.randn(16, 8)
    config = graph_rewrites.SessionConfig(device_count={'CPU': 4})
    d = ['/device:CPU:%d' % i for i in range(4)]
    _, _, _, got = _Step([d[0:2], d[2:4]], 2, x_np, y_np, config=config,
                         schedule=schedule, use_bn=False)
    _, _, _, want = _Step(d[0:2], 4, x_np, y_np, config=config,
                          schedule=schedule, use_bn=False)
    self.assertAllClose(want[0], got[0], rtol=1e-12, atol=0)
    for g, r in zip(got[1], want[1]):
      self.assertAllClose(r, g, rtol=1e-10, atol=1e-12)

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
