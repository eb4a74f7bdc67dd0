"""Every schedule on the executor: exact gradients, task order, errors."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe import pipeline
from gpipe import schedules
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import schedule_testlib
from tests import toy_layers

graph_rewrites.Off()

CONFIG = schedule_testlib.CONFIG
NUM_LAYERS = schedule_testlib.NUM_LAYERS
Placement = schedule_testlib.Placement
Allowed = schedule_testlib.Allowed
_Layers = schedule_testlib.Layers
_Net = schedule_testlib.Net
_LossAndGrads = schedule_testlib.LossAndGrads
_Trainable = schedule_testlib.Trainable
_CallOps = schedule_testlib.CallOps


def _Cases():
  """(schedule, K, M, remat): three M values for each schedule and K.

  Of the M in 1..8 that the schedule allows at K: the smallest (fewer
  micro-batches than stages where allowed), one that is not a multiple of K
  (a last round that does not fill every stage; else the middle one) and the
  largest. The three remat modes go round them, so every (schedule, K) runs
  every mode once.
  """
  for name in schedules.Names():
    for k in (1, 2, 4):
      allowed = [m for m in range(1, 9) if Allowed(name, k, m)]
      if not allowed:
        continue
      middle = [m for m in allowed[1:-1] if m % k] or allowed[1:-1]
      picks = sorted({allowed[0], allowed[-1]} |
                     set(middle[len(middle) // 2:][:1]))
      for i, m in enumerate(picks):
        yield name, k, m, pipeline.REMAT_MODES[(i + k) % 3]


class ScheduleGradientTest(test_utils.TestCase, parameterized.TestCase):
  """Loss and every gradient equal the unpipelined model's (float64)."""

  def _AssertMatches(self, net, inputs, targets, sess, reference_key=None):
    schedule_testlib.AssertMatches(self, net, inputs, targets, sess,
                                   reference_key)

  @parameterized.named_parameters(
      ('%s_K%d_M%d_%s' % case, *case) for case in _Cases())
  def testUnevenStagesWithDropoutMatchUnpipelined(self, name, k, m, remat):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = _Net(name, k, m, remat)
      # The inputs depend on M only: the cases of one M (any schedule, K and
      # remat) compare with one unpipelined model's values, computed once.
      rng = np.random.RandomState(m)
      x = tf.constant(rng.randn(2 * m, 8))
      targets = tf.constant(rng.randn(2 * m, 8))
      self._AssertMatches(net, (x,), targets, sess,
                          reference_key=('uneven', m))

  @parameterized.named_parameters(
      (name, name) for name in schedules.Names())
  def testMicroBatchBatchNormMatchesAndUpdatesOnce(self, name):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = _Net(name, 4, 4, 'always', layers=_Layers(use_bn=True))
      x = tf.constant(np.random.RandomState(5).randn(16, 8))
      targets = tf.constant(np.random.RandomState(6).randn(16, 8))
      n = len(tf.get_collection(py_utils.BATCH_NORM_UPDATES))
      self._AssertMatches(net, (x,), targets, sess)
      # One update per moving average (6 layers x mean/variance) for each of
      # the two graphs, pipelined and unpipelined, equal to each other.
      updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)[n:]
      self.assertLen(updates, 2 * 2 * NUM_LAYERS)
      moving = [v for v in net.vars.Flatten() if 'moving' in v.name]
      reset = tf.variables_initializer(moving)
      results = []
      for half in (updates[:len(updates) // 2], updates[len(updates) // 2:]):
        sess.run(reset)
        sess.run(half)
        results.append(sess.run(moving))
      self.assertAllClose(results[0], results[1])
      self.assertNotAllClose(results[0][0], np.zeros(8))

  @parameterized.named_parameters(
      (name, name) for name in schedules.Names())
  def testNestedMapInputsMatch(self, name):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      layers = [
          toy_layers.NestedDense.Params().Set(
              name='nd%d' % i, dtype=tf.float64,
              params_init=py_utils.WeightInit.Gaussian(0.5, seed=i))
          for i in range(4)
      ]
      net = schedule_testlib.Pipeline(
          name, layers, 2, 4, partition_cost='uniform',
          loss_tpl=toy_layers.NestedLoss.Params().Set(dtype=tf.float64))
      rng = np.random.RandomState(2)
      inputs = py_utils.NestedMap(
          h=tf.constant(rng.randn(8, 8)),
          context=tf.constant(rng.rand(8, 8) + 0.5),
          ids=tf.constant(rng.randint(0, 3, size=[8]), tf.int32))
      self._AssertMatches(net, (inputs,), tf.constant(rng.randn(8, 8)), sess)


class SplitBackwardTest(test_utils.TestCase, parameterized.TestCase):
  """Stages whose weight gradients are sparse, and stages without weights."""

  @parameterized.named_parameters(('zb_h1', 'zb_h1'), ('zb_v', 'zb_v'))
  def testEmbeddingTableGradientMatches(self, name):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      schedule_testlib.AssertEmbeddingGradientMatches(self, sess, name)


class ScheduleOrderTest(test_utils.TestCase, parameterized.TestCase):
  """The graph chains each device's tasks in the schedule's order."""

  @parameterized.named_parameters(
      ('%s_K%d_M%d' % (name, k, m), name, k, m)
      for name, k, m in [('gpipe', 2, 3), ('1f1b', 4, 6),
                         ('interleaved_1f1b', 4, 4), ('zb_h1', 4, 5),
                         ('zb_v', 4, 4)])
  def testControlDependenciesFollowTheSchedule(self, name, k, m):
    with tf.Graph().as_default() as graph:
      net = _Net(name, k, m, 'always')
      x = tf.constant(np.random.RandomState(1).randn(2 * m, 8))
      _LossAndGrads(net, (x,), tf.zeros([2 * m, 8], tf.float64), True)
      calls = _CallOps(graph)
    _, orders = schedules.Orders(name, Placement(name, k), m,
                                schedules.simulate.RematCosts(True))
    phases = {t.phase for order in orders for t in order}
    self.assertEqual(phases, {'F', 'B', 'W'} if schedules.Get(
        name).split_backward else {'F', 'B'})
    schedule_testlib.AssertCallsFollowOrders(self, calls, orders)


class ScheduleErrorTest(test_utils.TestCase):
  """Inputs a schedule cannot run get errors that say what to change."""

  def _Build(self, name, devices, m, loss=True, batch=8):
    net = pipeline_testlib.Pipeline(
        _Layers(), len(devices), m, schedule=name, partition_cost='uniform',
        stage_devices=['/device:CPU:%d' % d for d in devices],
        loss_tpl=toy_layers.SquaredErrorLoss.Params().Set(
            dtype=tf.float64) if loss else None)
    x = tf.zeros([batch, 8], tf.float64)
    if loss:
      out = net.FProp(net.theta, x, targets=x)
      return tf.reduce_mean(out.per_example), net
    return tf.reduce_sum(tf.square(net.FProp(net.theta, x))), net

  def testFewerMicroBatchesThanStages(self):
    for name in ('1f1b', 'zb_h1'):
      with tf.Graph().as_default(), self.assertRaisesRegex(
          ValueError, r"pipe: schedule '%s' needs at least as many "
          r'micro-batches as stages: M=2 < K=4. Use num_micro_batches >= 4'
          % name):
        self._Build(name, [0, 1, 2, 3], 2)

  def testInterleavedNeedsAMultipleOfTheDevices(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError,
                                  'needs M a multiple of the 2 devices.*got '
                                  'M=3: use 2 or 4'):
        self._Build('interleaved_1f1b', [0, 1, 0, 1], 3, batch=6)

  def testPlacementsThatDoNotFit(self):
    cases = [
        ('zb_v', [0, 1, 0, 1], 4, "'zb_v' needs two stages per device in a V"),
        ('zb_v', [0, 1, 2], 3, "'zb_v' needs two stages"),
        ('interleaved_1f1b', [0, 1, 1, 0], 4,
         "'interleaved_1f1b' needs the stages round-robin"),
        ('1f1b', [0, 1, 0, 1], 4,
         "schedule '1f1b' runs one stage per device.*'interleaved_1f1b'"),
    ]
    for name, devices, m, message in cases:
      with tf.Graph().as_default(), self.assertRaisesRegex(ValueError,
                                                           message):
        self._Build(name, devices, m, batch=2 * m)

  def testLossOutsideThePipelineIsRefusedNotHung(self):
    for name in ('1f1b', 'zb_h1'):
      with tf.Graph().as_default():
        loss, net = self._Build(name, [0, 1], 4, loss=False)
        with self.assertRaisesRegex(
            ValueError, r"schedule '%s' starts the backward of micro-batch 0 "
            r'at the last stage right after its forward, but the gradient of '
            r'its output depends on the forward of micro-batch\(es\) 1, 2, 3: '
            r'the loss is not separable per micro-batch. Compute each '
            r"micro-batch's loss inside the pipeline: set loss_tpl" % name):
          tf.gradients(loss, net.vars.Flatten())

  def testLossLayerNeedsTargets(self):
    with tf.Graph().as_default():
      p = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=_Layers()[:2], num_stages=2,
          num_micro_batches=2, stage_devices=['/device:CPU:0'] * 2,
          loss_tpl=toy_layers.SquaredErrorLoss.Params())
      net = p.Instantiate()
      with self.assertRaisesRegex(ValueError, 'pass the loss layer'):
        net.FProp(net.theta, tf.zeros([4, 8]))
      with self.assertRaisesRegex(ValueError, 'unknown schedule .fifo.'):
        p.Copy().Set(name='p2', schedule='fifo').Instantiate()


if __name__ == '__main__':
  tf.test.main()
