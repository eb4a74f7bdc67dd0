"""The decoding-lanes schedule as pure functions (no TensorFlow graph)."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.schedules import decode_lanes as lanes
from lingvo import compat as tf
from lingvo.core import test_utils

LaneTask = lanes.LaneTask


class DecodeLanesTest(test_utils.TestCase):

  def testWhileStageKRunsLaneMStageKPlusOneRunsLaneMMinusOne(self):
    k, m, t = 3, 4, 3
    grid = lanes.Simulate(k, m, t)
    for tick in range(len(grid[0])):
      for s in range(k - 1):
        here, there = grid[s][tick], grid[s + 1][tick]
        if here is not None and there is not None:
          self.assertEqual(there.lane, (here.lane - 1) % m)
    # After a fill of K-1 ticks every device is busy until its last task.
    for s, row in enumerate(grid):
      busy = [i for i, task in enumerate(row) if task is not None]
      self.assertEqual(busy, list(range(s, s + m * t)))

  def testBubbleFormulaEqualsTheSimulation(self):
    for k in (1, 2, 3, 4):
      for m in (1, 2, 3, 4, 8):
        for t in (1, 2, 5):
          self.assertAllClose(lanes.BubbleFraction(k, m, t),
                              lanes.SimulatedBubble(k, m, t),
                              msg='K=%d M=%d T=%d' % (k, m, t))
    # M >= K: only the fill and the drain, (K-1)/(TM+K-1).
    self.assertAllClose(lanes.BubbleFraction(2, 4, 10), 1.0 / 41)
    # M < K: a lane's token needs K ticks to come back.
    self.assertAllClose(lanes.BubbleFraction(4, 1, 1000), 0.75, atol=1e-3)

  def testEveryTaskRunsAfterWhatItReads(self):
    for devices in ([0, 1, 2, 3], [0, 1, 1, 0], [0, 1, 0, 1], [0, 0]):
      k = len(devices)
      times = {}
      for row in lanes.Simulate(devices, 3, 4):
        for tick, task in enumerate(row):
          if task is not None:
            times.setdefault(task, tick)
      self.assertLen(times, k * 3 * 4)
      for task, start in times.items():
        for dep in lanes.Dependencies(task, k):
          self.assertLess(times[dep], start, (devices, task, dep))

  def testStepOrders(self):
    devices, orders = lanes.StepOrders(2, 3)
    self.assertEqual(devices, [0, 1])
    self.assertEqual(orders, [[(0, 0), (0, 1), (0, 2)],
                              [(1, 0), (1, 1), (1, 2)]])
    # A device holding stages 0 and 3 (a V) runs both within each step,
    # by the tick of one stage per device.
    _, orders = lanes.StepOrders(['a', 'b', 'b', 'a'], 2)
    self.assertEqual(orders[0], [(0, 0), (0, 1), (3, 0), (3, 1)])
    self.assertEqual(orders[1], [(1, 0), (1, 1), (2, 0), (2, 1)])
    _, full = lanes.DeviceOrders(['a', 'b', 'b', 'a'], 2, 2)
    self.assertEqual(full[0][:5], [
        LaneTask(0, 0, 0), LaneTask(0, 1, 0), LaneTask(3, 0, 0),
        LaneTask(3, 1, 0), LaneTask(0, 0, 1)])

  def testDocstringDrawings(self):
    doc = '\n'.join(line.strip() for line in lanes.__doc__.splitlines())
    self.assertIn(lanes.Render(2, 3, 3), doc)
    self.assertIn(lanes.Render(3, 2, 3), doc)
    self.assertIn('a0s3', lanes.Render([0, 1, 1, 0], 2, 2))

  def testLabels(self):
    self.assertEqual(lanes.Label(LaneTask(1, 2, 7)), 'c7')
    self.assertEqual(lanes.Label(LaneTask(0, 27, 3)), 'l27.3')

  def testDefaultNumLanes(self):
    self.assertEqual(lanes.DefaultNumLanes(1, 64), 1)
    self.assertEqual(lanes.DefaultNumLanes(2, 64), 2)
    self.assertEqual(lanes.DefaultNumLanes(4, 3), 3)

  def testEncoderMicroBatches(self):
    # Lanes split into whole micro-batches, at least 4 per device.
    self.assertEqual(lanes.EncoderMicroBatches(2, 256, 2), 8)
    self.assertEqual(lanes.EncoderMicroBatches(2, 256, 8), 8)
    with self.assertRaisesRegex(ValueError,
                                '3 lanes must divide the batch of 256'):
      lanes.EncoderMicroBatches(2, 256, 3)
    self.assertEqual(lanes.EncoderMicroBatches(2, 256, 16), 16)
    self.assertEqual(lanes.EncoderMicroBatches(2, 12, 3), 12)
    # No multiple of M reaches 4D: the largest dividing the batch.
    self.assertEqual(lanes.EncoderMicroBatches(4, 8, 2), 8)
    # One device: no pipeline to fill.
    self.assertEqual(lanes.EncoderMicroBatches(1, 256, 4), 1)

  def testSizesAreChecked(self):
    with self.assertRaisesRegex(ValueError, '0 lanes'):
      lanes.StepOrders(2, 0)
    with self.assertRaisesRegex(ValueError, '0 steps'):
      lanes.BubbleFraction(2, 2, 0)


if __name__ == '__main__':
  tf.test.main()
