"""AmoebaNet operations and cells: shapes, parameter counts, FPropMeta."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe.measure import param_count
from gpipe import randomness
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from lingvo.core import tshape
from tasks.image import cells
from tasks.image import genotypes
from tasks.image import ops
from tests import graph_rewrites

graph_rewrites.Off()

C = 8  # Channels of the op tests.

# Hand-computed trainable parameters for in = out = C = 8 channels. A conv
# has no bias; each is followed by a batch norm with 2 x channels (beta,
# gamma). Bottlenecks run at C / 4 = 2 channels.
OP_PARAMS = {
    'none': 0,
    '1x1': C * C + 2 * C,  # 80
    # 1x1 8->2, BN(2); 3x3 2->2, BN(2); 1x1 2->8, BN(8).
    '3x3': (8 * 2 + 4) + (9 * 2 * 2 + 4) + (2 * 8 + 16),  # 92
    # 1x1 8->2, BN; 1x7 2->2, BN; 7x1 2->2, BN; 1x1 2->8, BN.
    '1x7_7x1': (8 * 2 + 4) + (7 * 4 + 4) * 2 + (2 * 8 + 16),  # 116
    # Twice: depthwise KxK x 8 + pointwise 8x8 + BN(8).
    'separable_3x3_2': 2 * (9 * 8 + 64 + 16),  # 304
    'separable_5x5_2': 2 * (25 * 8 + 64 + 16),  # 560
    'dil_2_separable_5x5_2': 2 * (25 * 8 + 64 + 16),  # 560
    'max_pool_2x2': 0,
    'max_pool_3x3': 0,
    'avg_pool_3x3': 0,
}


def _Op(name, in_dim=C, out_dim=C, stride=1):
  return ops.OperationLayer.Params().Set(
      name='op', op=name, in_dim=in_dim, out_dim=out_dim, stride=stride)


def _Run(fetches):
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    return sess.run(fetches)


class OperationTest(test_utils.TestCase, parameterized.TestCase):
  """Every operation of the B and D genotypes."""

  def testGenotypesUseOnlyTestedOps(self):
    used = {
        name for g in genotypes.GENOTYPES.values()
        for cell in (g.normal, g.reduction) for name in cell.ops
    }
    self.assertLessEqual(used, set(OP_PARAMS))

  @parameterized.parameters(*sorted(OP_PARAMS))
  def testParamCount(self, name):
    self.assertEqual(param_count.CountParams(_Op(name)), OP_PARAMS[name])

  @parameterized.parameters(*[(n, s) for n in sorted(OP_PARAMS) for s in (1, 2)])
  def testShapeAndMeta(self, name, stride):
    with self.session(graph=tf.Graph()):
      p = _Op(name, stride=stride)
      layer = p.Instantiate()
      x = tf.random.normal([2, 7, 7, C], seed=1)
      y = layer.FProp(layer.theta, x)
      size = 7 if stride == 1 else 4
      self.assertEqual(y.shape.as_list(), [2, size, size, C])
      meta = ops.OperationLayer.FPropMeta(p, tshape.Shape([2, 7, 7, C]))
      self.assertEqual(
          meta.out_shapes[0].ToTensorShape().as_list(), [2, size, size, C])
      if OP_PARAMS[name] or 'pool' in name:
        self.assertGreater(meta.flops, 0)
      self.assertTrue(np.all(np.isfinite(_Run(y))))

  def testNoneIsIdentityAndAdjustsWhenShapeChanges(self):
    with self.session(graph=tf.Graph()):
      layer = _Op('none').Instantiate()
      x = tf.random.normal([2, 5, 5, C], seed=2)
      x_val, y_val = _Run([x, layer.FProp(layer.theta, x)])
      self.assertAllEqual(x_val, y_val)
    # A stride or a channel change needs a ReLU-1x1-BN: conv + 2 x out.
    self.assertEqual(param_count.CountParams(_Op('none', stride=2)), 80)
    self.assertEqual(param_count.CountParams(_Op('none', in_dim=4)), 32 + 16)
    self.assertEqual(
        param_count.CountParams(_Op('max_pool_3x3', in_dim=4)), 32 + 16)

  def testAvgPoolExcludesPadding(self):
    with self.session(graph=tf.Graph()):
      layer = _Op('avg_pool_3x3').Instantiate()
      y = _Run(layer.FProp(layer.theta, tf.ones([1, 4, 4, C])))
      self.assertAllClose(y, np.ones_like(y))

  def testDilatedStridedEqualsSubsampledStride1(self):
    # TF has no strided dilated conv; the layer subsamples a stride-1 one.
    with self.session(graph=tf.Graph()):
      conv_p = ops.Conv2DLayer.Params().Set(
          name='c', in_dim=C, out_dim=C, kernel=(5, 5), dilation=2,
          separable=True, stride=(2, 2))
      strided = conv_p.Instantiate()
      plain = conv_p.Copy().Set(name='c1', stride=(1, 1)).Instantiate()
      x = tf.random.normal([2, 9, 9, C], seed=3)
      a = strided.FProp(strided.theta, x)
      b = plain.FProp(strided.theta, x)[:, ::2, ::2, :]
      self.assertEqual(a.shape.as_list(), [2, 5, 5, C])
      a_val, b_val = _Run([a, b])
      self.assertAllClose(a_val, b_val, atol=1e-5)

  def testConvMetaFlops(self):
    p = ops.Conv2DLayer.Params().Set(in_dim=4, out_dim=8, kernel=(3, 3),
                                     stride=(2, 2))
    meta = ops.Conv2DLayer.FPropMeta(p, tshape.Shape([2, 8, 8, 4]))
    self.assertEqual(meta.flops, 2 * (2 * 4 * 4) * 9 * 4 * 8)
    self.assertEqual(meta.out_shapes[0].ToTensorShape().as_list(),
                     [2, 4, 4, 8])

  def testUnknownOpSaysWhatIsKnown(self):
    with self.assertRaisesRegex(ValueError, r"Unknown AmoebaNet operation "
                                r"'conv_9x9'.*separable_KxK_N"):
      ops.OpSteps('conv_9x9', C, C, 1)

  def testFactorizedReduce(self):
    p = ops.FactorizedReduceLayer.Params().Set(name='fr', in_dim=6, out_dim=8)
    # Two 1x1 convs 6->4 and a BN(8).
    self.assertEqual(param_count.CountParams(p), 2 * 6 * 4 + 16)
    with self.session(graph=tf.Graph()):
      layer = p.Instantiate()
      y = layer.FProp(layer.theta, tf.random.normal([2, 7, 7, 6], seed=4))
      self.assertEqual(y.shape.as_list(), [2, 4, 4, 8])
      meta = ops.FactorizedReduceLayer.FPropMeta(p, tshape.Shape([2, 7, 7, 6]))
      self.assertEqual(meta.out_shapes[0].ToTensorShape().as_list(),
                       [2, 4, 4, 8])


def _Cell(genotype, reduction, in_dim, prev_dim, filters, prev_stride=1,
          keep_prob=1.0):
  p = cells.CellLayer.Params().Set(
      name='cell', reduction=reduction, in_dim=in_dim, prev_dim=prev_dim,
      filters=filters, prev_stride=prev_stride, drop_path_keep_prob=keep_prob)
  return cells.CellLayer.SetGenotype(p, genotype)


# Hand-computed cell parameters. Adjust convs are ReLU-1x1-BN: in*f + 2f.
# D normal, in = prev = 12, f = 4 (bottleneck at 1 channel):
#   adjust 2 x (48 + 8); '1x1' x3: 16 + 8; '1x7_7x1' x2:
#   (4 + 2) + (7 + 2) * 2 + (4 + 8) = 36.
D_NORMAL = 2 * 56 + 3 * 24 + 2 * 36  # 256
# D reduction, in = 16, prev = 12, f = 8 (bottleneck at 2):
#   adjust (128 + 16) + (96 + 16); '3x3' 92; '1x7_7x1' 116; '1x1' 80.
D_REDUCTION = 144 + 112 + 92 + 116 + 80  # 544
# B normal, in = prev = 12, f = 4: adjust 2 x 56; '1x1' x4: 24;
#   'separable_3x3_2' x2: 2 x (9 * 4 + 16 + 8).
B_NORMAL = 2 * 56 + 4 * 24 + 2 * 120  # 448
# B reduction, in = 16, prev = 12, f = 8: adjust 144 + 112; '3x3' 92;
#   'dil_2_separable_5x5_2' 560; 'separable_3x3_2' 304; '1x1' 80.
B_REDUCTION = 144 + 112 + 92 + 560 + 304 + 80  # 1292


class CellTest(test_utils.TestCase, parameterized.TestCase):
  """Normal and reduction cells of both genotypes."""

  @parameterized.named_parameters(
      ('D_normal', 'D', False, D_NORMAL),
      ('D_reduction', 'D', True, D_REDUCTION),
      ('B_normal', 'B', False, B_NORMAL),
      ('B_reduction', 'B', True, B_REDUCTION),
  )
  def testParamsAndShapes(self, name, reduction, expected_params):
    g = genotypes.Get(name)
    genotype = g.reduction if reduction else g.normal
    in_dim, filters = (16, 8) if reduction else (12, 4)
    p = _Cell(genotype, reduction, in_dim, 12, filters)
    self.assertEqual(param_count.CountParams(p), expected_params)
    num_out = len(genotypes.OutputStates(genotype))
    size = 3 if reduction else 6
    with self.session(graph=tf.Graph()):
      cell = p.Instantiate()
      cur = tf.random.normal([2, 6, 6, in_dim], seed=5)
      prev = tf.random.normal([2, 6, 6, 12], seed=6)
      extra = tf.random.normal([2, 10], seed=7)
      out, passed, extra_out = cell.FProp(cell.theta, cur, prev, extra)
      self.assertEqual(out.shape.as_list(), [2, size, size, filters * num_out])
      self.assertIs(passed, cur)
      self.assertIs(extra_out, extra)
      meta = cells.CellLayer.FPropMeta(
          p, tshape.Shape([2, 6, 6, in_dim]), tshape.Shape([2, 6, 6, 12]),
          tshape.Shape([2, 10]))
      self.assertEqual(
          [s.ToTensorShape().as_list() for s in meta.out_shapes],
          [out.shape.as_list(), [2, 6, 6, in_dim], [2, 10]])
      self.assertGreater(meta.flops, 0)
      self.assertTrue(np.all(np.isfinite(_Run(out))))

  def testCellAfterReductionReducesPreviousState(self):
    g = genotypes.Get('D')
    p = _Cell(g.normal, False, 24, 12, 8, prev_stride=2)
    with self.session(graph=tf.Graph()):
      cell = p.Instantiate()
      out, _ = cell.FProp(cell.theta, tf.zeros([2, 4, 4, 24]),
                          tf.zeros([2, 8, 8, 12]))
      self.assertEqual(out.shape.as_list(), [2, 4, 4, 32])

  def testFirstCellUsesInputAsPreviousState(self):
    g = genotypes.Get('D')
    p = _Cell(g.normal, False, 12, 12, 4)
    with self.session(graph=tf.Graph()):
      cell = p.Instantiate()
      x = tf.random.normal([2, 5, 5, 12], seed=8)
      out1, _ = cell.FProp(cell.theta, x)
      out2, _ = cell.FProp(cell.theta, x, x)
      a, b = _Run([out1, out2])
      # Training-mode batch norm over the same batch: identical outputs.
      self.assertAllClose(a, b)

  def testDropPathDropsWholeExamplesPerMicroBatchSeed(self):
    with self.session(graph=tf.Graph()):
      x = tf.ones([64, 2, 2, 3])
      with randomness.MicroBatchSeedScope([1, 2]):
        a = cells.DropPath(x, 0.5, 'k')
      with randomness.MicroBatchSeedScope([1, 2]):
        b = cells.DropPath(x, 0.5, 'k')
      with randomness.MicroBatchSeedScope([1, 3]):
        c = cells.DropPath(x, 0.5, 'k')
      with randomness.MicroBatchSeedScope([1, 2]):
        d = cells.DropPath(x, tf.constant(0.5), 'k')
      a, b, c, d = _Run([a, b, c, d])
    per_example = a.reshape(64, -1)
    # Each example is all kept (scaled by 2) or all dropped.
    self.assertTrue(np.all((per_example == 0) | (per_example == 2)))
    self.assertTrue(np.all(per_example.min(1) == per_example.max(1)))
    self.assertAllEqual(a, b)  # Same seed: the recomputation matches.
    self.assertAllEqual(a, d)  # A tensor keep prob draws the same mask.
    self.assertNotAllClose(a, c)  # Another micro-batch: another mask.
    self.assertBetween(float((per_example[:, 0] > 0).mean()), 0.25, 0.75)

  def testDropPathKeepProbRampsWithTrainingProgress(self):
    g = genotypes.Get('D')
    p = _Cell(g.normal, False, 12, 12, 4, keep_prob=0.6)
    p.drop_path_decay_steps = 100
    with self.session(graph=tf.Graph()) as sess:
      step = py_utils.GetOrCreateGlobalStepVar()
      cell = p.Instantiate()
      keep = cell._DropPathKeepProb()  # pylint: disable=protected-access
      sess.run(tf.global_variables_initializer())
      self.assertAllClose(sess.run(keep), 1.0)
      sess.run(tf.assign(step, 50))
      self.assertAllClose(sess.run(keep), 0.8)
      sess.run(tf.assign(step, 500))
      self.assertAllClose(sess.run(keep), 0.6)

  def testBadGenotypeSaysWhichOp(self):
    bad = genotypes.Genotype(
        ops=('1x1', 'none'), inputs=(0, 2), used=(0, 1, 0))
    with self.assertRaisesRegex(ValueError, r'Op 1 \(none\) reads state 2'):
      genotypes.Validate(bad)


if __name__ == '__main__':
  tf.test.main()
