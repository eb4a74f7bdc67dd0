"""Batched weight gradients: exact gradients, one W task per stage, errors."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe import pipeline
from gpipe.schedules import pipeline_tasks
from gpipe import precision
from gpipe import schedules
from gpipe import weight_batching
import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import schedule_testlib as spt

graph_rewrites.Off()

CONFIG = spt.CONFIG


def _Cases():
  """(schedule, K, M, remat) for every schedule, K in {2, 4}, each remat."""
  for name in schedules.Names():
    for i, (k, m) in enumerate(((2, 4), (4, 4), (2, 3), (2, 1))):
      if spt.Allowed(name, k, m):
        yield name, k, m, pipeline.REMAT_MODES[i % 3]


class _ScaledByMean(base_layer.BaseLayer):
  """x w + mean(x) w: its weight gradient reads a per-micro-batch scalar."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 8, 'Features.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', py_utils.WeightParams(
        [self.params.dim], py_utils.WeightInit.Gaussian(0.5, seed=3),
        self.params.dtype))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=x.num_elements(), out_shapes=(x,))

  def FProp(self, theta, x):
    return x * theta.w + tf.reduce_mean(x) * theta.w


class _ScaledByConstant(_ScaledByMean):
  """x (w 0.5) + x (w c): its weight gradient reads the constants 0.5, c."""

  def FProp(self, theta, x):
    scales = tf.constant(np.linspace(0.1, 0.8, self.params.dim), x.dtype)
    return x * (theta.w * 0.5) + x * (theta.w * scales) + x


