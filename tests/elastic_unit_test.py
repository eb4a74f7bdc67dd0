"""tools/trainer/elastic.py's moves on fake tasks: no servers, no training.

An Elastic is made without its constructor (which starts sessions and a
watching thread); its members are a members.Members of a running cluster
whose probes and device questions are answered here, and laying a shape
out (_Configure) only counts the devices of the tasks it is given.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import dataclasses
import os
import threading
import time
import types

from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import elastic
from tools.trainer import members as members_lib
from tools.trainer import model_select
from tools.trainer import placement as placement_lib
from tools.trainer import remote_tasks
from tools.trainer import reshape
from tools.trainer import settings
from tools.trainer import train_loop

_ADDRESSES = ['localhost:1', 'localhost:2', 'localhost:3']
_START = reshape.Shape(1, 2, 4, 'gpipe')


def _Devices(task):
  return ['/job:worker/replica:0/task:%d/device:CPU:%d' % (task, d)
          for d in range(1)]


class _Loop:
  step = 7


class _Lost(RuntimeError):
  summary = 'a step failed'


class ElasticAfterLossTest(test_utils.TestCase):

  def _Elastic(self, down=()):
    """An Elastic on 3 one-CPU tasks, 0 and 1 in use; `down` do not serve."""
    self.spec = os.path.join(self.create_tempdir().full_path, 'cluster')
    with open(self.spec, 'w') as f:
      f.write('worker=' + ','.join(_ADDRESSES))
    placement = types.SimpleNamespace(
        cluster=None, remote=types.SimpleNamespace(addresses=_ADDRESSES),
        task_devices=[_Devices(i) for i in range(3)], device_type='CPU')
    self.lines = []
    members = members_lib.Members(placement, echo=self.lines.append,
                                  spec_file=self.spec)
    members.Reason = lambda slot: 'down' if slot.index in down else None
    members._Discover = lambda slot: _Devices(slot.index)
    members.Use(members.slots[:2], members.slots)
    e = object.__new__(elastic.Elastic)
    e.members, e._lock, e._echo = members, members.lock, self.lines.append
    e._start_run = types.SimpleNamespace(
        logdir=self.create_tempdir().full_path)
    e._start = e.shape = _START
    e._choice = reshape.Choice(_START, None, 'start', 'as started')
    e._local, e._wait_secs, e._max_restarts = None, 0.0, 0
    e._fruitless, e._stepped, e._pending, e._last_step = 0, True, None, 0
    e._move = e._rebalance = None
    e.replans = 0
    e._stop = threading.Event()
    self.configured = []

    def Configure(slots, choice):
      # As elastic._Configure counts them: every slot's devices known.
      self.configured.append(sum(len(s.devices) for s in slots))
      members.Use(slots, slots)
      e.shape, e._choice = choice.shape, choice
      return 'run in %s' % choice.shape.label

    e._Configure = Configure
    e._Choose = lambda count, ckpt=None: reshape.Choice(
        reshape.Shape(1, count, 4, 'gpipe'), None, 'fallback', 'test')
    return e

  def testOnlyTheRunAsStartedKeepsItsPlansPrediction(self):
    e = self._Elastic()
    e._start_run = types.SimpleNamespace(planned_examples_per_second=320.0)
    self.assertEqual(e._PlannedRate(e._choice), 320.0)
    other = reshape.Shape(1, 1, 4, 'gpipe')
    for how in (reshape.PROFILE, reshape.FALLBACK, 'rebalance'):
      self.assertIsNone(e._PlannedRate(reshape.Choice(other, None, how)))
    # Back to the starting shape by the fallback rule, laid out as it
    # started: the plan's run again. With a cut of its own (a rebalance) or
    # a profile's plan, not.
    self.assertEqual(e._PlannedRate(reshape.Choice(_START, None,
                                                   reshape.FALLBACK)), 320.0)
    self.assertIsNone(e._PlannedRate(reshape.Choice(_START, None, 'rebalance',
                                                    cut=(1, 3))))
    self.assertIsNone(e._PlannedRate(reshape.Choice(_START, object(),
                                                    reshape.PROFILE)))

  def testATaskInUseMovedInTheClusterFileIsAskedForItsDevices(self):
    e = self._Elastic()
    with open(self.spec, 'w') as f:
      f.write('worker=localhost:1,localhost:9,localhost:3')
    e.members.Reread()
    e.AfterLoss(_Lost(), _Loop())
    # Waited for at its new address, its devices asked: the same shape.
    self.assertEqual([2], self.configured)
    self.assertEqual(_START, e.shape)
    self.assertEqual('localhost:9', e.members.slots[1].address)
    self.assertEqual([0, 1], [s.index for s in e.members.In(members_lib.USED)])

  def testALossDropsAGrowOrRebalanceProposedForTheOldShape(self):
    e = self._Elastic(down=(1, 2))
    e._move = 'rebalancing after step 5: ...'
    e._rebalance = object()
    e.AfterLoss(_Lost(), _Loop())
    self.assertEqual(reshape.Shape(1, 1, 4, 'gpipe'), e.shape)
    self.assertIsNone(e._rebalance)
    self.assertFalse(e.MoveAtCheckpoint(10))

  def testASpareThatStoppedServingIsNotCountedForAGrow(self):
    # Tasks 0 and 1 in use, task 2 a spare: the watch grows the run to it
    # only while it serves.
    e = self._Elastic(down=(2,))
    e._considered = None
    e._WatchOnce()
    self.assertIsNone(e._move)
    e = self._Elastic()
    e._considered = None
    e._WatchOnce()
    self.assertIn('spare tasks serve: R=1 K=2 M=4 gpipe -> R=1 K=3 M=4 gpipe '
                  'on 3 device(s)', e._move)

  def testAMoveNoStepFollowedIsWrittenBySettle(self):
    e = self._Elastic(down=(1,))
    e.AfterLoss(_Lost(), _Loop())
    e.Settle()
    events = elastic.ReadEvents(e._start_run.logdir)
    self.assertEqual([('shrink', None)],
                     [(x['kind'], x['first_step']) for x in events])
    self.assertGreaterEqual(events[0]['secs'], 0.0)
    e.Settle()  # Nothing pending: nothing more written.
    self.assertLen(elastic.ReadEvents(e._start_run.logdir), 1)

  def testTheRecoveryCountsFromWhenTheFailedStepReturned(self):
    # The trainer's checks after a failed step (probing every task, a wait
    # for a local worker's exit) take seconds: they are part of the
    # recovery, whose clock starts when the step failed.
    e = self._Elastic(down=(1,))
    error = _Lost()
    error.noticed = time.time() - 30.0
    e.AfterLoss(error, _Loop())
    self.assertEqual('shrink', e._pending['kind'])
    self.assertEqual(error.noticed, e._pending['since'])
    # An error that does not say (a new session's check): now.
    e = self._Elastic(down=(1,))
    before = time.time()
    e.AfterLoss(RuntimeError('task 1 does not answer'), _Loop())
    self.assertBetween(e._pending['since'], before, time.time())



class ElasticParamsTest(test_utils.TestCase):
  """Elastic._Params: the starting params in a new shape."""

  # Per-stage costs of the toy model's 2 stages (as a plan file has them).
  COSTS = {'F': [1.0, 1.0], 'B': [2.0, 2.0], 'W': [1.0, 1.0]}

  def _Params(self, choice):
    cfg = model_select.ModelParams(trainer_testlib.TOY, 'Train', '')
    (_, pp), = model_select.FindPipelines(cfg)
    pp.task_costs = dict(self.COSTS)
    e = object.__new__(elastic.Elastic)
    e._start = _START
    (_, pp), = model_select.FindPipelines(e._Params(cfg, choice, True))
    return pp

  def testTheSameShapeKeepsTheTaskCosts(self):
    pp = self._Params(reshape.Choice(_START, None, 'start', 'as started'))
    self.assertEqual(self.COSTS, pp.task_costs)

  def testFewerStagesDropTheTaskCosts(self):
    pp = self._Params(reshape.Choice(reshape.Shape(1, 1, 4, 'gpipe'), None,
                                     'fallback', 'one stage'))
    self.assertEqual(1, model_select.NumStages(pp))
    self.assertIsNone(pp.task_costs)

  def testANewCutDropsTheTaskCosts(self):
    pp = self._Params(reshape.Choice(_START, None, 'rebalance', 'slow',
                                     cut=(1, 3)))
    self.assertEqual([1, 3], pp.stage_sizes)
    self.assertIsNone(pp.task_costs)



class ElasticTextsTest(test_utils.TestCase):
  """What the flags' help and docs/ELASTIC.md say of --elastic."""

  def _Help(self, name):
    (field,) = [f for f in dataclasses.fields(settings.Settings)
                if f.name == name]
    return field.metadata['help']

  def testTheWaitAndRestartFlagsSayWhatTheyDoUnderElastic(self):
    self.assertIn('With --elastic', self._Help('max_worker_restarts'))
    self.assertIn('the run shrinks', self._Help('max_worker_restarts'))
    self.assertIn('With --elastic', self._Help('worker_wait_secs'))
    self.assertIn('before the run shrinks', self._Help('worker_wait_secs'))

  def testTheDocSaysTheLogdirIsSharedAndHowToRunUnderSlurm(self):
    with open(os.path.join(os.path.dirname(__file__), '..', 'docs',
                           'ELASTIC.md')) as f:
      text = ' '.join(f.read().split())
    self.assertIn('The logdir must be on a shared filesystem, at the same '
                  'path on every host', text)
    self.assertIn("session's master task", text)
    self.assertIn("delete that option from the script's `srun` line", text)
    self.assertNotIn('drop it (`srun --kill-on-bad-exit`;', text)


