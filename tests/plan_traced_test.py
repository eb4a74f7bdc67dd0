"""What a traced step says: per-phase seconds and factors, hand-overs."""

from absl.testing import absltest
from gpipe.measure import timeline
from gpipe.plan import traced


def _Task(stage, micro_batch, phase, device, start, end):
  return timeline.TaskTime(stage, micro_batch, phase, device, start, end,
                           start)


class TracedTest(absltest.TestCase):

  def testPhaseSeconds(self):
    tasks = [_Task(0, 0, 'F', 'a', 0.0, 1.0), _Task(0, 1, 'F', 'a', 1.0, 3.0),
             _Task(0, 0, 'B', 'a', 3.0, 3.5), _Task(0, 0, 'W', 'a', 4, 8)]
    self.assertEqual(traced.PhaseSeconds(tasks),
                     {'F': 3.0, 'B': 0.5, 'W': 4.0})

  def testPhaseFactorsShareTheScaleAsTraced(self):
    # The profile gives B 1 and W 3; the trace splits them 2 to 2.
    got = traced.PhaseFactors(1.5, {'F': 2.0, 'B': 2.0, 'W': 2.0},
                              {'F': 2.0, 'B': 1.0, 'W': 3.0})
    self.assertAlmostEqual(got['F'], 1.5)
    self.assertAlmostEqual(got['B'], 3.0)
    self.assertAlmostEqual(got['W'], 1.0)
    # The total stays the scale's: 1.5 x 6.
    self.assertAlmostEqual(2 * got['F'] + got['B'] + 3 * got['W'], 9.0)
    # A trace without a phase: the scale for all.
    self.assertEqual(traced.PhaseFactors(1.5, {'F': 1.0}, {'F': 1, 'B': 1}),
                     {'F': 1.5, 'B': 1.5})

  def testHandoverDelaysOfTasksThatWaited(self):
    # Two stages on devices a and b, two micro-batches (1F1B-like).
    tasks = [
        _Task(0, 0, 'F', 'a', 0.0, 1.0),
        _Task(0, 1, 'F', 'a', 1.0, 2.0),
        # Waited for F0.0 (ended at 1): started 0.5 later.
        _Task(1, 0, 'F', 'b', 1.5, 2.5),
        _Task(1, 0, 'B', 'b', 2.5, 4.0),
        # F0.1 ended (2) before b's previous task (4): no wait, not counted.
        _Task(1, 1, 'F', 'b', 4.0, 5.0),
        # Waited for B1.0 (ended at 4): 0.25 later.
        _Task(0, 0, 'B', 'a', 4.25, 5.0),
        _Task(1, 1, 'B', 'b', 5.0, 6.0),
        # Its input from b ended at 6, after a's previous task (5): 0.75.
        _Task(0, 1, 'B', 'a', 6.75, 7.0),
    ]
    self.assertEqual(sorted(traced.HandoverDelays(tasks)),
                     [0.25, 0.5, 0.75])
    self.assertEqual(traced.HandoverDelays([]), [])


if __name__ == '__main__':
  absltest.main()
