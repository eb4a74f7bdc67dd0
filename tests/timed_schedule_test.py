"""The timing-aware zero-bubble schedule 'zb_auto' and measured task costs."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import random

from absl.testing import parameterized
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import orders as orders_lib
from gpipe.schedules import registry
from gpipe.schedules import render
from gpipe.schedules import simulate
from gpipe.schedules import timed
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import schedule_testlib


def _Span(orders, k, m, costs):
  times = simulate.TaskTimes(orders, k, m, True, costs, costs.Delay)
  return max(end for lane in times for _, _, end in lane)


def _RandomCosts(rng, k, handover=True):
  forward = [rng.uniform(0.5, 1.5) for _ in range(k)]
  return timed.StageCosts(
      forward, [f * rng.uniform(1.5, 2.5) for f in forward],
      [f * rng.uniform(0.5, 1.2) for f in forward],
      [rng.choice([0.0, 0.1, 0.3]) if handover else 0.0
       for _ in range(k - 1)])


def _IdleWhileReady(orders, k, m, costs):
  """(stage, gap start, task) of the first idle gap with a task ready, or None.

  Walks each stage's simulated timeline: at every gap, the stage's next B (B
  and F go in micro-batch order) and its next F, if the memory limits allow
  another micro-batch in flight, must not have had their inputs before the
  gap ends. (A pending W may wait: the gap-aware candidates keep a long W
  from delaying a B.)
  """
  times = simulate.TaskTimes(orders, k, m, True, costs, costs.Delay)
  end = {t: e for lane in times for t, _, e in lane}

  def Arrival(task):
    deps = pipeline_tasks.Dependencies(task, k, m, True)
    return max([0.0] + [end[d] + costs.Delay(d, task) for d in deps])

  for s, lane in enumerate(times):
    next_f = next_b = awaiting_w = 0
    free = 0.0
    for task, start, stop in lane:
      if start > free + 1e-9:
        ready = []
        if next_b < next_f:
          ready.append(simulate.Task(s, next_b, 'B'))
        if (next_f < m and next_f - next_b < costs.max_in_flight[s] and
            next_f - next_b + awaiting_w < costs.max_awaiting_weight[s]):
          ready.append(simulate.Task(s, next_f, 'F'))
        for r in ready:
          if Arrival(r) < start - 1e-9:
            return s, free, pipeline_tasks.Label(r)
      free = stop
      if task.phase == 'F':
        next_f += 1
      elif task.phase == 'B':
        next_b += 1
        awaiting_w += 1
      else:
        awaiting_w -= 1
  return None


class TimedOrdersTest(test_utils.TestCase, parameterized.TestCase):

  def testDocstringDrawingIsTheRenderedSchedule(self):
    costs = timed.StageCosts([1, 1, 2], [3, 1, 1], [1, 2, 2])
    drawing = '\n'.join(line.strip() for line in render.RenderSchedule(
        'zb_auto', 3, 6, costs).splitlines())
    doc = '\n'.join(line.strip() for line in
                    timed.TimedZeroBubbleOrders.__doc__.splitlines())
    self.assertIn(drawing, doc)
    _, h1 = registry.Orders('zb_h1', 3, 6, costs)
    _, auto = registry.Orders('zb_auto', 3, 6, costs)
    self.assertEqual((_Span(h1, 3, 6, costs), _Span(auto, 3, 6, costs)),
                     (34, 33))

  def testNeverSlowerThanZeroBubbleH1AndOftenFaster(self):
    rng = random.Random(0)
    faster = 0
    for _ in range(60):
      k = rng.choice([2, 3, 4])
      m = rng.choice([4, 8])
      costs = _RandomCosts(rng, k)
      _, h1 = registry.Orders('zb_h1', k, m, costs)
      _, auto = registry.Orders('zb_auto', k, m, costs)
      h1_span, auto_span = _Span(h1, k, m, costs), _Span(auto, k, m, costs)
      self.assertLessEqual(auto_span, h1_span + 1e-9)
      faster += auto_span < h1_span - 1e-9
    self.assertGreater(faster, 10)

  @parameterized.parameters((2, 8), (3, 6), (4, 8))
  def testMemoryLimitsHold(self, k, m):
    rng = random.Random(k)
    for limit in (1, 2, k, 2 * k):
      costs = _RandomCosts(rng, k)
      costs.max_in_flight = [limit] * k
      costs.max_awaiting_weight = [limit + 1] * k
      _, orders = registry.Orders('zb_auto', k, m, costs)
      self.assertCountEqual(
          [t for o in orders for t in o],
          [simulate.Task(s, i, p) for s in range(k) for i in range(m)
           for p in 'FBW'])
      for order in orders:
        held = held_w = peak = peak_w = 0
        for t in order:
          held += {'F': 1, 'B': -1, 'W': 0}[t.phase]
          held_w += {'F': 1, 'B': 0, 'W': -1}[t.phase]
          peak, peak_w = max(peak, held), max(peak_w, held_w)
        self.assertLessEqual(peak, limit)
        self.assertLessEqual(peak_w, limit + 1)

  def testNoStageIdlesWhileATaskIsReadyUnderPlannerLimits(self):
    # The planner's limits (max_in_flight == max_awaiting_weight <= K) rule
    # ZB-H1 out, so the list scheduler's orders are the only candidates.
    # Its waiting stages must wake when a neighbour's task brings an input
    # earlier than the one they wait for.
    c = timed.StageCosts([.54, .56, 1.67, 2.79], [.62, .71, 3.0, 1.28],
                         [.68, .66, .7, 1.06], [.29, .02, .42],
                         max_in_flight=[3, 3, 4, 1],
                         max_awaiting_weight=[3, 3, 4, 1])
    _, orders = registry.Orders('zb_auto', 4, 4, c)
    self.assertIsNone(_IdleWhileReady(orders, 4, 4, c))
    self.assertAlmostEqual(_Span(orders, 4, 4, c), 28.7)
    rng = random.Random(1)
    for _ in range(150):
      k = rng.randint(2, 6)
      m = rng.randint(k, 4 * k)
      costs = _RandomCosts(rng, k)
      limits = [rng.randint(1, k) for _ in range(k)]
      costs.max_in_flight = costs.max_awaiting_weight = limits
      _, orders = registry.Orders('zb_auto', k, m, costs)
      self.assertIsNone(_IdleWhileReady(orders, k, m, costs),
                        (k, m, costs.ToDict()))

  def testMoreMemoryBuysAShorterStep(self):
    # B recomputes the forward (remat): with 1F1B's memory the first device
    # waits 6 ticks for its first B; ZB-H2's warm-up (2(K-s)-1 forwards)
    # fills the wait, down to the least step: the last device starts after
    # K-1 forwards and then works 4M ticks.
    costs = timed.StageCosts([1] * 4, [2] * 4, [1] * 4)
    _, h1 = registry.Orders('zb_auto', 4, 8, costs)
    costs.max_in_flight = [2 * (4 - s) - 1 for s in range(4)]
    costs.max_awaiting_weight = [2 * 4] * 4
    _, h2 = registry.Orders('zb_auto', 4, 8, costs)
    self.assertEqual(_Span(h1, 4, 8, costs), 38)
    self.assertEqual(_Span(h2, 4, 8, costs), 4 * 8 + 3)
    self.assertEqual(simulate.PeakInFlight(h2), [7, 5, 3, 1])

  def testHandoversDelayInputs(self):
    costs = timed.StageCosts([1, 1], [1, 1], [1, 1], [0.5])
    _, orders = registry.Orders('zb_auto', 2, 2, costs)
    times = simulate.TaskTimes(orders, 2, 2, True, costs, costs.Delay)
    start = {t: s for lane in times for t, s, _ in lane}
    end = {t: e for lane in times for t, _, e in lane}
    self.assertEqual(start[simulate.Task(1, 0, 'F')],
                     end[simulate.Task(0, 0, 'F')] + 0.5)
    self.assertEqual(start[simulate.Task(0, 0, 'B')],
                     end[simulate.Task(1, 0, 'B')] + 0.5)

  def testCostsCheckTheirShapeAndRoundTrip(self):
    costs = timed.StageCosts([1, 2], [2, 3], [1, 1], [0.5],
                             max_in_flight=[2, 1])
    self.assertEqual(timed.StageCosts.FromDict(costs.ToDict()).ToDict(),
                     costs.ToDict())
    self.assertEqual(costs(simulate.Task(1, 0, 'B')), 3.0)
    with self.assertRaisesRegex(ValueError, 'task costs for 2 stages'):
      timed.StageCosts([1, 2], [2])
    with self.assertRaisesRegex(ValueError, 'must be >= 0'):
      timed.StageCosts([1, -2], [2, 2])
    with self.assertRaisesRegex(ValueError, 'allow >= 1 micro-batch'):
      timed.StageCosts([1, 2], [2, 2], max_in_flight=[1, 0])
    with self.assertRaisesRegex(ValueError, 'take the keys'):
      timed.StageCosts.FromDict({'F': [1], 'B': [1], 'X': [1]})
    with self.assertRaisesRegex(ValueError, 'task_costs are for 2 stages but '
                                'the pipeline has 3'):
      timed.PipelineCosts('always', 3, costs.ToDict())
    self.assertEqual(timed.PipelineCosts('never', 2), {'F': 1, 'B': 1,
                                                       'W': 1})

  def testOtherZeroBubbleSchedulesTakeTheCostsToo(self):
    costs = timed.StageCosts([1, 1, 1], [2, 2, 2], [1, 1, 1])
    _, with_costs = registry.Orders('zb_h1', 3, 6, costs)
    self.assertEqual(with_costs, orders_lib.ZeroBubbleH1Orders(3, 6, costs))


class TimedScheduleGradientTest(test_utils.TestCase, parameterized.TestCase):
  """Measured costs change the order, never the gradients (float64)."""

  @parameterized.parameters(('always', 4, 4), ('never', 2, 6),
                            ('except_last', 4, 5))
  def testMeasuredCostsGiveExactGradients(self, remat, k, m):
    rng = random.Random(k * m)
    costs = _RandomCosts(rng, k)
    costs.max_in_flight = [k + 1] * k
    with self.session(graph=tf.Graph(),
                      config=schedule_testlib.CONFIG) as sess:
      net = schedule_testlib.Net('zb_auto', k, m, remat,
                                 task_costs=costs.ToDict())
      x = tf.constant(np.random.RandomState(m).randn(2 * m, 8))
      targets = tf.constant(np.random.RandomState(k).randn(2 * m, 8))
      schedule_testlib.AssertMatches(self, net, (x,), targets, sess)
    with tf.Graph().as_default() as graph:
      net = schedule_testlib.Net('zb_auto', k, m, remat,
                                 task_costs=costs.ToDict())
      schedule_testlib.LossAndGrads(
          net, (tf.zeros([2 * m, 8], tf.float64),),
          tf.zeros([2 * m, 8], tf.float64), True)
      calls = schedule_testlib.CallOps(graph)
    _, orders = registry.Orders('zb_auto', k, m, costs)
    schedule_testlib.AssertCallsFollowOrders(self, calls, orders)

  def testCostsForAnotherCutAreRefused(self):
    costs = timed.StageCosts([1, 1], [2, 2], [1, 1])
    with tf.Graph().as_default():
      net = schedule_testlib.Net('zb_auto', 4, 4, 'always',
                                 task_costs=costs.ToDict())
      with self.assertRaisesRegex(ValueError, 'pipe: task_costs are for 2 '
                                  'stages but the pipeline has 4'):
        schedule_testlib.LossAndGrads(
            net, (tf.zeros([8, 8], tf.float64),), tf.zeros([8, 8],
                                                           tf.float64), True)


if __name__ == '__main__':
  tf.test.main()