class EvaluationTest(test_utils.TestCase):
  """elastic.Evaluation: a task lost while evaluating is a loss."""

  def _Driver(self, lost):
    driver = types.SimpleNamespace(run='run in R=2', moves=[], settled=0)
    driver.LostTasks = lambda: lost

    def Settle():
      driver.settled += 1

    driver.Settle = Settle

    def AfterLoss(error, loop):
      driver.moves.append((error.summary, loop))
      driver.run = 'run in R=1'

    driver.AfterLoss = AfterLoss
    return driver

  def _Evaluate(self, failures, error=None):
    """evaler.Evaluate that fails `failures` times, then gives its run."""
    calls = []

    def Evaluate(run, path, echo):
      calls.append(run)
      if len(calls) <= failures:
        raise error or tf.errors.UnavailableError(None, None, 'Socket closed')
      return path, {'accuracy': 0.5, 'run': run}
    return Evaluate, calls

  def testTheFinalEvaluationMovesTheRunAndEvaluatesAgain(self):
    driver = self._Driver('task 1 at localhost:2 does not answer (down)')
    evaluate, calls = self._Evaluate(1)
    evaluation = elastic.Evaluation(driver, evaluate=evaluate)
    evaluation.loop = 'the last loop'
    _, metrics = evaluation.Final('/logs/ckpt-20')
    self.assertEqual('run in R=1', metrics['run'])
    self.assertEqual(['run in R=2', 'run in R=1'], calls)
    self.assertEqual(
        [('a task was lost while evaluating /logs/ckpt-20 (UnavailableError): '
          'task 1 at localhost:2 does not answer (down)', 'the last loop')],
        driver.moves)
    # The move no step followed is written once the evaluation is done.
    self.assertEqual(1, driver.settled)

  def testADeadLocalWorkerOrAnUnreachableTaskIsALossToo(self):
    for error in (local_cluster.WorkerDiedError('worker 1 exited'),
                  remote_tasks.TaskUnreachableError('task 1 does not answer')):
      driver = self._Driver('task 1 at localhost:2 does not answer (down)')
      evaluate, calls = self._Evaluate(1, error)
      elastic.Evaluation(driver, evaluate=evaluate).Final('/logs/ckpt-20')
      self.assertLen(driver.moves, 1, error)
      self.assertLen(calls, 2)

  def testInTheLoopALossEndsTheLoop(self):
    driver = self._Driver('task 1 at localhost:2 does not answer (down)')
    evaluate, _ = self._Evaluate(1)
    evaluation = elastic.Evaluation(driver, evaluate=evaluate)
    with self.assertRaisesRegex(train_loop.WorkerLostError,
                                'lost while evaluating /logs/ckpt-10'):
      evaluation.InLoop('/logs/ckpt-10')
    self.assertEqual([], driver.moves)

  def testAnErrorWhileEveryTaskServesIsTheEvaluationsOwn(self):
    driver = self._Driver('')
    evaluate, _ = self._Evaluate(1)
    evaluation = elastic.Evaluation(driver, evaluate=evaluate)
    with self.assertRaises(tf.errors.UnavailableError):
      evaluation.Final('/logs/ckpt-10')
    self.assertEqual([], driver.moves)