class _SequenceDense(base_layer.BaseLayer):
  """tanh([b, 2, 4] x [4, 4]) on [b, 8]: a batch matmul reading a weight."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', py_utils.WeightParams(
        [4, 4], py_utils.WeightInit.Gaussian(0.5, seed=7), self.params.dtype))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=8 * x.num_elements(), out_shapes=(x,))

  def FProp(self, theta, x):
    y = tf.matmul(tf.reshape(x, [-1, 2, 4]), theta.w)
    return tf.reshape(tf.tanh(y), [-1, 8])


def _SwappedMatMuls(test, calls, functions, op_type):
  """How many `op_type` ops of the B calls compute a w^T as (w a^T)^T."""
  attr = 'transpose_b' if op_type == 'MatMul' else 'adj_y'
  swapped = 0
  for task, op in calls.items():
    if task.phase != pipeline_tasks.BACKWARD:
      continue
    nodes = functions[op.get_attr('f').name].node_def
    transposed = {n.input[0].split(':')[0] for n in nodes
                  if n.op == 'Transpose'}
    for n in nodes:
      if n.op == op_type and n.attr[attr].b:
        test.assertIn(n.name, transposed, task)
        swapped += 1
  return swapped


class WeightBatchingTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('%s_K%d_M%d_%s' % case, *case) for case in _Cases())
  def testGradientsMatchUnpipelined(self, name, k, m, remat):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = spt.Net(name, k, m, remat, batched_weight_gradients=True)
      # The inputs depend on M only: the cases of one M (any schedule, K and
      # remat) compare with one unpipelined model's values, computed once.
      rng = np.random.RandomState(m)
      x = tf.constant(rng.randn(2 * m, 8))
      targets = tf.constant(rng.randn(2 * m, 8))
      spt.AssertMatches(self, net, (x,), targets, sess,
                        reference_key=('uneven', m))

  def testMicroBatchBatchNormIsRefusedNamingTheStatistic(self):
    # Its scale's gradient reads each micro-batch's own 1/std: not a sum
    # over examples of one whole-batch expression.
    with tf.Graph().as_default():
      net = spt.Net('gpipe', 2, 4, 'never', layers=spt.Layers(use_bn=True),
                     batched_weight_gradients=True)
      with self.assertRaisesRegex(
          ValueError, r'stage 0 \(dense0, dense1\): the weight gradient reads '
          r'\S*batchnorm\S* \(shape \(8,\) per micro-batch, \(8,\) for the '
          r'whole batch\).*batched_weight_gradients=False'):
        net.FProp(net.theta, tf.ones([16, 8], tf.float64),
                  targets=tf.zeros([16, 8], tf.float64))

  def testSparseEmbeddingGradientMatches(self):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      spt.AssertEmbeddingGradientMatches(self, sess, '1f1b',
                                         batched_weight_gradients=True)

  # With R=2 replicas, every schedule: replicas_test's
  # testSchedulesMatchUnpipelined.

  @parameterized.named_parameters(('gpipe', 'gpipe', 2, 3),
                                  ('1f1b', '1f1b', 4, 5),
                                  ('zb_h1', 'zb_h1', 2, 4),
                                  ('zb_v', 'zb_v', 4, 4))
  def testOneWeightTaskPerStageAfterItsLastBackward(self, name, k, m):
    with tf.Graph().as_default() as graph:
      net = spt.Net(name, k, m, 'always', batched_weight_gradients=True)
      x = tf.constant(np.random.RandomState(1).randn(2 * m, 8))
      spt.LossAndGrads(net, (x,), tf.zeros([2 * m, 8], tf.float64), True)
      calls = spt.CallOps(graph)
      functions = {f.signature.name: f
                   for f in graph.as_graph_def().library.function}
    _, orders = schedules.Orders(name, spt.Placement(name, k), m,
                                schedules.simulate.RematCosts(True))
    orders = weight_batching.Orders(orders)
    weights = [t for t in calls if t.phase == pipeline_tasks.WEIGHT]
    self.assertCountEqual(
        weights, [pipeline_tasks.Task(
            s, pipeline_tasks.AllMicroBatches(0, m), 'W') for s in range(k)])
    spt.AssertCallsFollowOrders(self, calls, orders)
    # The backward calls compute the small dy W^T of the toy dense layers (2
    # rows per micro-batch) as (W dy^T)^T. The first layer's input gradient
    # is that of the pipeline's input, so every layer has one.
    self.assertEqual(_SwappedMatMuls(self, calls, functions, 'MatMul'),
                     spt.NUM_LAYERS * m)

  @parameterized.named_parameters(('never', 'never'), ('always', 'always'))
  def testSmallBatchMatMulInputGradientsReadTheWeightInPlace(self, remat):
    # [b, 2, 4] x [4, 4]: a batch matmul whose input gradient dy W^T has 2
    # rows; B computes it as (W dy^T)^T, with the same gradients. (Its
    # broadcasting weight gradient reads a shape, so W is not batched.)
    layers = [_SequenceDense.Params().Set(name='seq%d' % i, dtype=tf.float64)
              for i in range(4)]
    graph, functions = self._MatchingZeroBubbleGraph(
        remat, layers=layers, stage_sizes=[2, 2])
    self.assertEqual(
        _SwappedMatMuls(self, spt.CallOps(graph), functions, 'BatchMatMulV2'),
        4 * 2)

  def _MatchingZeroBubbleGraph(self, remat, **kwargs):
    """A zb_h1 K=2 M=2 net's graph and functions, gradients checked."""
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = spt.Net('zb_h1', 2, 2, remat, **kwargs)
      rng = np.random.RandomState(5)
      x = tf.constant(rng.randn(4, 8))
      spt.AssertMatches(self, net, (x,), tf.constant(rng.randn(4, 8)), sess)
      graph = sess.graph
      return graph, {f.signature.name: f
                     for f in graph.as_graph_def().library.function}

  def testSwapOffByParam(self):
    # swap_small_matmul_rows=0: no B matmul is swapped, same gradients.
    graph, functions = self._MatchingZeroBubbleGraph(
        'always', swap_small_matmul_rows=0)
    # Each layer's dy W^T stays a MatMul reading W transposed.
    unswapped = [
        n for task, op in spt.CallOps(graph).items() if task.phase == 'B'
        for n in functions[op.get_attr('f').name].node_def
        if n.op == 'MatMul' and n.attr['transpose_b'].b]
    self.assertLen(unswapped, spt.NUM_LAYERS * 2)

  def testOrdersMoveWeightTasksAfterTheLastBackward(self):
    _, orders = schedules.Orders('zb_h1', 2, 3)
    batched = weight_batching.Orders(orders)
    labels = [[pipeline_tasks.Label(t) for t in order] for order in batched]
    for k, order in enumerate(labels):
      self.assertEqual(order[-1], 'W*s%d' % k)
      self.assertLen([t for t in order if t.startswith('W')], 1)
      self.assertEqual(
          [t for t in order if t[0] != 'W'],
          [pipeline_tasks.Label(t) for t in orders[k] if t.phase != 'W'])
    # Schedules without a split backward get one W per stage too.
    _, orders = schedules.Orders('gpipe', 2, 2)
    self.assertEqual(
        [pipeline_tasks.Label(t) for t in weight_batching.Orders(orders)[0]],
        ['F0s0', 'F1s0', 'B1s0', 'B0s0', 'W*s0'])
    self.assertEqual(
        pipeline_tasks.ParseOpName('pipe/stage1_Wall4to7/PartitionedCall'),
        pipeline_tasks.Task(1, pipeline_tasks.AllMicroBatches(4, 4), 'W'))
    with self.assertRaisesRegex(TypeError, 'range of micro-batches'):
      _ = pipeline_tasks.AllMicroBatches(0, 4) + 4

  def testAWeightGradientReadingAScalarPerMicroBatchIsRefused(self):
    with tf.Graph().as_default():
      p = pipeline.PipeliningLayer.Params().Set(
          name='pipe', num_stages=2, num_micro_batches=2, dtype=tf.float64,
          layers=[_ScaledByMean.Params().Set(name='scaled%d' % i,
                                             dtype=tf.float64)
                  for i in range(2)],
          stage_devices=['/device:CPU:0', '/device:CPU:1'],
          batched_weight_gradients=True)
      net = p.Instantiate()
      with self.assertRaisesRegex(
          ValueError, r'stage 0 \(scaled0\): the weight gradient reads '
          r'.*shape \(\) per micro-batch.*batched_weight_gradients=False'):
        net.FProp(net.theta, tf.ones([4, 8], tf.float64))

  def testAWeightGradientReadingAConstantMatchesUnpipelined(self):
    # A constant of the stage (a Transformer's attention scale) is the same
    # for every micro-batch: read once, not stacked (it was refused).
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      layers = [_ScaledByConstant.Params().Set(name='scaled%d' % i,
                                               dtype=tf.float64)
                for i in range(2)]
      net = spt.Pipeline('zb_h1', layers, 2, 4, remat='never',
                         stage_sizes=[1, 1], batched_weight_gradients=True,
                         dtype=tf.float64)
      rng = np.random.RandomState(7)
      spt.AssertMatches(self, net, (tf.constant(rng.randn(8, 8)),),
                        tf.constant(rng.randn(8, 8)), sess)

  def testBfloat16GradientsCloseToFloat32(self):
    grads = {}
    for dtype in ('float32', 'bfloat16'):
      with self.session(graph=tf.Graph(), config=CONFIG) as sess:
        p = pipeline_testlib.PipelineParams(
            pipeline_testlib.DenseLayers(4, keep_prob=1.0, dtype=tf.float32),
            2, 4, dtype=tf.float32, batched_weight_gradients=True,
            remat='never')
        precision.SetFPropDtype(p, dtype)
        net = p.Instantiate()
        x = tf.constant(np.random.RandomState(3).randn(16, 8), tf.float32)
        out = net.FProp(net.theta, x)
        loss = tf.reduce_mean(tf.square(out))
        g = tf.gradients(loss, net.vars.Flatten())
        sess.run(tf.global_variables_initializer())
        grads[dtype] = sess.run(g)
        self.assertTrue(all(v.dtype == np.float32 for v in grads[dtype]))
    ref = np.concatenate([v.ravel() for v in grads['float32']])
    low = np.concatenate([v.ravel() for v in grads['bfloat16']])
    self.assertLess(np.linalg.norm(low - ref) / np.linalg.norm(ref), 0.04)


if __name__ == '__main__':
  tf.test.main()
