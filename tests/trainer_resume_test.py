"""Resuming after SIGKILL gives the losses of an uninterrupted run."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os

from lingvo import compat as tf
from lingvo.core import test_utils
from params import toy
from tests import trainer_testlib
from tools.trainer import checkpoints
from tools.trainer import train_loop

EVERY = 20
FLAGS = trainer_testlib.ResumableFlags(EVERY)


class TrainerResumeTest(test_utils.TestCase):

  def testARunThatCanRestartReadsItsOwnSkipAndKeepsNoGraph(self):
    # A run with --max_worker_restarts feeds its input's skip when the
    # iterator starts (to keep its graph across restarts): a fresh run's
    # input.skip_batches is what it feeds, as a run without restarts
    # builds it in.
    def Losses(skip, **flags):
      logdir = self.create_tempdir().full_path
      settings = trainer_testlib.ResumableSettings(1000)
      code, _, err = trainer_testlib.RunInProcess(
          logdir=logdir, max_steps=3,
          model_params_override=toy.FLOAT64_OVERRIDE +
          '; input.skip_batches=%d' % skip, **dict(settings, **flags))
      self.assertEqual(0, code, err)
      return trainer_testlib.Losses(logdir)

    built_in = Losses(5)
    self.assertNotEqual(Losses(0), built_in)  # The skip shows.
    fed = Losses(5, worker_processes=2, max_worker_restarts=1)
    self.assertEqual([s for s, _ in built_in], [s for s, _ in fed])
    self.assertAllClose([l for _, l in built_in], [l for _, l in fed],
                        rtol=1e-10, atol=0)
    # Its training graph is not kept past the run (another run in this
    # process, of another logdir, would have saved into this one's).
    self.assertEqual([], train_loop._KEPT)  # pylint: disable=protected-access

  def testResumeAfterSigkillMatchesUninterruptedRun(self):
    logdir = self.create_tempdir().full_path
    log_path = os.path.join(self.create_tempdir().full_path, 'killed.log')
    with trainer_testlib.TrainerProcess(
        FLAGS + ['--logdir=' + logdir, '--max_steps=1000000'],
        log_path) as trainer:
      # Kill it mid-run: after a checkpoint, with steps done since, and far
      # enough from the next checkpoint that it cannot be written between
      # this check and the signal (leaving the block kills it).
      trainer.WaitForStepsAfterCheckpoint(logdir, high=EVERY // 2)
    killed = trainer_testlib.Losses(logdir, 'accuracy')
    resume_step = checkpoints.GlobalStepOf(checkpoints.Newest(logdir))
    self.assertEqual(0, resume_step % EVERY)
    self.assertGreater(killed[-1][0], resume_step)  # Steps were lost.
    final_step = killed[-1][0] + 5

    # Restart the binary with the same logdir: it resumes from the newest
    # checkpoint (weights, Adam slots, step, input position).
    result = trainer_testlib.Run(
        FLAGS + ['--logdir=' + logdir, '--max_steps=%d' % final_step])
    self.assertEqual(0, result.returncode, result.stderr)
    self.assertIn('resumed from %s/ckpt-%d at step %d' %
                  (logdir, resume_step, resume_step), result.stdout)
    resumed = trainer_testlib.Losses(logdir, 'accuracy')
    self.assertEqual(list(range(1, final_step + 1)), [s for s, _, _ in resumed])

    # The same steps without interruption (in this process), bit-identical.
    reference = trainer_testlib.UninterruptedLosses(
        self.create_tempdir().full_path, final_step, EVERY)
    self.assertEqual(reference, resumed)
    # Including the steps the killed run had computed past its checkpoint.
    self.assertEqual(reference[:len(killed)], killed)


if __name__ == '__main__':
  tf.test.main()
