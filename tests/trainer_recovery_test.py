"""--max_worker_restarts: a killed worker is replaced and training goes on."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os

from gpipe.runtime import forked_workers
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import procfs
from tests import trainer_testlib
from tools.trainer import summaries

EVERY = 10
FLAGS = trainer_testlib.ResumableFlags(EVERY) + [
    '--worker_processes=2', '--max_steps=1000000']


def _Steps(logdir):
  return len(trainer_testlib.StepLog(logdir))


class TrainerRecoveryTest(test_utils.TestCase):

  def _Trainer(self, logdir, *flags, module='tools.trainer'):
    log_path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    return trainer_testlib.TrainerProcess(
        FLAGS + ['--logdir=' + logdir] + list(flags), log_path,
        module=module)

  def testKilledWorkerIsReplacedUntilTheRestartsRunOut(self):
    logdir = self.create_tempdir().full_path
    with self._Trainer(logdir, '--max_worker_restarts=1') as trainer:
      first = trainer.WorkerPids()
      if forked_workers.Supported():
        # A forked trainer's workers come from the fork server forked for
        # it (from the one that imported the trainer), not a new one.
        self.assertIn('fork_server ' + ' '.join(trainer_testlib.PRELOAD),
                      procfs.CommandLine(procfs.Parent(first[0])))
      # A few steps after a checkpoint: those steps are lost.
      resume_step = trainer.WaitForStepsAfterCheckpoint(logdir)
      trainer_testlib.KillProcess(first[1])
      # Training goes on with fresh workers from the newest checkpoint.
      second = trainer.WorkerPids(
          r'restarted 2 worker processes \(pids \[([\d, ]+)\]\)')
      trainer.WaitFor(
          lambda: _Steps(logdir) > resume_step + 2 * EVERY,
          'steps after the restart')
      # A second loss exceeds --max_worker_restarts=1: a clear error.
      trainer_testlib.KillProcess(second[0])
      code, log = trainer.Wait(60)
    self.assertEqual(1, code, log)
    self.assertRegex(
        log, r'worker lost: pipeline worker 1 \(pid %d, localhost:\d+\) '
        r'exited with code -9' % first[1])
    self.assertIn('restarting the worker processes (restart 1 of 1), then '
                  'resuming from the newest checkpoint', log)
    self.assertIn('resumed from %s/ckpt-%d at step %d' %
                  (logdir, resume_step, resume_step), log)
    # The same configuration: the restart opened a new session on the
    # graph it had built (its input fed the checkpoint's position, as the
    # losses below show), not a new graph.
    self.assertEqual(1, log.count('built the training graph'), log)
    self.assertIn('kept the training graph of the last run (the same '
                  'configuration): a new session, no rebuild', log)
    self.assertRegex(
        log, r'trainer: error: pipeline worker 0 \(pid %d, localhost:\d+\) '
        r'exited with code -9 .*\(gave up after 1 worker restart\(s\), '
        r'--max_worker_restarts=1\)' % second[0])
    self.assertIn('trainer/worker_restarts', summaries.Read(logdir))
    self.assertEqual([(resume_step, 1.0)],
                     summaries.Read(logdir)['trainer/worker_restarts'])
    # One history, with the redone steps: the losses of an uninterrupted run.
    recovered = trainer_testlib.Losses(logdir, 'accuracy')
    steps = [s for s, _, _ in recovered]
    self.assertEqual(list(range(1, len(steps) + 1)), steps)
    self.assertAllClose(
        trainer_testlib.UninterruptedLosses(
            self.create_tempdir().full_path, len(steps), 1000),
        recovered, rtol=1e-5)

  def testWorkersThatCannotBeRestartedStopTheRun(self):
    logdir = self.create_tempdir().full_path
    with self._Trainer(logdir, '--max_worker_restarts=2',
                       module='tests.restart_failure_probe') as trainer:
      pids = trainer.WorkerPids()
      trainer.WaitForStepsAfterCheckpoint(logdir)
      trainer_testlib.KillProcess(pids[1])
      code, log = trainer.Wait(60)
    self.assertEqual(1, code, log)
    self.assertIn(
        'trainer: error: could not restart the 2 local worker processes '
        '(restart 1): worker 0 exited with code 1 while starting', log)
    self.assertIn('then run the same command again to resume from the '
                  'newest checkpoint', log)


if __name__ == '__main__':
  tf.test.main()