class NewSessionWaitTest(test_utils.TestCase):
  """How long a new session's check waits for a task that does not answer."""

  def testOnARunningClusterTheCheckWaitsNoLongerThanTheLossWaits(self):
    # Under --elastic on a running cluster the check's TaskUnreachableError
    # is a loss, and the loss waits --worker_wait_secs for the task
    # (Elastic.AfterLoss): the check waited its own 10 s first, so a lost
    # host was waited for twice.
    asked = []

    class Remote:

      def Connect(self, target, wait_secs=None, step_timeout_secs=None,
                  gone=None, lost_wait_secs=None):
        del target, step_timeout_secs, gone
        asked.append((wait_secs, lost_wait_secs))
        raise remote_tasks.TaskUnreachableError('task 1 does not answer')

    default = remote_tasks.CONNECT_WAIT_SECS
    # (--elastic, local workers, --worker_wait_secs, the check's wait for a
    # task that does not answer: None for its own, CONNECT_WAIT_SECS).
    for elastic_run, local, worker_wait, want in (
        (True, False, 1, 1), (True, False, 300, default),
        (False, False, 1, None), (True, True, 1, None)):
      # Without its constructor (which starts or asks workers).
      placement = placement_lib.Placement.__new__(placement_lib.Placement)
      placement.remote = Remote()
      placement.target = 'grpc://localhost:1'
      placement.worker_wait_secs = worker_wait
      placement.session_cluster = object() if elastic_run else None
      placement.cluster = object() if local else None
      with self.assertRaisesRegex(remote_tasks.TaskUnreachableError,
                                  'task 1 does not answer'):
        placement.NewSession(tf.Graph())
      case = (elastic_run, local, worker_wait)
      # A failing step across tasks that all answer: retried as long as ever.
      self.assertIsNone(asked[-1][0], case)
      self.assertEqual(want, asked[-1][1], case)

  def testALostTaskIsWaitedForItsOwnTimeAFailingStepForTheWholeWait(self):
    tasks = remote_tasks.RemoteTasks.__new__(remote_tasks.RemoteTasks)
    tasks.addresses = ['localhost:1', 'localhost:2']
    steps = []

    def FailingStep(target, timeout):
      del target, timeout
      steps.append(time.time())
      raise tf.errors.InvalidArgumentError(None, None, 'no route')

    tasks.Explain = lambda lost: 'task 1 does not answer'
    tasks.Unreachable = lambda: [1]
    start = time.time()
    with self.assertRaisesRegex(remote_tasks.TaskUnreachableError,
                                'task 1 does not answer'):
      tasks.Connect('grpc://localhost:1', wait_secs=30, lost_wait_secs=0.1)
    self.assertLess(time.time() - start, 5)
    # Every task answers but a step across them fails: wait_secs, not
    # lost_wait_secs, bounds its retries.
    tasks.Unreachable = lambda: []
    tasks._MeshStep = FailingStep
    with self.assertRaisesRegex(remote_tasks.TaskUnreachableError,
                                'a step across them fails'):
      tasks.Connect('grpc://localhost:1', wait_secs=1.2, lost_wait_secs=0)
    self.assertGreaterEqual(len(steps), 2)
    self.assertGreaterEqual(steps[-1] - steps[0], 0.9)


if __name__ == '__main__':
  test_utils.main()
