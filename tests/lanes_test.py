"""gpipe.lanes on toy stages: values, per-lane early stopping, errors.

Stage 0 adds its state to the lane's feedback and counts its steps; stage 1
doubles the result, which becomes the feedback of the lane's next step. The
loop's results equal the same recurrence in Python, with or without lanes
stopping early.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import numpy as np
from gpipe import lanes
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites

graph_rewrites.Off()

CONFIG = graph_rewrites.SessionConfig(device_count={'CPU': 2})
DEVICES = ['/device:CPU:0', '/device:CPU:1']


def _AddStep(theta, t, carry, state, constants):
  del t
  x = carry.x + state.total + constants + theta
  return py_utils.NestedMap(x=x), py_utils.NestedMap(
      total=state.total, steps=state.steps + 1)


def _DoubleStep(theta, t, carry, state, constants):
  del theta, constants
  x = 2.0 * carry.x
  return py_utils.NestedMap(x=x, t=t), py_utils.NestedMap(
      total=state.total, steps=state.steps + 1)


def _Reference(x, total, constant, theta, num_steps, limit=None):
  """(feedback, steps taken) of one lane in Python."""
  steps = 0
  for _ in range(num_steps):
    if limit is not None and x.max() > limit:
      break
    x = 2.0 * (x + total + constant + theta)
    steps += 1
  return x, steps


class LanesTest(test_utils.TestCase):

  def _Run(self, num_lanes, num_steps, limit=None):
    rng = np.random.RandomState(0)
    xs = [rng.rand(2).astype(np.float32) for _ in range(num_lanes)]
    totals = [np.float32(m) for m in range(num_lanes)]
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      stages, states, constants = [], [], []
      for k, (device, step) in enumerate(zip(DEVICES,
                                             (_AddStep, _DoubleStep))):
        with tf.device(device):
          stages.append(lanes.LaneStage(stage=k, device=device,
                                        theta=tf.constant(0.5), step=step))
          states.append([py_utils.NestedMap(total=tf.constant(totals[m]),
                                            steps=tf.constant(0))
                         for m in range(num_lanes)])
          constants.append([tf.constant(0.25) for _ in range(num_lanes)])
      with tf.device(DEVICES[1]):
        feedback = [py_utils.NestedMap(x=tf.constant(x), t=tf.constant(0))
                    for x in xs]
      done = None
      if limit is not None:
        done = lambda f: tf.reduce_max(f.x) > limit
      out, out_states = lanes.Decode(stages, feedback, states, constants,
                                     num_steps, lane_done=done)
      got, got_states = sess.run([out, out_states])
      calls = [op for op in sess.graph.get_operations()
               if op.type in ('While', 'StatelessWhile')]
      self.assertLen(calls, 1)
    for m in range(num_lanes):
      want, steps = _Reference(xs[m], totals[m], 0.25, 0.5, num_steps, limit)
      self.assertAllClose(want, got[m].x)
      # Each stage ran the steps the lane needed.
      self.assertEqual(steps, got_states[0][m].steps)
      self.assertEqual(steps, got_states[1][m].steps)
      if steps:
        self.assertEqual(steps - 1, got[m].t)
    return got_states

  def testLanesGiveThePythonRecurrence(self):
    for num_lanes in (1, 3):
      self._Run(num_lanes, 4)

  def testADoneLaneStopsWhileTheOthersGoOn(self):
    states = self._Run(3, 6, limit=20.0)
    steps = [s.steps for s in states[0]]
    # Lanes start from totals 0, 1, 2: the larger ones pass the limit first.
    self.assertEqual(sorted(steps, reverse=True), steps)
    self.assertLess(steps[-1], steps[0])

  def testInputsForEveryStageAndLane(self):
    with tf.Graph().as_default():
      stage = lanes.LaneStage(0, DEVICES[0], tf.constant(0.0), _AddStep)
      with self.assertRaisesRegex(ValueError, 'at least one stage'):
        lanes.Decode([], [1], [], [], 2)
      with self.assertRaisesRegex(ValueError, 'states of stage 0: one entry '
                                  'per lane: 2 lanes, 1 entries'):
        lanes.Decode([stage], [1, 2], [[1]], [[1, 2]], 2)


if __name__ == '__main__':
  tf.test.main()
