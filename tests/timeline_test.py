"""Timeline parsing of a traced pipeline step, bubble and PNG."""

from gpipe import lingvo_import  # pylint: disable=unused-import

from gpipe import pipeline
from gpipe import timeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import toy_layers


class TimelineTest(test_utils.TestCase):

  def _TracedStep(self, remat, num_stages=2):
    config = tf.compat.v1.ConfigProto(device_count={'CPU': 2})
    with self.session(graph=tf.Graph(), config=config) as sess:
      layers = [
          toy_layers.DenseDropout.Params().Set(
              name='d%d' % i, input_dim=64, output_dim=64) for i in range(4)
      ]
      net = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=layers, num_stages=num_stages,
          num_micro_batches=3, remat=remat,
          stage_devices=['/device:CPU:%d' % (k % 2)
                         for k in range(num_stages)]).Instantiate()
      x = tf.constant(np.random.RandomState(0).randn(24, 64), tf.float32)
      loss = tf.reduce_sum(tf.square(net.FProp(net.theta, x)))
      grads = tf.gradients(loss, net.vars.Flatten())
      sess.run(tf.global_variables_initializer())
      metadata = tf.compat.v1.RunMetadata()
      sess.run(grads, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
      return timeline.ParseStepStats(metadata.step_stats)

  def testTasksBubbleAndPicture(self):
    tasks = self._TracedStep('always')
    self.assertLen(tasks, 2 * 2 * 3)
    self.assertEqual(timeline.NumStages(tasks), 2)
    for stage in range(2):
      mine = [t for t in tasks if t.stage == stage]
      # The schedule's order: F0 F1 F2 then B2 B1 B0, never overlapping.
      self.assertEqual([(t.phase, t.micro_batch) for t in mine],
                       [('F', 0), ('F', 1), ('F', 2), ('B', 2), ('B', 1),
                        ('B', 0)])
      for a, b in zip(mine, mine[1:]):
        self.assertLessEqual(a.end, b.start + 1e-6)
      self.assertTrue(all(t.device.endswith('CPU:%d' % stage) for t in mine))
    # Stage 1 cannot start before stage 0 finished micro-batch 0.
    first = {(t.stage, t.phase, t.micro_batch): t for t in tasks}
    self.assertGreaterEqual(first[(1, 'F', 0)].start, first[(0, 'F', 0)].end)
    # With remat, backward tasks begin with a recomputed forward pass.
    backward = [t for t in tasks if t.phase == 'B']
    self.assertTrue(all(t.start <= t.recompute_end <= t.end for t in backward))
    self.assertGreater(sum(timeline.StageRecomputeSeconds(tasks)), 0)
    bubbles = timeline.BubbleFractions(tasks)
    self.assertLen(bubbles, 2)
    for b in bubbles:
      self.assertGreaterEqual(b, 0.0)
      self.assertLess(b, 1.0)
    png = timeline.RenderPNG(tasks, title='test')
    self.assertEqual(png[:8], b'\x89PNG\r\n\x1a\n')

  def testLoopedStagesRunBreadthFirstOnEachDevice(self):
    tasks = self._TracedStep('always', num_stages=4)
    self.assertLen(tasks, 4 * 2 * 3)
    self.assertEqual(timeline.NumStages(tasks), 4)
    self.assertLen(timeline.Devices(tasks), 2)
    for d, device in enumerate(timeline.Devices(tasks)):
      mine = [t for t in tasks if t.device == device]
      self.assertEqual(
          [(t.stage, t.phase, t.micro_batch) for t in mine],
          [(d, 'F', 0), (d, 'F', 1), (d, 'F', 2),
           (d + 2, 'F', 0), (d + 2, 'F', 1), (d + 2, 'F', 2),
           (d + 2, 'B', 2), (d + 2, 'B', 1), (d + 2, 'B', 0),
           (d, 'B', 2), (d, 'B', 1), (d, 'B', 0)])
      for a, b in zip(mine, mine[1:]):
        self.assertLessEqual(a.end, b.start + 1e-6)  # one task at a time
    self.assertLen(timeline.BubbleFractions(tasks, by='device'), 2)
    self.assertLen(timeline.BubbleFractions(tasks), 4)
    png = timeline.RenderPNG(tasks, title='looped', by='device')
    self.assertEqual(png[:8], b'\x89PNG\r\n\x1a\n')
    with self.assertRaisesRegex(ValueError, "'stage' or 'device'"):
      timeline.BubbleFractions(tasks, by='core')

  def testNoRecomputeWithoutRemat(self):
    tasks = self._TracedStep('never')
    self.assertLen(tasks, 12)
    self.assertEqual(sum(timeline.StageRecomputeSeconds(tasks)), 0.0)


if __name__ == '__main__':
  tf.test.main()
