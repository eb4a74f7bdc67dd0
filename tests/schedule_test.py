"""The schedule as a pure function: order, dependencies, bubble."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import itertools

from absl.testing import parameterized
from gpipe.schedules import pipeline_tasks
from gpipe import schedules
from lingvo import compat as tf
from lingvo.core import test_utils


class GPipeScheduleTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.parameters(itertools.product([1, 2, 3, 4], [1, 2, 4, 8]))
  def testEveryTaskOnceAndDependenciesRespected(self, k, m):
    ticks = schedules.orders.GPipeClockCycles(k, m)
    self.assertLen(ticks, 2 * (m + k - 1))
    when = {}
    for t, tick in enumerate(ticks):
      self.assertLen({task.stage for task in tick}, len(tick))  # 1 per stage
      for task in tick:
        self.assertNotIn(task, when)
        when[task] = t
    self.assertLen(when, 2 * k * m)
    for s, mb in itertools.product(range(k), range(m)):
      forward = pipeline_tasks.Task(s, mb, 'F')
      backward = pipeline_tasks.Task(s, mb, 'B')
      if s > 0:  # needs the previous stage's output
        self.assertLess(when[pipeline_tasks.Task(s - 1, mb, 'F')],
                        when[forward])
      if s < k - 1:  # needs the next stage's input gradient
        self.assertLess(when[pipeline_tasks.Task(s + 1, mb, 'B')],
                        when[backward])
      self.assertLess(when[forward], when[backward])

  def testStageOrdersAreFillThenDrainInReverse(self):
    orders = schedules.orders.StageOrders(
        schedules.orders.GPipeClockCycles(3, 4), 3)
    for order in orders:
      self.assertEqual([(t.phase, t.micro_batch) for t in order],
                       [('F', 0), ('F', 1), ('F', 2), ('F', 3), ('B', 3),
                        ('B', 2), ('B', 1), ('B', 0)])

  def testForwardOnly(self):
    ticks = schedules.render.ClockCycles('gpipe', 2, 3, backward=False)
    self.assertEqual([[(t.stage, t.micro_batch) for t in tick]
                      for tick in ticks],
                     [[(0, 0)], [(0, 1), (1, 0)], [(0, 2), (1, 1)], [(1, 2)]])

  def testRender(self):
    text = schedules.render.Render(schedules.orders.GPipeClockCycles(2, 3), 2)
    self.assertEqual(
        text, 'stage 0 | F0 F1 F2 .  .  B2 B1 B0\n'
        'stage 1 | .  F0 F1 F2 B2 B1 B0 .')

  @parameterized.parameters((1, 1, 0.0), (2, 1, 0.5), (4, 4, 3 / 7),
                            (4, 32, 3 / 35))
  def testBubbleFraction(self, k, m, expected):
    self.assertAlmostEqual(schedules.simulate.BubbleFraction(k, m), expected)
    # The same fraction, counted in the idle cells of the rendered schedule.
    ticks = schedules.orders.GPipeClockCycles(k, m, backward=False)
    idle = sum(k - len(tick) for tick in ticks)
    self.assertAlmostEqual(idle / (k * len(ticks)), expected)

  @parameterized.parameters(itertools.product([1, 2, 3], [1, 4, 8]))
  def testOneStagePerDeviceKeepsStageOrders(self, k, m):
    ticks = schedules.orders.GPipeClockCycles(k, m)
    devices, orders = schedules.orders.DeviceOrders(
        ticks, ['d%d' % s for s in range(k)])
    self.assertEqual(devices, ['d%d' % s for s in range(k)])
    self.assertEqual(orders, schedules.orders.StageOrders(ticks, k))
    # Unit-cost simulation of those orders reproduces the fill-drain bubble.
    self.assertAlmostEqual(
        schedules.simulate.SimulatedBubble(orders, k, m),
        schedules.simulate.BubbleFraction(k, m))

  def testLoopedStagesRunBreadthFirst(self):
    ticks = schedules.orders.GPipeClockCycles(4, 2)
    devices, orders = schedules.orders.DeviceOrders(ticks, ['a', 'b', 'a', 'b'])
    self.assertEqual(devices, ['a', 'b'])
    self.assertEqual(
        [['%s%ds%d' % (t.phase, t.micro_batch, t.stage) for t in o]
         for o in orders],
        [['F0s0', 'F1s0', 'F0s2', 'F1s2', 'B1s2', 'B0s2', 'B1s0', 'B0s0'],
         ['F0s1', 'F1s1', 'F0s3', 'F1s3', 'B1s3', 'B0s3', 'B1s1', 'B0s1']])
    lanes = schedules.simulate.Simulate(orders, 4, 2)
    self.assertEqual(
        schedules.render.RenderDevices(lanes, devices),
        'a | F0s0 F1s0 F0s2 F1s2 .    .    B1s2 B0s2 B1s0 B0s0\n'
        'b | .    F0s1 F1s1 F0s3 F1s3 B1s3 B0s3 B1s1 B0s1 .')

  @parameterized.parameters((2, 8), (2, 4), (3, 6), (4, 16))
  def testLoopingShrinksTheBubble(self, num_devices, m):
    for v in (1, 2, 4):
      k = v * num_devices
      _, orders = schedules.orders.DeviceOrders(
          schedules.orders.GPipeClockCycles(k, m),
          [s % num_devices for s in range(k)])
      # (D-1)/(vM+D-1) with tasks 1/v as long as one stage per device.
      self.assertAlmostEqual(
          schedules.simulate.SimulatedBubble(orders, k, m),
          (num_devices - 1) / (v * m + num_devices - 1))

  @parameterized.parameters(itertools.product([2, 3, 4], [1, 2, 3],
                                              [1, 2, 3, 5, 8]))
  def testLoopedBubbleMatchesSimulation(self, num_devices, v, m):
    k = v * num_devices
    _, orders = schedules.orders.DeviceOrders(
        schedules.orders.GPipeClockCycles(k, m),
        [s % num_devices for s in range(k)])
    self.assertAlmostEqual(
        schedules.simulate.LoopedBubbleFraction(num_devices, v, m),
        schedules.simulate.SimulatedBubble(orders, k, m))

  def testLoopingCannotHelpOneMicroBatch(self):
    # One micro-batch visits the devices in turn: each idles (D-1)/D.
    self.assertAlmostEqual(
        schedules.simulate.LoopedBubbleFraction(2, 4, 1), 0.5)
    self.assertAlmostEqual(schedules.simulate.LoopedBubbleFraction(2, 1, 1),
                           schedules.simulate.BubbleFraction(2, 1))
    with self.assertRaisesRegex(ValueError, 'stages_per_device must be >= 1'):
      schedules.simulate.LoopedBubbleFraction(2, 0, 4)

  def testDeadlockedOrdersSaySo(self):
    ticks = schedules.orders.GPipeClockCycles(2, 2)
    orders = schedules.orders.StageOrders(ticks, 2)
    orders[1] = list(reversed(orders[1]))  # backward before its forward
    with self.assertRaisesRegex(ValueError, 'deadlock'):
      schedules.simulate.Simulate(orders, 2, 2)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, "unknown schedule 'zigzag'"):
      schedules.render.ClockCycles('zigzag', 2, 2)
    with self.assertRaisesRegex(ValueError, '>= 1 micro-batch'):
      schedules.orders.GPipeClockCycles(2, 0)



def _Placement(name, num_devices):
  """Stage devices of `name` on D devices (2 stages per device if looped)."""
  if name == 'zb_v':
    return schedules.orders.VPlacement(2 * num_devices)
  if name == 'interleaved_1f1b':
    return schedules.orders.RoundRobinPlacement(2 * num_devices, num_devices)
  return list(range(num_devices))


class SchedulesSinceGPipeTest(test_utils.TestCase, parameterized.TestCase):
  """1F1B, interleaved 1F1B, ZB-H1, ZB-V: pure task orders."""

  @parameterized.parameters(itertools.product(
      list(schedules.Names()), [1, 2, 4], [4, 8, 12]))
  def testEveryTaskOnceAndTheOrdersRun(self, name, d, m):
    if name == 'interleaved_1f1b' and m % d:
      return
    devices = _Placement(name, d)
    k = len(devices)
    _, orders = schedules.Orders(name, devices, m)
    phases = 'FBW' if schedules.Get(name).split_backward else 'FB'
    tasks = [t for order in orders for t in order]
    self.assertCountEqual(
        tasks, [pipeline_tasks.Task(s, i, p) for s in range(k) for i in range(m)
                for p in phases])
    for lane, order in enumerate(orders):
      self.assertTrue(all(devices[t.stage] == lane for t in order))
    # TaskTimes raises if the orders deadlock; each task after its inputs.
    times = schedules.simulate.TaskTimes(orders, k, m,
                               schedules.Get(name).per_micro_batch_loss)
    end = {t: e for lane in times for t, _, e in lane}
    start = {t: b for lane in times for t, b, _ in lane}
    for t in tasks:
      if t.phase == 'F' and t.stage:
        self.assertLessEqual(
            end[pipeline_tasks.Task(t.stage - 1, t.micro_batch, 'F')],
            start[t])
      if t.phase == 'W':
        self.assertLessEqual(
            end[pipeline_tasks.Task(t.stage, t.micro_batch, 'B')], start[t])

  @parameterized.parameters(itertools.product(['1f1b', 'zb_h1'], [2, 3, 4],
                                              [4, 8, 16]))
  def testStageSHoldsAtMostKMinusSMicroBatches(self, name, k, m):
    for costs in (None, schedules.simulate.RematCosts(True)):
      _, orders = schedules.Orders(name, k, m, costs)
      for s, order in enumerate(orders):
        held = peak = held_w = peak_w = 0
        for t in order:
          held += {'F': 1, 'B': -1, 'W': 0}[t.phase]
          held_w += {'F': 1, 'B': 0, 'W': -1}[t.phase]
          peak, peak_w = max(peak, held), max(peak_w, held_w)
        self.assertEqual(peak, min(k - s, m))  # Full activations: 1F1B's.
        if name == 'zb_h1':  # Awaiting W: what the weight gradients need.
          self.assertLessEqual(peak_w, 2 * k - s)

  @parameterized.parameters(itertools.product(
      list(schedules.Names()), [2, 4], [4, 8, 16, 32]))
  def testSimulatedBubbleIsTheFormula(self, name, d, m):
    devices = _Placement(name, d)
    _, orders = schedules.Orders(name, devices, m)
    k = len(devices)
    simulated = schedules.simulate.SimulatedBubble(
        orders, k, m, schedules.Get(name).per_micro_batch_loss,
        schedules.registry.Costs(name))
    self.assertAlmostEqual(
        simulated, schedules.registry.BubbleFormula(name, d, k // d, m),
        places=9)

  def testZeroBubbleBeatsOneFOneB(self):
    for m in (4, 8, 16):
      one_f_one_b = schedules.registry.BubbleFormula('1f1b', 4, 1, m)
      self.assertAlmostEqual(
          schedules.registry.BubbleFormula('zb_h1', 4, 1, m),
          one_f_one_b / (3 - 2 * one_f_one_b))  # A third of the idle ticks.
      self.assertLess(schedules.registry.BubbleFormula('zb_v', 2, 2, m),
                      schedules.registry.BubbleFormula('zb_h1', 4, 1, m))

  def testDocstringDrawingsAreTheRenderedSchedules(self):
    for fn, args in ((schedules.orders.OneFOneBOrders, ('1f1b', 3, 6)),
                     (schedules.orders.ZeroBubbleH1Orders, ('zb_h1', 3, 6)),
                     (schedules.orders.InterleavedOrders,
                      ('interleaved_1f1b', [0, 1, 0, 1], 2)),
                     (schedules.orders.ZeroBubbleVOrders,
                      ('zb_v', [0, 1, 1, 0], 2))):
      drawing = '\n'.join(line.strip() for line in
                          schedules.render.Render(*args).splitlines())
      doc = '\n'.join(line.strip() for line in fn.__doc__.splitlines())
      self.assertIn(drawing, doc, fn.__name__)

  def testTasksOfNoCostLeaveNoDeviceWaitingForever(self):
    # A task of no cost ends when it starts: a device looked at before it
    # in that instant, with nothing ready then, must look again. The last
    # stage's B of no cost (a B too short to time) raised 'the memory limits
    # ... leave no task to run' before: device 0 had looked for its B first.
    for k, m in ((2, 2), (2, 4), (3, 6)):

      def Cost(task, k=k):
        last_b = task.phase == schedules.orders.BACKWARD and task.stage == k - 1
        return 0.0 if last_b else 1.0

      got = schedules.orders.ZeroBubbleH1Orders(k, m, Cost)
      self.assertEqual([3 * m] * k, [len(tasks) for tasks in got])
      done = set()
      for tasks in got:
        self.assertLen(set(tasks), 3 * m)
        done |= set(tasks)
      self.assertLen(done, 3 * m * k)
    got = schedules.orders.ZeroBubbleVOrders(
        2, 4, lambda t: 0.0 if t.phase == schedules.orders.BACKWARD else 1.0)
    self.assertEqual([2 * 3 * 4] * 2, [len(tasks) for tasks in got])

  def testPlacementErrors(self):
    with self.assertRaisesRegex(ValueError, "'zb_v' needs two stages"):
      schedules.Orders('zb_v', 3, 4)
    with self.assertRaisesRegex(ValueError, 'M=3 < K=4'):
      schedules.Orders('1f1b', 4, 3)
    with self.assertRaisesRegex(ValueError, 'multiple of the 2 devices'):
      schedules.Orders('interleaved_1f1b', ['a', 'b', 'a', 'b'], 5)


if __name__ == '__main__':
  tf.test.main()
