"""Inference runs the forward-only schedule, whatever the training schedule.

In eval mode a pipeline's devices run F tasks only, in the order of
``gpipe.schedules.inference.ForwardOrders`` (chained by control
dependencies), its stage functions trace no backward pass, and its output
equals the unpipelined layers' in eval mode. Also the pure orders: the
forward half of fill-drain, drawn as the module says.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import inference
from gpipe.schedules import orders as orders_lib
from gpipe.schedules import registry
from gpipe.schedules import simulate
import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import schedule_testlib as spt

graph_rewrites.Off()

K = 2
M = 4


def _Cases():
  for name in registry.Names():
    for batched in (False, True):
      yield ('%s_%s' % (name, 'batched_w' if batched else 'per_micro_batch_w'),
             name, batched)


class ForwardOnlyOrdersTest(test_utils.TestCase):

  def testForwardOrdersAreFillDrainsForwardHalf(self):
    for k in (1, 2, 3, 4):
      for m in (1, 2, 5):
        _, orders = inference.ForwardOrders(k, m)
        ticks = orders_lib.GPipeClockCycles(k, m, backward=False)
        self.assertEqual(orders, orders_lib.StageOrders(ticks, k))
        for order in orders:
          self.assertTrue(all(t.phase == pipeline_tasks.FORWARD
                              for t in order))
          self.assertEqual([t.micro_batch for t in order], list(range(m)))

  def testDrawingsInTheModuleDocstring(self):
    doc = '\n'.join(line.strip() for line in inference.__doc__.splitlines())
    self.assertIn(inference.Render(3, 4), doc)
    self.assertEqual(
        inference.Render(['a', 'b', 'a', 'b'], 2),
        'd0 | F0s0 F1s0 F0s2 F1s2 .\nd1 | .    F0s1 F1s1 F0s3 F1s3')

  def testBubbleMatchesTheSimulation(self):
    for d in (1, 2, 4):
      for m in (1, 3, 8):
        _, orders = inference.ForwardOrders(d, m)
        self.assertAllClose(inference.ForwardBubble(d, 1, m),
                            simulate.SimulatedBubble(orders, d, m))

  def testTableNamesBothSchedules(self):
    table = inference.MarkdownTable()
    self.assertIn('`forward_only`', table)
    self.assertIn('`decode_lanes`', table)


class EvalModePipelineTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_Cases())
  def testEvalRunsForwardOnlyAndMatchesUnpipelined(self, name, batched):
    where = spt.Placement(name, K)
    devices = ['/device:CPU:%d' % d for d in where]
    rng = np.random.RandomState(0)
    x_np, y_np = rng.randn(2 * M, 8), rng.randn(2 * M, 8)
    with self.session(graph=tf.Graph(), config=spt.CONFIG) as sess:
      net = spt.Net(name, K, M, 'always',
                    batched_weight_gradients=batched)
      x, y = tf.constant(x_np), tf.constant(y_np)
      with cluster_factory.SetEval(True):
        out = net.FProp(net.theta, x, targets=y)
        ref = net.FPropUnpipelined(net.theta, x, targets=y)
      calls = spt.CallOps(sess.graph)
      _, orders = inference.ForwardOrders(devices, M)
      spt.AssertCallsFollowOrders(self, calls, orders)
      for task, op in calls.items():
        self.assertEqual(op.device, devices[task.stage])
      # No stage traced a backward function (no re-materialization).
      library = sess.graph.as_graph_def().library
      self.assertFalse(
          [f.signature.name for f in library.function
           if 'Backward' in f.signature.name])
      sess.run(tf.global_variables_initializer())
      got, want = sess.run([out, ref])
    self.assertAllClose(want.per_example, got.per_example, rtol=1e-12)

  def testGradientsOfAnEvalPipelineSayWhy(self):
    with tf.Graph().as_default():
      net = spt.Net('1f1b', K, M, 'always')
      with cluster_factory.SetEval(True):
        out = net.FProp(net.theta, tf.zeros([M, 8], tf.float64),
                        targets=tf.zeros([M, 8], tf.float64))
      with self.assertRaisesRegex(ValueError, 'forward only.*eval mode'):
        tf.gradients(tf.reduce_sum(out.per_example), spt.Trainable(net))

  def testTrainingAndEvalGraphsOfOneLayerKeepTheirOwnSchedules(self):
    with tf.Graph().as_default() as graph:
      net = spt.Net('1f1b', K, M, 'always')
      x, y = tf.zeros([M, 8], tf.float64), tf.zeros([M, 8], tf.float64)
      with cluster_factory.SetEval(True):
        net.FProp(net.theta, x, targets=y)
      spt.LossAndGrads(net, (x,), y, True)
      phases = {t.phase for t in spt.CallOps(graph)}
    self.assertEqual(phases, {'F', 'B'})


if __name__ == '__main__':
  tf.test.main()
