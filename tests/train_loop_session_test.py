"""train_loop: what becomes of a session that a run ended in, without one."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import threading
import time
import types

from gpipe.runtime import local_cluster
from lingvo.core import test_utils
from tools.trainer import sessions
from tools.trainer import train_loop


class _Session:
  """A session whose close() returns at once, or waits for `release`."""

  def __init__(self, hangs=False):
    self.closed = threading.Event()
    self.release = threading.Event()
    self._hangs = hangs

  def close(self):
    if self._hangs:
      self.release.wait()
    self.closed.set()


class _Lost(RuntimeError):
  pass


def _Loop(elastic):
  """A TrainLoop whose session run ends at once with _Lost."""

  def RunOptions():
    raise _Lost('a worker is lost')

  loop = object.__new__(train_loop.TrainLoop)
  loop._placement = types.SimpleNamespace(
      elastic=elastic, distributed=True, RunOptions=RunOptions)
  return loop


class RunSessionEndTest(test_utils.TestCase):

  def setUp(self):
    super().setUp()
    self._abandoned = list(sessions.ABANDONED)
    self._closing = list(sessions.CLOSING)
    del sessions.ABANDONED[:]
    del sessions.CLOSING[:]

  def tearDown(self):
    sessions.ABANDONED[:] = self._abandoned
    sessions.CLOSING[:] = self._closing
    super().tearDown()

  def _Run(self, loop, sess):
    with self.assertRaises(_Lost):
      loop._RunSession(sess, types.SimpleNamespace(
          built=None, saver=None, fetches=None), None, None, None)

  def testAnElasticRunClosesTheSessionItEndedIn(self):
    sess = _Session()
    self._Run(_Loop(elastic=True), sess)
    self.assertTrue(sess.closed.is_set())
    self.assertEqual(0, sessions.AbandonedSessions())

  def testAnElasticRunGoesOnWhileASessionsCloseHangs(self):
    # Closing waits for the lost task: the recovery does not (it waited
    # the whole 10 s it allowed before), and the process knows a close is
    # still running (it then exits without the interpreter's cleanup).
    sess = _Session(hangs=True)
    try:
      began = time.time()
      self._Run(_Loop(elastic=True), sess)
      self.assertLess(time.time() - began, sessions.CLOSE_SECS + 1.0)
      self.assertFalse(sess.closed.is_set())
      self.assertEqual(1, sessions.AbandonedSessions())
    finally:
      sess.release.set()
    # The close returns later, in its thread: nothing is left open.
    self.assertTrue(sess.closed.wait(5))
    for call in sessions.CLOSING:
      call.Wait(5)
    self.assertEqual(0, sessions.AbandonedSessions())

  def testADistributedRunLeavesItOpen(self):
    sess = _Session()
    self._Run(_Loop(elastic=False), sess)
    self.assertFalse(sess.closed.is_set())
    self.assertEqual(1, sessions.AbandonedSessions())


class PlanLineTest(test_utils.TestCase):

  def testThePlansPredictionBesideTheMedianInterval(self):
    line = train_loop.PlanLine(
        100.0, [(10, 80.0, True), (10, 95.0, True), (10, 20.0, True)], 0,
        'toy.M')
    # The median (80), not the mean: one slow interval does not move it.
    self.assertEqual(line, 'the plan predicted 100.0 examples/s; this run '
                     'from step 0: 80.0 (the median of 3 logged intervals '
                     'after the first), 20% slower than planned')
    line = train_loop.PlanLine(90.0, [(5, 100.0, True)], 40, 'toy.M')
    self.assertIn('this run from step 40: 100.0 (the median of 1 logged '
                  'interval after the first), 11% faster than planned', line)
    self.assertIn('), as fast as planned', train_loop.PlanLine(
        100.0, [(5, 100.2, True)], 0, 'toy.M'))
    # A last interval shorter than the others (max_steps not a multiple of
    # the period) counts only when nothing else does.
    self.assertIn(': 100.0 (the median of 2', train_loop.PlanLine(
        100.0, [(10, 100.0, True), (10, 100.0, True), (3, 10.0, True)], 0,
        'toy.M'))
    self.assertIn(': 10.0 (the median of 1', train_loop.PlanLine(
        100.0, [(3, 10.0, True)], 0, 'toy.M'))

  def testIntervalsWithACheckpointOrTraceCountOnlyWhenNothingElseDoes(self):
    # The plan predicts steps, not saving, evaluating or tracing them.
    line = train_loop.PlanLine(
        100.0, [(10, 50.0, False), (10, 98.0, True), (10, 40.0, False),
                (10, 96.0, True)], 0, 'toy.M')
    self.assertIn(': 97.0 (the median of 2 logged intervals after the '
                  'first), 3% slower', line)
    line = train_loop.PlanLine(100.0, [(10, 50.0, False), (10, 40.0, False)],
                               0, 'toy.M')
    self.assertIn(': 45.0 (the median of 2 logged intervals after the first, '
                  'each with a checkpoint, evaluation or traced step), 55% '
                  'slower than planned. The plan predicts steps alone: log '
                  'more often than the checkpoints and traces come', line)
    # Not told to plan again for what the plan does not predict.
    self.assertNotIn('Plan again', line)

  def testARunFarFromItsPlanIsToldToPlanAgain(self):
    slower = train_loop.PlanLine(200.0, [(4, 100.0, True), (4, 120.0, True)],
                                 0, 'mt.NumbersSmall')
    self.assertIn('45% slower than planned: the machine is slower or busier '
                  'than when the plan was made', slower)
    self.assertIn('Plan again here (python -m tools.plan '
                  '--model=mt.NumbersSmall --devices=N --plan_out=FILE, then '
                  '--plan=FILE: the checkpoints resume)', slower)
    faster = train_loop.PlanLine(50.0, [(4, 100.0, True)], 0, 'toy.M')
    self.assertIn('100% faster than planned: the machine is faster or '
                  'quieter', faster)
    self.assertNotIn('Plan again', train_loop.PlanLine(
        100.0, [(4, 90.0, True)], 0, 'toy.M'))

  def testTooFewIntervalsAreSaid(self):
    self.assertEqual(
        train_loop.PlanLine(100.0, [], 12, 'toy.M'),
        'the plan predicted 100.0 examples/s; this run from step 12 logged '
        'too few intervals after its first to compare (log more often: '
        '--log_every_n_steps)')


class _DeadWorkerPlacement:
  """A placement whose worker `task` has exited; records Stop()."""

  def __init__(self, task):
    self.cluster = object()
    self.elastic = False
    self.stopped = threading.Event()
    self._task = task

  def CheckAlive(self):
    raise local_cluster.WorkerDiedError(
        'pipeline worker %d exited with code -9' % self._task, task=self._task)

  def Stop(self):
    self.stopped.set()


class DeathWatchTest(test_utils.TestCase):

  def _StoppedWithin(self, task, secs):
    """Whether a watch on dead worker `task` stops the workers in `secs`."""
    placement = _DeadWorkerPlacement(task)
    with train_loop._DeathWatch(placement, 'during step 3', None,
                                poll_secs=0.01, grace_secs=1e6,
                                recoverable=True):
      return placement.stopped.wait(secs)

  def testALostMasterStopsTheWorkersWithoutTheGrace(self):
    # Nothing ends a step without its master: the grace is not waited for.
    self.assertTrue(self._StoppedWithin(0, 30))

  def testAnotherLostWorkerLetsTheStepFailByItselfFirst(self):
    self.assertFalse(self._StoppedWithin(1, 0.5))

if __name__ == '__main__':
  test_utils.main()
