"""Cost-balanced partitioning of a layer sequence into stages."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import itertools

from absl.testing import parameterized
from gpipe import partition
from gpipe import pipeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import pipeline_testlib


def _Bottleneck(costs, sizes, factors=None):
  bounds = np.cumsum([0] + list(sizes))
  factors = factors or [1.0] * len(sizes)
  return max(f * sum(costs[a:b])
             for f, a, b in zip(factors, bounds, bounds[1:]))


def _BruteForceBottleneck(costs, k, factors=None):
  best = float('inf')
  n = len(costs)
  for cuts in itertools.combinations(range(1, n), k - 1):
    bounds = (0,) + cuts + (n,)
    best = min(best, _Bottleneck(costs, np.diff(bounds), factors))
  return best


class PartitionByCostTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.parameters(range(20))
  def testOptimalBottleneck(self, seed):
    rng = np.random.RandomState(seed)
    n = rng.randint(2, 11)
    k = rng.randint(1, n + 1)
    costs = list(rng.randint(0, 20, size=n).astype(float))
    sizes = partition.PartitionByCost(costs, k)
    self.assertLen(sizes, k)
    self.assertEqual(sum(sizes), n)
    self.assertGreaterEqual(min(sizes), 1)
    bounds = np.cumsum([0] + sizes)
    worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
    self.assertEqual(worst, _BruteForceBottleneck(costs, k))

  @parameterized.parameters(range(20))
  def testOptimalBottleneckWithSlowerDevices(self, seed):
    rng = np.random.RandomState(100 + seed)
    n = rng.randint(2, 10)
    k = rng.randint(1, n + 1)
    costs = list(rng.randint(0, 20, size=n).astype(float))
    factors = list(rng.uniform(0.5, 3.0, size=k))
    sizes = partition.PartitionByCost(costs, k, stage_factors=factors)
    self.assertEqual(sum(sizes), n)
    self.assertGreaterEqual(min(sizes), 1)
    self.assertAlmostEqual(_BruteForceBottleneck(costs, k, factors),
                           _Bottleneck(costs, sizes, factors))

  def testASlowDeviceGetsFewerLayers(self):
    self.assertEqual([2, 2], partition.PartitionByCost([1, 1, 1, 1], 2))
    self.assertEqual([3, 1], partition.PartitionByCost([1, 1, 1, 1], 2,
                                                       stage_factors=[1, 4]))
    with self.assertRaisesRegex(ValueError, 'stage_factors must be 2 finite '
                                'factors > 0'):
      partition.PartitionByCost([1, 1], 2, stage_factors=[1, 0])

  def testHeavyLayerGetsItsOwnStage(self):
    self.assertEqual(partition.PartitionByCost([1, 1, 10, 1, 1], 3),
                     [2, 1, 2])

  def testLargeCutIsFast(self):
    sizes = partition.PartitionByCost([1.0] * 1663, 128)
    self.assertEqual(sum(sizes), 1663)
    self.assertLessEqual(max(sizes), 13)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'cannot cut 2 layers into 3'):
      partition.PartitionByCost([1, 1], 3)
    with self.assertRaisesRegex(ValueError, 'finite and >= 0'):
      partition.PartitionByCost([1, -1], 1)
    with self.assertRaisesRegex(ValueError, "unknown partition_cost 'magic'"):
      partition.LayerCosts('magic', [])


class LayerCostsTest(test_utils.TestCase):

  def testFlopsPropagateShapes(self):
    layers = pipeline_testlib.DenseLayers(dims=[8, 32, 4], dtype=tf.float32)
    costs = partition.FlopsCosts(layers, [[16, 8]])
    self.assertEqual(costs, [2 * 16 * 8 * 32, 2 * 16 * 32 * 4])

  def testParamBytes(self):
    layers = pipeline_testlib.DenseLayers(dims=[8, 32, 4], dtype=tf.float32)
    self.assertEqual(partition.ParamsCosts(layers),
                     [4.0 * (8 * 32 + 32), 4.0 * (32 * 4 + 4)])

  def testMeasuredTimeFavorsTheBigLayer(self):
    # The middle layer has 64x the flops of each other one: a margin no
    # scheduling noise on a shared machine can close.
    layers = pipeline_testlib.DenseLayers(dims=[16, 1024, 1024, 16],
                                          dtype=tf.float32)
    costs = partition.TimeCosts(
        layers, [tf.TensorSpec([256, 16], tf.float32)], repeats=5)
    self.assertLen(costs, 3)
    self.assertGreater(costs[1], costs[0])
    self.assertGreater(costs[1], costs[2])

  def testPipelineCutsByCostAndReports(self):
    with tf.Graph().as_default():
      layers = pipeline_testlib.DenseLayers(dims=[8, 8, 256, 8, 8],
                                            dtype=tf.float32)
      net = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=layers, num_stages=2, num_micro_batches=2,
          partition_cost='params',
          stage_devices=['/device:CPU:0'] * 2).Instantiate()
      # The two big layers (8x256 and 256x8) go to different stages.
      self.assertEqual(net.stage_sizes, [2, 2])
      report = net.PartitionReport()
      lines = report.splitlines()
      self.assertLen(lines, 4)  # header, 2 stages, total
      self.assertIn('dense0 .. dense1', lines[1])
      self.assertIn('dense2 .. dense3', lines[2])
      total = 8 * 8 + 8 + 8 * 256 + 256 + 256 * 8 + 8 + 8 * 8 + 8
      self.assertIn('{:,}'.format(total), lines[3])



class StageCutTest(test_utils.TestCase):
  """partition.StageCut: the one cut that the layer and inspect_model share."""

  def _Params(self, **kwargs):
    return pipeline.PipeliningLayer.Params().Set(
        name='pipe', num_micro_batches=2, **kwargs)

  def testCutEqualsTheBuiltPipelineChildren(self):
    layers = pipeline_testlib.DenseLayers(dims=[8, 8, 256, 8, 8],
                                          dtype=tf.float32)
    p = self._Params(layers=layers, num_stages=2, partition_cost='params',
                     stage_devices=['/device:CPU:0'] * 2)
    cut = partition.StageCut(p)
    self.assertEqual(cut.sizes, [2, 2])
    self.assertEqual(cut.child_keys,
                     ['layer_000', 'layer_001', 'layer_002', 'layer_003'])
    self.assertEqual(cut.cost_name, 'params')
    self.assertEqual(cut.costs, partition.ParamsCosts(p.layers))
    with tf.Graph().as_default():
      net = p.Instantiate()
      self.assertEqual(net.stage_sizes, cut.sizes)
      self.assertEqual(sorted(net.children), cut.child_keys)

  def testCellsAreOneStageEach(self):
    cells = pipeline_testlib.DenseLayers(dims=[4, 4, 4], dtype=tf.float32)
    cut = partition.StageCut(self._Params(cell_tpl=cells))
    self.assertEqual(cut.sizes, [1, 1])
    self.assertEqual(cut.child_keys, ['cell_0', 'cell_1'])
    self.assertIsNone(cut.costs)

  def testExplicitSizesAndTimeWithoutRunning(self):
    layers = pipeline_testlib.DenseLayers(dims=[4, 4, 4, 4], dtype=tf.float32)
    cut = partition.StageCut(self._Params(layers=layers, num_stages=2,
                                          stage_sizes=[1, 2]))
    self.assertEqual(cut.sizes, [1, 2])
    self.assertIsNone(cut.costs)
    cut = partition.StageCut(
        self._Params(layers=layers, num_stages=3, partition_cost='time'),
        measure_time=False)
    self.assertEqual(cut.cost_name, 'params')
    self.assertEqual(cut.sizes, [1, 1, 1])

  def testErrorsSayWhatToSet(self):
    layers = pipeline_testlib.DenseLayers(dims=[4, 4, 4], dtype=tf.float32)
    with self.assertRaisesRegex(ValueError, 'set exactly one of cell_tpl'):
      partition.StageCut(self._Params(layers=layers, cell_tpl=layers))
    with self.assertRaisesRegex(ValueError, '`layers` needs num_stages'):
      partition.StageCut(self._Params(layers=layers))
    with self.assertRaisesRegex(ValueError, 'cannot cut 2 layers into 3'):
      partition.StageCut(self._Params(layers=layers, num_stages=3))
    with self.assertRaisesRegex(ValueError, 'must be 2 positive numbers'):
      partition.StageCut(self._Params(layers=layers, num_stages=2,
                                      stage_sizes=[2, 1]))


if __name__ == '__main__':
  tf.test.main()
