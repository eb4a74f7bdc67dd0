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

CONFIG = graph_rewrites.CpuConfig(2)
DEVICES = graph_rewrites.CpuDevices(2)


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

  def testStepCountersStayOnTheirDevices(self):
    # Loop stages placed d0, d2, d0, d1, d2 (not stage k on device k): every
    # op of the loop body that reads a device's step counter runs on that
    # device, so the counter never crosses devices.
    placement = [0, 2, 0, 1, 2]
    devices = graph_rewrites.CpuDevices(3)
    with tf.Graph().as_default() as graph:
      stages, states, constants = [], [], []
      for k, d in enumerate(placement):
        with tf.device(devices[d]):
          stages.append(lanes.LaneStage(
              stage=k, device=devices[d], theta=tf.constant(0.5),
              step=_DoubleStep))
          states.append([py_utils.NestedMap(total=tf.constant(1.0),
                                            steps=tf.constant(0))
                         for _ in range(2)])
          constants.append([tf.constant(0.25) for _ in range(2)])
      with tf.device(devices[2]):
        feedback = [py_utils.NestedMap(x=tf.constant([1.0, 2.0]),
                                       t=tf.constant(0)) for _ in range(2)]
      lanes.Decode(stages, feedback, states, constants, 3)
      loop, = [op for op in graph.get_operations()
               if op.type in ('While', 'StatelessWhile')]
      library = {f.signature.name: f
                 for f in graph.as_graph_def().library.function}
    body = library[loop.get_attr('body').name]
    args = [a.name for a in body.signature.input_arg]
    # The body's inputs: while_v2's iteration count and limit, the step,
    # then one counter per device in the order of first use (d0, d2, d1).
    counter_device = {args[3 + i]: '/device:CPU:%d' % d
                      for i, d in enumerate([0, 2, 1])}
    for i, d in enumerate([0, 2, 1]):
      self.assertEqual(loop.inputs[3 + i].device, devices[d])
    readers = {}
    for node in body.node_def:
      for x in node.input:
        source = x.split(':')[0].lstrip('^')
        if source in counter_device:
          readers.setdefault(source, []).append(node)
    self.assertLen(readers, 3)
    for arg, nodes in readers.items():
      for node in nodes:
        self.assertEqual(
            tf.DeviceSpec.from_string(node.device).to_string(),
            tf.DeviceSpec.from_string(counter_device[arg]).to_string(),
            '%s (%s) reads the counter of %s' % (node.name, node.op,
                                                 counter_device[arg]))

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
