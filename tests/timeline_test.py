"""Timeline parsing of a traced pipeline step, bubble, PNG and trace file."""

import json
import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.measure import timeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib


class TimelineTest(test_utils.TestCase):

  def _TracedStep(self, remat, num_stages=2):
    # Grappler on: the timeline of a step as users run it.
    config = graph_rewrites.CpuConfig(2, grappler=True)
    with self.session(graph=tf.Graph(), config=config) as sess:
      layers = pipeline_testlib.DenseLayers(4, input_dim=64, output_dim=64,
                                            dtype=tf.float32)
      net = pipeline_testlib.Pipeline(
          layers, num_stages, 3, remat=remat, dtype=tf.float32,
          stage_devices=['/device:CPU:%d' % (k % 2)
                         for k in range(num_stages)])
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

  def testChromeTraceOfATracedStep(self):
    tasks = self._TracedStep('always')
    trace = timeline.ChromeTrace(tasks, step=7)
    slices = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    backward = [t for t in tasks if t.phase == 'B']
    recomputes = [e for e in slices if e['name'] == 'recompute']
    self.assertLen(recomputes, len(backward))  # remat='always'
    self.assertLen(slices, len(tasks) + len(backward))
    names = {e['args']['name'] for e in trace['traceEvents']
             if e['name'] == 'process_name'}
    self.assertEqual(names, set(timeline.Devices(tasks)))
    for e in slices:
      if e['name'] != 'recompute':
        # Stage k runs on CPU:k here, the first device of stage k.
        self.assertEqual(e['pid'], e['args']['stage'] + 1)
        self.assertEqual(e['tid'], e['args']['stage'] + 1)
    path = os.path.join(self.get_temp_dir(), 'step7.trace.json')
    timeline.WriteChromeTrace(tasks, path, step=7)
    with open(path) as f:
      self.assertEqual(json.load(f), trace)


def _Task(stage, micro_batch, phase, device, start_ms, end_ms,
          recompute_end_ms=None):
  """A TaskTime from milliseconds (recompute_end defaults to no recompute)."""
  if recompute_end_ms is None:
    recompute_end_ms = start_ms
  return timeline.TaskTime(stage, micro_batch, phase, device, start_ms * 1e-3,
                           end_ms * 1e-3, recompute_end_ms * 1e-3)


class ChromeTraceTest(test_utils.TestCase):

  # Stages 0 and 2 share CPU:0 (a looped schedule); a W (weight-gradient)
  # task checks that any phase letter becomes an event.
  TASKS = [
      _Task(0, 0, 'F', '/device:CPU:0', 0.0, 1.0),
      _Task(1, 0, 'F', '/device:CPU:1', 1.0, 2.5),
      _Task(2, 0, 'F', '/device:CPU:0', 2.5, 3.0),
      _Task(2, 0, 'B', '/device:CPU:0', 3.0, 5.0, recompute_end_ms=4.0),
      _Task(2, 0, 'W', '/device:CPU:0', 5.0, 5.5),
      _Task(1, 0, 'B', '/device:CPU:1', 5.5, 7.0),
      _Task(0, 3, 'B', '/device:CPU:0', 7.0, 9.0, recompute_end_ms=7.5),
  ]

  def _Events(self, trace, ph, name=None):
    return [e for e in trace['traceEvents']
            if e['ph'] == ph and (name is None or e['name'] == name)]

  def testProcessPerDeviceThreadPerStage(self):
    trace = timeline.ChromeTrace(self.TASKS)
    self.assertEqual(trace['displayTimeUnit'], 'ms')
    self.assertNotIn('otherData', trace)
    processes = {e['pid']: e['args']['name']
                 for e in self._Events(trace, 'M', 'process_name')}
    self.assertEqual(processes, {1: '/device:CPU:0', 2: '/device:CPU:1'})
    threads = {(e['pid'], e['tid']): e['args']['name']
               for e in self._Events(trace, 'M', 'thread_name')}
    self.assertEqual(threads, {(1, 1): 'stage 0', (2, 2): 'stage 1',
                               (1, 3): 'stage 2'})
    tasks = [e for e in self._Events(trace, 'X') if e['name'] != 'recompute']
    self.assertEqual([e['name'] for e in tasks],
                     ['F0', 'F0', 'F0', 'B0', 'W0', 'B0', 'B3'])
    self.assertEqual([(e['pid'], e['tid']) for e in tasks],
                     [(1, 1), (2, 2), (1, 3), (1, 3), (1, 3), (2, 2),
                      (1, 1)])
    self.assertEqual(tasks[-1]['args'],
                     {'stage': 0, 'micro_batch': 3, 'phase': 'B'})
    self.assertEqual(tasks[4]['args']['phase'], 'W')

  def testMicrosecondTimesAndNestedRecompute(self):
    trace = timeline.ChromeTrace(self.TASKS)
    tasks = [e for e in self._Events(trace, 'X') if e['name'] != 'recompute']
    self.assertEqual([(e['ts'], e['dur']) for e in tasks],
                     [(0.0, 1000.0), (1000.0, 1500.0), (2500.0, 500.0),
                      (3000.0, 2000.0), (5000.0, 500.0), (5500.0, 1500.0),
                      (7000.0, 2000.0)])
    recomputes = self._Events(trace, 'X', 'recompute')
    # Only the two backward tasks that recompute have one.
    self.assertEqual([(e['ts'], e['dur']) for e in recomputes],
                     [(3000.0, 1000.0), (7000.0, 500.0)])
    events = trace['traceEvents']
    for r in recomputes:
      parent = events[events.index(r) - 1]  # listed right after its task
      self.assertEqual(parent['name'][0], 'B')
      self.assertEqual((r['pid'], r['tid']), (parent['pid'], parent['tid']))
      self.assertEqual(r['args'], parent['args'])
      self.assertGreaterEqual(r['ts'], parent['ts'])
      self.assertLessEqual(r['ts'] + r['dur'], parent['ts'] + parent['dur'])

  def testWritesJsonWithTheStep(self):
    path = os.path.join(self.get_temp_dir(), 'trace.json')
    trace = timeline.WriteChromeTrace(self.TASKS, path, step=42)
    with open(path) as f:
      loaded = json.load(f)
    self.assertEqual(loaded, trace)
    self.assertEqual(loaded['otherData'], {'step': 42})
    self.assertLen(self._Events(loaded, 'X'), len(self.TASKS) + 2)

  def testNoTasksNoEvents(self):
    self.assertEqual(timeline.ChromeTrace([]),
                     {'traceEvents': [], 'displayTimeUnit': 'ms'})


if __name__ == '__main__':
  tf.test.main()
