"""The schedule registry: its entries hold, the README shows it, it extends."""

import itertools
import os

from absl.testing import absltest
from absl.testing import parameterized
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import orders as orders_lib
from gpipe.schedules import registry
from gpipe.schedules import simulate

_README = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'README.md')


def _Combos():
  for name in registry.Names():
    for d, m in itertools.product([1, 2, 4], [1, 2, 4, 8, 16]):
      for v in (1, 2, 3):
        yield name, d, v, m


class RegistryTest(parameterized.TestCase):

  def testReadmeTableIsTheRegistry(self):
    with open(_README) as f:
      text = f.read()
    begin = text.index('<!-- schedules table')
    begin = text.index('\n', begin) + 1
    end = text.index('<!-- end of schedules table -->')
    self.assertEqual(text[begin:end], registry.MarkdownTable(),
                     'README.md\'s schedule table differs from the registry: '
                     'paste the output of gpipe.schedules.registry.'
                     'MarkdownTable() between its markers')

  def testActivationBoundIsThePeakOfTheOrders(self):
    checked = set()
    for name, d, v, m in _Combos():
      try:
        where = registry.Placement(name, d * v, d)
        _, orders = registry.Orders(name, where, m)
      except ValueError:
        continue
      checked.add(name)
      self.assertEqual(
          simulate.PeakInFlight(orders)[0],
          registry.Get(name).activations(d, v, m),
          '%s D=%d v=%d M=%d' % (name, d, v, m))
    self.assertCountEqual(checked, registry.Names())

  def testPlacementFollowsTheRule(self):
    self.assertEqual(registry.Placement('zb_v', 4, 2), [0, 1, 1, 0])
    self.assertEqual(registry.Placement('interleaved_1f1b', 4, 2),
                     [0, 1, 0, 1])
    self.assertEqual(registry.Placement('1f1b', 3, 3), [0, 1, 2])
    with self.assertRaisesRegex(ValueError, 'one stage per device: K=4 '
                                'stages need 4 devices, not 2'):
      registry.Placement('zb_h1', 4, 2)
    with self.assertRaisesRegex(ValueError, 'K=4 stages need 2 devices'):
      registry.Placement('zb_v', 4, 4)
    with self.assertRaisesRegex(ValueError, 'do not go evenly'):
      registry.Placement('interleaved_1f1b', 5, 2)
    with self.assertRaisesRegex(ValueError, 'K must be even, got K=5'):
      registry.Placement('zb_v', 5, 2)
    # Any placement runs fill-drain: several stages loop breadth-first.
    self.assertEqual(registry.Placement('gpipe', 5, 2), [0, 1, 0, 1, 0])
    registry.Orders('gpipe', [0, 1, 0, 1, 0], 4)

  def testBubbleFormulasAreTheSimulatedIdleTime(self):
    for name in registry.Names():
      schedule = registry.Get(name)
      v = schedule.stages_per_device
      for d, m in itertools.product([2, 4], [4, 8, 16]):
        where = registry.Placement(name, d * v, d)
        try:
          _, orders = registry.Orders(name, where, m)
        except ValueError:
          continue
        self.assertAlmostEqual(
            simulate.SimulatedBubble(orders, d * v, m,
                                     schedule.per_micro_batch_loss,
                                     registry.Costs(name)),
            registry.BubbleFormula(name, d, v, m), places=9,
            msg='%s D=%d M=%d' % (name, d, m))

  def testUnknownAndDuplicateNames(self):
    with self.assertRaisesRegex(ValueError, "unknown schedule 'zb_x'; known "
                                'schedules: gpipe, 1f1b'):
      registry.Get('zb_x')
    with self.assertRaisesRegex(ValueError, 'already registered'):
      registry.Register(registry.Get('gpipe'))

  def testOneEntryAddsASchedule(self):
    # All forwards last stage first would deadlock: a schedule that runs
    # backwards oldest micro-batch last, one stage per device.
    def Orders(k, d, m, where, costs):
      del d, where, costs
      return [[pipeline_tasks.Task(s, i, 'F') for i in range(m)] +
              [pipeline_tasks.Task(s, i, 'B') for i in reversed(range(m))]
              for s in range(k)]
    entry = registry.Schedule(
        name='test_fill_drain_one_per_device', description='a test entry',
        placement=registry.ONE_PER_DEVICE, orders=Orders,
        split_backward=False, per_micro_batch_loss=False,
        bubble=lambda d, v, m: (d - 1.0) / (m + d - 1), bubble_text='x',
        activations=lambda d, v, m: m, activations_text='M', check=None,
        micro_batches_text='any', stages_per_device=1)
    registry.Register(entry)
    try:
      self.assertIn(entry.name, registry.Names())
      self.assertIn(entry.name, registry.ParamDoc())
      self.assertIn('`%s`' % entry.name, registry.MarkdownTable())
      _, orders = registry.Orders(entry.name, 3, 4)
      self.assertAlmostEqual(
          simulate.SimulatedBubble(orders, 3, 4, False,
                                   registry.Costs(entry.name)),
          entry.bubble(3, 1, 4))
      with self.assertRaisesRegex(ValueError, 'one stage per device'):
        registry.Orders(entry.name, [0, 1, 0], 4)
    finally:
      registry._REGISTRY.pop(entry.name)  # pylint: disable=protected-access


class RematCostsTest(absltest.TestCase):

  def testExceptLastRecomputesEveryStageButTheLast(self):
    costs = simulate.RematCosts('except_last', 3)
    for s, want in ((0, 2), (1, 2), (2, 1)):
      self.assertEqual(
          simulate.TaskCost(costs, pipeline_tasks.Task(s, 0, 'B')), want)
      self.assertEqual(
          simulate.TaskCost(costs, pipeline_tasks.Task(s, 0, 'F')), 1)
    _, orders = registry.Orders('gpipe', 3, 4)
    spans = {}
    for remat in ('always', 'except_last', 'never'):
      times = simulate.TaskTimes(orders, 3, 4, False,
                                 simulate.RematCosts(remat, 3))
      spans[remat] = max(end for lane in times for _, _, end in lane)
      last_b = [end - start for task, start, end in times[2]
                if task.phase == 'B']
      self.assertEqual(set(last_b), {1 if remat != 'always' else 2})
    # The last stage's backward starts the drain: every device gains a tick.
    self.assertEqual(spans['always'] - spans['except_last'], 1)
    self.assertLess(spans['never'], spans['except_last'])

  def testZeroBubbleOrdersUseThePerStageCosts(self):
    for k, m in ((2, 4), (3, 6), (4, 8)):
      _, orders = registry.Orders('zb_h1', k, m,
                                  simulate.RematCosts('except_last', k))
      times = simulate.TaskTimes(orders, k, m, True,
                                 simulate.RematCosts('except_last', k))
      self.assertLen(times, k)
      self.assertEqual(sum(len(lane) for lane in times), 3 * k * m)

  def testBatchedRangeCannotBeShiftedByArithmetic(self):
    covered = pipeline_tasks.AllMicroBatches(0, 4)
    self.assertEqual(pipeline_tasks.ShiftMicroBatch(covered, 4),
                     pipeline_tasks.AllMicroBatches(4, 4))
    with self.assertRaises(TypeError):
      _ = covered + 4
    with self.assertRaises(TypeError):
      _ = 4 + covered
    self.assertEqual(orders_lib.VPlacement(4), [0, 1, 1, 0])


if __name__ == '__main__':
  absltest.main()
