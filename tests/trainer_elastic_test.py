"""--elastic: lost workers shrink the run, a returning one grows it back.

The toy model in float64 (params/toy.py FLOAT64_OVERRIDE) starts as R=2
replicas x K=2 stages with M=2 micro-batches each on 4 workers; every shape
the run moves to keeps R x M = 4, so its losses are those of one pipeline
of 4 micro-batches trained without interruption, to 1e-10.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import json
import os
import re
import signal
import time

from gpipe.plan import profile as profile_lib
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from params import toy
from tests import cluster_testlib
from tests import plan_testlib
from tests import trainer_testlib
from tools.trainer import checkpoints
from tools.trainer import elastic
from tools.trainer import planned
from tools.trainer import summaries

EVERY = 10
FLAGS = trainer_testlib.ResumableFlags(EVERY) + [
    '--model_params_override=' + toy.FLOAT64_OVERRIDE, '--elastic',
    '--data_parallel=2', '--num_micro_batches=2']
# Exact up to the order of floating-point sums (other R and K).
RTOL = 1e-10


_Losses = trainer_testlib.Losses


def _Steps(logdir):
  return len(trainer_testlib.StepLog(logdir))


# The runs that lose workers: the last loss comes by about step 35 (each 15
# steps into a shape), over 2 s of steps before the end on a fast machine
# (the test polls every 0.05 s); of one length, so that the cases of a
# shard share their uninterrupted reference.
LOSS_RUN_STEPS = 200
# {steps: the reference's losses}, trained once per process.
_REFERENCES = {}


class _Helpers:
  """Shared by the test cases below."""

  def _Reference(self, steps):
    """Losses of one pipeline of 4 micro-batches, uninterrupted, here."""
    if steps not in _REFERENCES:
      _REFERENCES[steps] = trainer_testlib.OnePipelineFloat64Losses(
          self.create_tempdir().full_path, steps)
    return _REFERENCES[steps]

  def _AssertLossesOf(self, reference, got):
    self.assertEqual([s for s, _ in reference[:len(got)]],
                     [s for s, _ in got])
    self.assertAllClose([l for _, l in reference[:len(got)]],
                        [l for _, l in got], rtol=RTOL, atol=0)

  def _Trainer(self, logdir, *flags):
    """The trainer of FLAGS and `flags` on `logdir`, as TrainerProcess."""
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    return trainer_testlib.TrainerProcess(
        FLAGS + ['--logdir=' + logdir] + list(flags), log_path)

  def _LoseAfterMoves(self, trainer, logdir, losses, steps=15):
    """Kills workers one after another, each `steps` steps into a shape.

    Args:
      trainer: the TrainerProcess.
      logdir: its run directory.
      losses: the pids to kill, in order: the first after `steps` steps,
        each next one `steps` steps after the run's next move.
      steps: steps to wait for in each shape.

    Returns:
      The run's losses just before each kill.
    """
    before = []
    for moves, pid in enumerate(losses):
      trainer.WaitFor(
          lambda m=moves: trainer.Log().count('elastic: first step in') >= m,
          'the run to go on after %d move(s)' % moves)
      start = _Steps(logdir)
      trainer.WaitFor(lambda s=start: _Steps(logdir) >= s + steps,
                      '%d steps before killing pid %d' % (steps, pid))
      before.append(_Losses(logdir))
      trainer_testlib.KillProcess(pid)
    return before


class TrainerElasticTest(_Helpers, test_utils.TestCase):

  def testLostWorkersShrinkTheRunToTheSurvivorsWithTheSameLosses(self):
    logdir = self.create_tempdir().full_path
    max_steps = LOSS_RUN_STEPS
    with self._Trainer(logdir, '--worker_processes=4',
                       '--max_steps=%d' % max_steps) as trainer:
      pids = trainer.WorkerPids()
      # Worker 0, the session's master, is lost for good; then worker 2.
      before = self._LoseAfterMoves(trainer, logdir, [pids[0], pids[2]])
      code, log = trainer.Wait()
    self.assertEqual(0, code, log)
    self.assertRegex(
        log, r"worker lost: task 0 at localhost:\d+ \(replica 0 stage 0\), "
        r"the session's master, does not answer")
    self.assertRegex(
        log, r'elastic: shrinking to 2 device\(s\) of task 1, task 2 \(spare: '
        r'task 3\): R=2 K=2 '
        r'M=2 gpipe -> R=1 K=2 M=4 gpipe \(fallback rule: the same pipeline '
        r'\(K=2, v=1\) in 1 replica\(s\) on 2 of 3 device\(s\); keeps R x M '
        r'= 4 micro-batches per step\); from the checkpoint of step \d+, '
        r'redoing \d+ step\(s\)')
    self.assertRegex(log, r'elastic: shrinking to 2 device\(s\) of task 1, '
                     r'task 3: R=1 K=2 M=4 gpipe -> R=1 K=2 M=4 gpipe')
    self.assertRegex(log, r'elastic: first step in R=1 K=2 M=4 gpipe \(step '
                     r'\d+\) [\d.]+ s after the loss')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['shrink', 'shrink'], [e['kind'] for e in events])
    self.assertEqual([['task 1', 'task 2'], ['task 1', 'task 3']],
                     [e['tasks'] for e in events])
    for event, history in zip(events, before):
      self.assertEqual(event['checkpoint_step'] + 1, event['first_step'])
      self.assertGreaterEqual(event['step_before'], len(history))
      self.assertEqual(event['step_before'] - event['checkpoint_step'],
                       event['steps_redone'])
      self.assertGreater(event['secs'], 0)
    # Nothing written is lost: one history of every step, the last
    # checkpoint at the end, TensorBoard's view of the moves.
    recovered = _Losses(logdir)
    self.assertEqual(list(range(1, max_steps + 1)),
                     [s for s, _ in recovered])
    self.assertEqual(max_steps,
                     checkpoints.GlobalStepOf(checkpoints.Newest(logdir)))
    tags = summaries.Read(logdir)
    self.assertEqual([(1, 4.0)] + [(e['first_step'], 2.0) for e in events],
                     tags['trainer/devices'])
    self.assertEqual([(1, 0.0)] + [(e['first_step'], float(i + 1))
                                   for i, e in enumerate(events)],
                     tags['trainer/replans'])
    self.assertLen(tags['trainer/recovery_secs'], 2)
    reference = self._Reference(max_steps)
    for history in before:
      self._AssertLossesOf(reference, history)
    self._AssertLossesOf(reference, recovered)

  def testALossDuringTheMoveIsPartOfIt(self):
    logdir = self.create_tempdir().full_path
    max_steps = LOSS_RUN_STEPS
    with self._Trainer(logdir, '--worker_processes=4',
                       '--max_steps=%d' % max_steps) as trainer:
      pids = trainer.WorkerPids()
      self._LoseAfterMoves(trainer, logdir, [pids[0]])
      # Task 1, a survivor, is lost while the run moves to tasks 1 and 2.
      trainer.WaitFor(lambda: 'elastic: shrinking' in trainer.Log(),
                      'the move', interval_secs=0.005)
      trainer_testlib.KillProcess(pids[1])
      code, log = trainer.Wait()
    self.assertEqual(0, code, log)
    self.assertRegex(log, r'elastic: shrinking to 2 device\(s\) of task 2, '
                     r'task 3: R=2 K=2 M=2 gpipe -> R=1 K=2 M=4 gpipe')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['shrink'], [e['kind'] for e in events])
    self.assertEqual(['task 0', 'task 1'],
                     [l.split(' at ')[0] for l in events[0]['lost']])
    self.assertEqual(events[0]['step_before'] - events[0]['checkpoint_step'],
                     events[0]['steps_redone'])
    self.assertGreater(events[0]['steps_redone'], 0)
    reference = self._Reference(max_steps)
    self._AssertLossesOf(reference, _Losses(logdir))

  def testShapesFromTheRunsProfile(self):
    logdir = self.create_tempdir().full_path
    # The planner's profile of the run (as --plan=auto leaves it): equal
    # layers. On 3 devices it picks 1F1B with 3 stages, on 2 four stages
    # looped over them, R x M = 4 kept both times.
    profile_lib.Save(plan_testlib.UniformProfile(
        4, batch=32, model=trainer_testlib.TOY, param_bytes=33280.0),
                     os.path.join(logdir, planned.PROFILE_FILE))
    max_steps = LOSS_RUN_STEPS
    with self._Trainer(logdir, '--worker_processes=4',
                       '--max_steps=%d' % max_steps) as trainer:
      pids = trainer.WorkerPids()
      self._LoseAfterMoves(trainer, logdir, [pids[3], pids[1]])
      code, log = trainer.Wait()
    self.assertEqual(0, code, log)
    self.assertRegex(
        log, r'elastic: shrinking to 3 device\(s\) of task 0, task 1, task '
        r"2: R=2 K=2 M=2 gpipe -> R=1 K=3 M=4 1f1b \(profile: the planner's "
        r'fastest on 3 of 3 device\(s\) \(1f1b R=1 K=3 M=4 never batched-W, '
        r'cut \[2, 1, 1\]')
    self.assertRegex(
        log, r'elastic: shrinking to 2 device\(s\) of task 0, task 2: R=1 '
        r"K=3 M=4 1f1b -> R=1 K=4 M=4 gpipe v=2 \(profile: ")
    self.assertEqual(['profile', 'profile'],
                     [e['how'] for e in elastic.ReadEvents(logdir)])
    reference = self._Reference(max_steps)
    self._AssertLossesOf(reference, _Losses(logdir))

  def testARestartFirstThenSurvivorsThatCannotHoldTheModelStop(self):
    logdir = self.create_tempdir().full_path
    # 13,130 float64 parameters and Adam's two slots: 315,120 bytes, half on
    # each of two workers; one cannot hold them under 200 KiB.
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    with trainer_testlib.TrainerProcess(
        FLAGS[:-2] + ['--logdir=' + logdir, '--worker_processes=2',
                      '--num_micro_batches=4', '--max_steps=1000000',
                      '--memory_per_device=200KiB',
                      '--max_worker_restarts=1'], log_path) as trainer:
      pids = trainer.WorkerPids()
      trainer.WaitFor(lambda: _Steps(logdir) > EVERY + 2,
                      'a checkpoint and steps after it')
      # Restarted first, while --max_worker_restarts allows.
      trainer_testlib.KillProcess(pids[1])
      fresh = trainer.WorkerPids(
          r'elastic: task 1 restarted at localhost:\d+ \(pid (\d+)\)')
      trainer.WaitFor(lambda: 'elastic: first step in' in trainer.Log(),
                      'the first step after the restart')
      trainer_testlib.KillProcess(fresh[0])
      code, log = trainer.Wait(120)
    self.assertEqual(1, code, log)
    self.assertRegex(
        log, r'trainer: error: elastic: task 1 at localhost:\d+ lost; the 1 '
        r'device\(s\) of R=1 K=1 M=4 gpipe cannot hold the model under '
        r'--memory_per_device=200.0 KiB: its weights and optimizer slots '
        r'alone \(307.\d KiB\) need at least 307.\d KiB on each \(\d+ bytes\), '
        r'before any gradient or activation: training stopped. The last '
        r'checkpoint \(%s/ckpt-\d+\) is intact: bring workers back \(or raise '
        r'--memory_per_device\) and run the same command to resume from it' %
        re.escape(logdir))
    self.assertIn('elastic: restarting task 1 (restart 1 of 1, '
                  '--max_worker_restarts)', log)
    self.assertRegex(log, r'elastic: every task serves: going on in R=1 K=2 '
                     r'M=4 gpipe from the checkpoint of step \d+, redoing '
                     r'\d+ step\(s\)')
    self.assertEqual(['restart'],
                     [e['kind'] for e in elastic.ReadEvents(logdir)])

  def testWithoutWorkersItSaysWhatItNeeds(self):
    code, _, err = trainer_testlib.RunInProcess(
        model=trainer_testlib.TOY, logdir=self.create_tempdir().full_path,
        max_steps=1, elastic=True)
    self.assertEqual(1, code)
    self.assertIn('trainer: error: --elastic needs workers to lose: '
                  '--worker_processes=N, or a running cluster', err)


class TrainerElasticGrowTest(_Helpers, test_utils.TestCase):
  """A lost server of a cluster file comes back at a new address."""

  def testAReplacementGrowsTheRunBackAtACheckpoint(self):
    work = self.create_tempdir().full_path
    logdir = self.create_tempdir().full_path
    spec = os.path.join(work, 'cluster.json')
    addresses = ['localhost:%d' % local_cluster.FreePort() for _ in range(4)]

    def Write():
      with open(spec + '.new', 'w') as f:
        json.dump({'worker': addresses}, f)
      os.replace(spec + '.new', spec)

    def Worker(task):
      return dict(cmd=cluster_testlib.WorkerCommand(
          '--cluster_spec=@' + spec, '--task=%d' % task), env={},
                  address=addresses[task],
                  log=os.path.join(work, 'worker_%d_%s.log' % (
                      task, addresses[task].split(':')[1])))

    Write()
    pids = cluster_testlib.StartForked([Worker(t) for t in range(4)])
    # The grow comes at the first checkpoint after the watch's first round
    # once the trainer runs again (the hold below outlasts the round's
    # period): at the latest POLL_SECS of steps and a checkpoint period
    # later (about 150 steps on a fast machine), as a rule at step 20; a
    # late round of the watch has about 4 s of steps after that.
    max_steps = 450
    try:
      with self._Trainer(logdir, '--cluster_spec=@' + spec,
                         '--worker_wait_secs=1',
                         '--max_steps=%d' % max_steps) as trainer:
        self._LoseAfterMoves(trainer, logdir, [pids[2]])
        trainer.WaitFor(lambda: 'elastic: first step in' in trainer.Log(),
                        'the run to shrink')
        # Its supervisor starts task 2 on another port, and says so in the
        # file; the trainer waits meanwhile, so that it cannot end first,
        # for at least the watch's period: its next round reads the file as
        # soon as it runs again (one period later if a round was under way).
        os.kill(trainer.proc.pid, signal.SIGSTOP)
        held = time.monotonic()
        try:
          addresses[2] = 'localhost:%d' % local_cluster.FreePort()
          Write()
          pids[2:3] = cluster_testlib.StartForked([Worker(2)])
          time.sleep(max(0.0, elastic.POLL_SECS - (time.monotonic() - held)))
        finally:
          os.kill(trainer.proc.pid, signal.SIGCONT)
        code, log = trainer.Wait(240)
    finally:
      trainer_testlib.Kill(pids)
    self.assertEqual(0, code, log)
    self.assertIn('elastic: waiting up to 1 s (--worker_wait_secs) for task '
                  '2 to serve again', log)
    self.assertIn('elastic: task 2 listed at %s now' % addresses[2], log)
    self.assertRegex(
        log, r'elastic: growing to 4 device\(s\) of task 0, task 1, task 2, '
        r'task 3: R=1 K=2 M=4 gpipe -> R=2 K=2 M=2 gpipe \(fallback rule: '
        r'.*\); from the checkpoint of step \d+, no step redone')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['shrink', 'grow'], [e['kind'] for e in events])
    grow = events[1]
    self.assertEqual(0, grow['steps_redone'])
    self.assertEqual(0, grow['checkpoint_step'] % EVERY)
    # Task 2 is back; task 3 waited as a spare since the shrink.
    self.assertEqual(['task 2 at %s' % addresses[2],
                      'task 3 at %s' % addresses[3]], grow['added'])
    self.assertEqual(4, grow['devices'])
    recovered = _Losses(logdir)
    self.assertEqual(list(range(1, max_steps + 1)),
                     [s for s, _ in recovered])
    self.assertEqual(
        [(1, 4.0), (events[0]['first_step'], 2.0), (grow['first_step'], 4.0)],
        summaries.Read(logdir)['trainer/devices'])
    # The last checkpoint goes on in any shape: here one stage in this
    # process, two more steps with the uninterrupted run's losses.
    reference = self._Reference(max_steps + 2)
    self._AssertLossesOf(reference, recovered)
    code, _, err = trainer_testlib.RunInProcess(
        logdir=logdir, max_steps=max_steps + 2, num_stages=1,
        num_micro_batches=4, model_params_override=toy.FLOAT64_OVERRIDE,
        **trainer_testlib.ResumableSettings(100000))
    self.assertEqual(0, code, err)
    self._AssertLossesOf(reference, _Losses(logdir))


if __name__ == '__main__':
  tf.test.main()
