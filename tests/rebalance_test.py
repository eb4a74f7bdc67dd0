"""A slow device gets fewer layers (tools/trainer/rebalance.py)."""

from absl.testing import absltest
from tools.trainer import rebalance


class RebalancerTest(absltest.TestCase):

  def testASlowStageForSomeTracesMovesLayersAway(self):
    watch = rebalance.Rebalancer([1, 1, 1, 1], [2, 2], traces=3)
    # Stage 1 takes 4x its share of the cost.
    self.assertIsNone(watch.Observe([0.2, 0.8]))
    self.assertIsNone(watch.Observe([0.2, 0.8]))
    got = watch.Observe([0.2, 0.8])
    self.assertEqual((3, 1), got.sizes)
    self.assertEqual((2, 2), got.old_sizes)
    self.assertEqual((1,), got.slow)
    self.assertEqual((1.0, 4.0), got.factors)
    self.assertAlmostEqual(2.0, got.gain)  # max(2, 8) over max(3, 4)
    self.assertIn('cut [2, 2] -> [3, 1], predicted 2.00x as fast',
                  got.Describe())

  def testAStreakIsBrokenByABalancedStep(self):
    watch = rebalance.Rebalancer([1, 1, 1, 1], [2, 2], traces=2)
    self.assertIsNone(watch.Observe([0.2, 0.8]))
    self.assertIsNone(watch.Observe([0.2, 0.21]))
    self.assertIsNone(watch.Observe([0.2, 0.8]))
    self.assertIsNotNone(watch.Observe([0.2, 0.8]))

  def testTheSameStageMustStaySlow(self):
    watch = rebalance.Rebalancer([1, 1, 1, 1], [2, 2], traces=2)
    self.assertIsNone(watch.Observe([0.2, 0.8]))
    self.assertIsNone(watch.Observe([0.8, 0.2]))  # Stage 0 now: a new streak.
    self.assertEqual((1, 3), watch.Observe([0.8, 0.2]).sizes)

  def testACutMeasuredNoFasterIsNotProposedAgain(self):
    # Uniform costs, but layer 3 is nearly free: after [2, 2] -> [3, 1]
    # stage 0 looks slow for its share, and [1, 3] was measured slower.
    watch = rebalance.Rebalancer([1, 1, 1, 1], [2, 2], traces=1)
    got = watch.Observe([0.2, 0.8], span=1.0)
    self.assertEqual((3, 1), got.sizes)
    watch.UseCut(got.sizes)
    self.assertEqual((1, 3), watch.Observe([0.3, 0.01], span=0.5).sizes)
    watch.UseCut((1, 3))
    self.assertEqual((3, 1), watch.Observe([0.1, 1.2], span=1.5).sizes)
    watch.UseCut((3, 1))
    self.assertIsNone(watch.Observe([0.3, 0.01], span=0.5))

  def testWithinTheThresholdOrWithoutGainNothingMoves(self):
    watch = rebalance.Rebalancer([1, 1, 1, 1], [2, 2], traces=1)
    self.assertIsNone(watch.Observe([0.2, 0.24]))  # 20% above: not slow.
    # Slow, but one heavy layer each: no other cut is better.
    watch = rebalance.Rebalancer([1, 10, 10, 1], [2, 2], traces=1)
    self.assertIsNone(watch.Observe([1.1, 1.5]))
    # One stage: nothing to move.
    self.assertIsNone(rebalance.Rebalancer([1, 1], [2], traces=1).Observe(
        [1.0]))

  def testThreeStagesTheSlowOneAmongThem(self):
    watch = rebalance.Rebalancer([1.0] * 9, [3, 3, 3], traces=1)
    got = watch.Observe([0.3, 0.9, 0.3])
    self.assertEqual((1,), got.slow)
    self.assertEqual(9, sum(got.sizes))
    self.assertLess(got.sizes[1], 3)


if __name__ == '__main__':
  absltest.main()
