"""The pipeline's shape for another device count (tools/trainer/reshape.py)."""

from absl.testing import absltest
from tests import plan_testlib
from tools.trainer import reshape

Shape = reshape.Shape


class FallbackTest(absltest.TestCase):

  def testKeepsThePipelineAndRxMWithFewerReplicas(self):
    start = Shape(2, 2, 2, 'gpipe')
    got = reshape.Fallback(start, 3)
    self.assertEqual(Shape(1, 2, 4, 'gpipe'), got.shape)
    self.assertEqual(reshape.FALLBACK, got.how)
    self.assertTrue(got.keeps_math)
    self.assertIn('on 2 of 3 device(s)', got.note)
    # Back to every device: the starting shape again.
    self.assertEqual(start, reshape.Fallback(start, 4).shape)
    self.assertEqual(start, reshape.Fallback(start, 5).shape)

  def testReplicasDivideRxM(self):
    # R x M = 6 on 4 devices of one stage each: 3 replicas, not 4.
    got = reshape.Fallback(Shape(6, 1, 1, 'gpipe'), 4)
    self.assertEqual(Shape(3, 1, 2, 'gpipe'), got.shape)

  def testShorterPipelineWithFewerDevicesThanStages(self):
    got = reshape.Fallback(Shape(1, 4, 4, '1f1b'), 3)
    self.assertEqual(Shape(1, 3, 4, '1f1b'), got.shape)
    self.assertIn('shorter pipeline on all 3 device(s)', got.note)
    self.assertEqual(Shape(1, 1, 8, 'gpipe'),
                     reshape.Fallback(Shape(2, 2, 4, 'gpipe'), 1).shape)
    # A V keeps two stages per device.
    self.assertEqual(Shape(1, 2, 8, 'zb_v', 2),
                     reshape.Fallback(Shape(1, 4, 8, 'zb_v', 2), 1).shape)
    self.assertTrue(Shape(1, 4, 8, 'gpipe', 2).loop_stages)
    self.assertEqual(Shape(1, 2, 8, 'gpipe', 2),
                     reshape.Fallback(Shape(1, 4, 8, 'gpipe', 2), 1).shape)

  def testFillDrainWhenTheScheduleCannotRunTheShorterPipeline(self):
    # 1F1B on 3 devices would need M >= 3: R x M = 2 is kept by fill-drain.
    got = reshape.Fallback(Shape(1, 4, 2, '1f1b'), 3)
    self.assertEqual(Shape(1, 3, 2, 'gpipe'), got.shape)
    # Never more stages than layers.
    with self.assertRaisesRegex(reshape.NoShapeError, 'fits 3 device'):
      reshape.Fallback(Shape(1, 4, 2, '1f1b'), 3, num_layers=2)
    with self.assertRaisesRegex(reshape.NoShapeError, 'no device'):
      reshape.Fallback(Shape(1, 4, 2, '1f1b'), 0)

  def testLabel(self):
    self.assertEqual('R=2 K=4 M=8 zb_v v=2', Shape(2, 4, 8, 'zb_v', 2).label)
    self.assertEqual(4, Shape(2, 4, 8, 'zb_v', 2).num_devices)


class FromProfileTest(absltest.TestCase):

  def testKeepsRxMOnTheMostDevices(self):
    profile = plan_testlib.UniformProfile(4, batch=32)
    start = Shape(2, 2, 2, 'gpipe')
    got = reshape.FromProfile(profile, start, 3)
    self.assertEqual(reshape.PROFILE, got.how)
    self.assertEqual(3, got.plan.num_devices)
    self.assertEqual(4, got.shape.micro_batches_per_step)
    self.assertTrue(got.keeps_math, got.note)
    self.assertEqual(got.shape, reshape.FromPlan(got.plan))

  def testOtherRxMWhenNoneKeepsIt(self):
    # R x M = 3 cannot be kept: the batch of 32 does not divide by 3.
    profile = plan_testlib.UniformProfile(4, batch=32)
    got = reshape.FromProfile(profile, Shape(1, 1, 3, 'gpipe'), 2)
    self.assertFalse(got.keeps_math)
    self.assertIn('instead of 3', got.note)

  def testNothingFitsSaysWhatADeviceWouldNeed(self):
    profile = plan_testlib.UniformProfile(4, batch=32, param_bytes=2**20,
                                          activation=2**20)
    with self.assertRaisesRegex(
        reshape.NoShapeError,
        r'the 2 device\(s\) that serve cannot hold uniform under '
        r'--memory_per_device=1.0 KiB: the leanest configuration needs .* on '
        r'its fullest device, and the weights and optimizer slots alone need '
        r'2.0 MiB on a device at best'):
      reshape.FromProfile(profile, Shape(1, 2, 2, 'gpipe'), 2,
                          memory_per_device=1024)


class CheckWeightsTest(absltest.TestCase):

  def testCapBelowTheWeights(self):
    shape = Shape(1, 2, 4, 'gpipe')
    reshape.CheckWeights(1200, shape, None)
    reshape.CheckWeights(None, shape, 10)
    reshape.CheckWeights(1200, shape, 600)
    with self.assertRaisesRegex(
        reshape.NoShapeError, r'the 2 device\(s\) of R=1 K=2 M=4 gpipe '
        r'cannot hold the model under --memory_per_device=599 B: its weights '
        r'and optimizer slots alone \(1.2 KiB\) need at least 600 B on each'):
      reshape.CheckWeights(1200, shape, 599)


if __name__ == '__main__':
  absltest.main()
