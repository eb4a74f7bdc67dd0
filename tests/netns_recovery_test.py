"""Lost workers of --cluster_spec: killed and restarted, timed out, cut off.

Two hosts (network namespaces of a tools.netlab.netns.Lab), one
``python -m gpipe.worker`` in each, the trainer in the lab's client with
``--cluster_spec``. The test plays the supervisor (Slurm, Kubernetes or
systemd) that starts a lost worker again at the same address. The same
workers serve every trainer session of the test, as long-lived servers do.
The losses are compared with an uninterrupted run on the same workers.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import netns_testlib
from tests import trainer_testlib
from tools.netlab import netns
from tools.trainer import checkpoints
from tools.trainer import summaries

TOY = netns_testlib.TOY
EVERY = 10
# Longer than any run of the tests: compared as a prefix.
REFERENCE_STEPS = 200
STEP_TIMEOUT_SECS = 15
# The partition test's run waits its step timeout out: shorter, yet many
# times the toy model's start-up and first two steps (1.5 s here).
PARTITION_STEP_TIMEOUT_SECS = 10
# What the trainer was doing when a worker was lost.
DOING = r'(during step \d+|while saving the checkpoint of step \d+)'


class NetnsRecoveryTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.lab = None
    if netns.Unavailable():
      return  # setUp skips each test, saying why.
    cls.lab = netns.Lab(2)
    cls.workers = netns.Workers(cls.lab)
    logdir = tempfile.mkdtemp()
    result = netns_testlib.RunTrainer(
        cls.lab, cls._Flags(logdir) + ['--max_steps=%d' % REFERENCE_STEPS])
    assert result.returncode == 0, result.stderr
    cls.reference = trainer_testlib.Losses(logdir)

  @classmethod
  def tearDownClass(cls):
    if cls.lab is not None:
      cls.lab.Close()
    super().tearDownClass()

  @classmethod
  def _Flags(cls, logdir):
    return ['--model=' + TOY, '--logdir=' + logdir,
            '--checkpoint_every_n_steps=%d' % EVERY,
            '--step_timeout_secs=%d' % STEP_TIMEOUT_SECS,
            '--cluster_spec=' + cls.workers.cluster_spec] + netns_testlib.QUIET

  def setUp(self):
    super().setUp()
    netns_testlib.SkipUnlessNamespaces(self)
    # Every test starts with both workers serving and both links up.
    for i in range(2):
      self.lab.SetLink(i, True)
      if self.workers.procs[i].poll() is not None:
        self.workers.Start(i)
      self.workers.WaitServing(i)
    self.logdir = self.create_tempdir().full_path
    self.log_path = os.path.join(self.create_tempdir().full_path, 'log')

  def _Start(self, *flags):
    return netns_testlib.PopenTrainer(
        self.lab, self._Flags(self.logdir) + list(flags), self.log_path)

  def _Log(self):
    return netns_testlib.ReadFile(self.log_path)

  def _AfterCheckpoint(self, proc):
    """Waits until a few steps follow a checkpoint; returns its step."""
    netns_testlib.WaitFor(
        proc, self.log_path,
        lambda: trainer_testlib.StepsAfterCheckpoint(self.logdir),
        'steps after a checkpoint')
    return checkpoints.GlobalStepOf(checkpoints.Newest(self.logdir))

  def _StoppedLog(self, proc, timeout=120):
    """Waits for the trainer to stop with an error; returns its output."""
    proc.wait(timeout=timeout)
    log = self._Log()
    self.assertEqual(1, proc.returncode, log)
    return log

  def _Task(self, i, stage):
    return r'task %d at %s:%d \(stage %d\)' % (
        i, re.escape(self.lab.host_addresses[i]), self.workers.port, stage)

  def _AssertLossesOfAnUninterruptedRun(self):
    losses = trainer_testlib.Losses(self.logdir)
    steps = [s for s, _ in losses]
    self.assertEqual(list(range(1, len(steps) + 1)), steps)
    self.assertLess(len(steps), REFERENCE_STEPS)
    self.assertEqual(self.reference[:len(losses)], losses)

  def testKilledWorkerIsWaitedForUntilTheRestartsRunOut(self):
    proc = self._Start('--max_steps=1000000', '--max_worker_restarts=1',
                       '--worker_wait_secs=120')
    resume_step = self._AfterCheckpoint(proc)
    self.workers.Kill(1)
    netns_testlib.WaitFor(proc, self.log_path,
                          lambda: 'waiting up to' in self._Log(),
                          'the wait for the lost worker')
    self.workers.Start(1)  # The supervisor's part.
    netns_testlib.WaitFor(
        proc, self.log_path,
        lambda: ('every task serves again' in self._Log() and len(
            trainer_testlib.Losses(self.logdir)) > resume_step + 2 * EVERY),
        'steps after the restart')
    # Losing the master task too exceeds --max_worker_restarts=1.
    self.workers.Kill(0)
    log = self._StoppedLog(proc)
    self.assertRegex(
        log, r'worker lost: a pipeline worker became unreachable %s \(.*\): '
        r'%s does not answer \(cannot connect: Connection refused\)' %
        (DOING, self._Task(1, 1)))
    self.assertIn(
        'waiting up to 120 s (--worker_wait_secs) for every task to serve '
        'again (restart 1 of 1), then resuming from the newest checkpoint',
        log)
    self.assertRegex(log, r'every task serves again after [\d.]+ s: %s' %
                     re.escape(', '.join(self.workers.addresses)))
    self.assertIn('resumed from %s/ckpt-%d at step %d' %
                  (self.logdir, resume_step, resume_step), log)
    self.assertRegex(
        log, r"trainer: error: %s, the session's master, does not answer "
        r'\(cannot connect: Connection refused\) %s: training stopped.*'
        r'\(gave up after 1 worker restart\(s\), --max_worker_restarts=1\)'
        % (self._Task(0, 0), DOING))
    self.assertEqual([(resume_step, 1.0)],
                     summaries.Read(self.logdir)['trainer/worker_restarts'])
    self._AssertLossesOfAnUninterruptedRun()

  def testAWorkerNotBackInTimeStopsTheRunAndARerunResumes(self):
    proc = self._Start('--max_steps=1000000', '--max_worker_restarts=2',
                       '--worker_wait_secs=3')
    resume_step = self._AfterCheckpoint(proc)
    self.workers.Kill(1)
    log = self._StoppedLog(proc)
    self.assertRegex(
        log, r'trainer: error: %s does not answer \(cannot connect: '
        r'Connection refused\) after waiting 3 s \(--worker_wait_secs\). The '
        r'trainer does not start the servers of a running cluster' %
        self._Task(1, 1))
    # Started again later, the same command resumes from the checkpoint.
    self.workers.Start(1)
    self.workers.WaitServing(1)
    proc = self._Start('--max_steps=%d' % (resume_step + EVERY))
    proc.wait(timeout=120)
    self.assertEqual(0, proc.returncode, self._Log())
    self.assertIn('resumed from %s/ckpt-%d at step %d' %
                  (self.logdir, resume_step, resume_step), self._Log())
    self._AssertLossesOfAnUninterruptedRun()

  def testPartitionIsNamedAfterTheStepTimeoutAndARerunResumes(self):
    proc = self._Start('--max_steps=1000000',
                       '--step_timeout_secs=%d' % PARTITION_STEP_TIMEOUT_SECS)
    self._AfterCheckpoint(proc)
    self.lab.SetLink(1, False)
    log = self._StoppedLog(proc, timeout=PARTITION_STEP_TIMEOUT_SECS + 120)
    self.assertRegex(
        log, r'trainer: error: the session did not finish %s within the step '
        r'timeout \(%d s\): %s does not answer \(no answer within 3 s\)\. The '
        r'last checkpoint \(.*\) is intact' % (
            DOING, PARTITION_STEP_TIMEOUT_SECS, self._Task(1, 1)))
    # Nothing written is lost: the newest checkpoint reads, and the step
    # log holds every step up to the cut.
    newest = checkpoints.Newest(self.logdir)
    saved = checkpoints.GlobalStepOf(newest)
    self.assertGreaterEqual(len(trainer_testlib.Losses(self.logdir)), saved)
    self.lab.SetLink(1, True)
    proc = self._Start('--max_steps=%d' % (saved + EVERY))
    proc.wait(timeout=120)
    self.assertEqual(0, proc.returncode, self._Log())
    self.assertIn('resumed from %s at step %d' % (newest, saved), self._Log())
    self._AssertLossesOfAnUninterruptedRun()


if __name__ == '__main__':
  tf.test.main()
