"""--elastic across network-namespace hosts: lost hosts, a new one, a slow one.

Five hosts (network namespaces of a tools.netlab.netns.Lab); hosts 0-3 each
serve one task of a cluster file (``--cluster_spec=@cluster.json``), the
trainer runs in the lab's client. The toy model in float64 starts as R=2
replicas x K=2 stages with M=2 micro-batches. Host 2's worker is lost for
good: the run shrinks to the survivors (R=1 K=2 M=4, host 3 a spare) and
goes on. The supervisor starts task 2 on host 4, another address, and
rewrites the file: the run grows back to 4 devices at a checkpoint, losing
no step. Then two losses in a row: task 3, and task 1 while the run moves
away from task 3; one move takes the run to tasks 0 and 2. R x M stays 4
throughout, so every loss equals an uninterrupted run's to 1e-10, and the
last checkpoint holds the last step.

A slow host: of two hosts, host 1's worker runs under a CPU quota of 0.3
cores (as in tests/trainer_rebalance_test.py, there on local workers): the
trainer moves a layer off its stage at a checkpoint, and the step gets
faster with an uninterrupted run's losses.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import json
import os
import re
import signal
import tempfile
import time

from gpipe.runtime import cgroups
from gpipe.runtime import cpu_quota
from lingvo import compat as tf
from lingvo.core import test_utils
from params import toy
from tests import netns_testlib
from tests import trainer_testlib
from tools.netlab import netns
from tools.trainer import checkpoints
from tools.trainer import elastic
from tools.trainer import summaries

EVERY = 10
# The grow comes at the first checkpoint after the watch's first round once
# the trainer runs again (held past the round's period below): at most
# POLL_SECS of steps and a checkpoint period after the shrink, the later
# moves a few steps after it (the trainer held while each worker is killed);
# a late round of the watch has about 4 s of steps after that.
MAX_STEPS = 450
PORT = netns.DEFAULT_PORT
FLAGS = trainer_testlib.ResumableFlags(EVERY) + [
    '--model_params_override=' + toy.FLOAT64_OVERRIDE, '--elastic',
    '--data_parallel=2', '--num_micro_batches=2', '--worker_wait_secs=1',
    '--max_steps=%d' % MAX_STEPS]


class NetnsElasticTest(test_utils.TestCase):

  def setUp(self):
    super().setUp()
    netns_testlib.SkipUnlessNamespaces(self)

  def testAHostLostForGoodShrinksTheRunAndANewHostGrowsItBack(self):
    work = tempfile.mkdtemp()
    logdir = os.path.join(work, 'run')
    log_path = os.path.join(work, 'trainer.log')
    spec = os.path.join(work, 'cluster.json')
    with netns.Lab(5) as lab:
      addresses = ['%s:%d' % (lab.host_addresses[i], PORT) for i in range(4)]

      def Write():
        with open(spec + '.new', 'w') as f:
          json.dump({'worker': addresses}, f)
        os.replace(spec + '.new', spec)

      def Serve(task, host):
        worker_log = os.path.join(work, 'worker_%d_host_%d.log' % (task, host))
        proc = lab.StartWorker(
            lab.hosts[host], ['--cluster_spec=@' + spec, '--task=%d' % task],
            log_path=worker_log)
        netns_testlib.WaitFor(proc, worker_log,
                              lambda: lab.Serving(host, PORT),
                              'task %d to serve on host %d' % (task, host))
        return proc

      Write()
      workers = [Serve(t, t) for t in range(4)]
      trainer = netns_testlib.PopenTrainer(
          lab, FLAGS + ['--logdir=' + logdir, '--cluster_spec=@' + spec],
          log_path)
      log = lambda: netns_testlib.ReadFile(log_path)
      netns_testlib.WaitFor(
          trainer, log_path,
          lambda: len(trainer_testlib.StepLog(logdir)) >= 15, '15 steps')
      netns.StopProcess(workers[2])  # Host 2 is gone for good.
      netns_testlib.WaitFor(trainer, log_path,
                            lambda: 'elastic: first step in' in log(),
                            'the run to shrink')
      # The supervisor brings task 2 up on host 4 and says so in the file;
      # the trainer waits meanwhile, so that it cannot end first, for at
      # least the watch's period: its next round reads the file as soon as
      # it runs again (one period later if a round was under way).
      os.kill(trainer.pid, signal.SIGSTOP)
      held = time.monotonic()
      try:
        addresses[2] = '%s:%d' % (lab.host_addresses[4], PORT)
        Write()
        workers.append(Serve(2, 4))
        time.sleep(max(0.0, elastic.POLL_SECS - (time.monotonic() - held)))
      finally:
        os.kill(trainer.pid, signal.SIGCONT)
      # Grown back: now two losses in a row, the second during the move the
      # first started (the trainer held while each worker is killed).
      netns_testlib.WaitFor(
          trainer, log_path,
          lambda: log().count('elastic: first step in') >= 2, 'the grow')
      os.kill(trainer.pid, signal.SIGSTOP)
      try:
        netns.StopProcess(workers[3])
      finally:
        os.kill(trainer.pid, signal.SIGCONT)
      netns_testlib.WaitFor(
          trainer, log_path,
          lambda: log().count('elastic: shrinking') >= 2, 'the second move',
          interval_secs=0.005)
      os.kill(trainer.pid, signal.SIGSTOP)
      try:
        moving = log().count('elastic: first step in') == 2
        netns.StopProcess(workers[1])
      finally:
        os.kill(trainer.pid, signal.SIGCONT)
      self.assertTrue(moving, 'the move ended before task 1 was lost')
      trainer.wait(timeout=300)
      out = log()
      for proc in workers:
        netns.StopProcess(proc)
    self.assertEqual(0, trainer.returncode, out[-5000:])
    old = re.escape('%s:%d' % (lab.host_addresses[2], PORT))
    self.assertRegex(out, r'worker lost: .*: task 2 at %s \(replica 1 stage 0\) '
                     r'does not answer' % old)
    self.assertRegex(
        out, r'elastic: shrinking to 2 device\(s\) of task 0, task 1 \(spare: '
        r'task 3\): R=2 K=2 M=2 gpipe -> R=1 K=2 M=4 gpipe')
    self.assertIn('elastic: task 2 listed at %s now' % addresses[2], out)
    self.assertRegex(
        out, r'elastic: growing to 4 device\(s\) of task 0, task 1, task 2, '
        r'task 3: R=1 K=2 M=4 gpipe -> R=2 K=2 M=2 gpipe .*no step redone')
    # The loss during the move is part of it: one move from the grown shape
    # to the two tasks left, R x M kept.
    self.assertRegex(
        out, r'elastic: shrinking to 2 device\(s\) of task 0, task 2: R=2 K=2 '
        r'M=2 gpipe -> R=1 K=2 M=4 gpipe')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['shrink', 'grow', 'shrink'], [e['kind'] for e in events])
    self.assertEqual(0, events[1]['steps_redone'])
    self.assertEqual(['task 3', 'task 1'],
                     [l.split(' at ')[0] for l in events[2]['lost']])
    # TensorBoard shows a redone step once: the grow's first step is gone
    # from it when the last move redid it.
    firsts = [e['first_step'] for e in events]
    self.assertEqual(
        [(1, 4.0), (firsts[0], 2.0)] +
        ([(firsts[1], 4.0)] if firsts[1] < firsts[2] else []) +
        [(firsts[2], 2.0)], summaries.Read(logdir)['trainer/devices'])
    # Nothing written is lost, and the math is the uninterrupted run's.
    losses = trainer_testlib.Losses(logdir)
    self.assertEqual(list(range(1, MAX_STEPS + 1)), [s for s, _ in losses])
    self.assertEqual(MAX_STEPS,
                     checkpoints.GlobalStepOf(checkpoints.Newest(logdir)))
    reference = trainer_testlib.OnePipelineFloat64Losses(
        os.path.join(work, 'reference'), MAX_STEPS)
    self.assertEqual([s for s, _ in reference], [s for s, _ in losses])
    self.assertAllClose([l for _, l in reference], [l for _, l in losses],
                        rtol=1e-10, atol=0)

  def testAThrottledHostGetsFewerLayersAndTheStepGetsFaster(self):
    try:
      cgroups.ParentDirectory('cpu', 'this test', cpu_quota.CpuQuotaError)
    except cpu_quota.CpuQuotaError as e:
      self.skipTest(str(e))
    work = tempfile.mkdtemp()
    logdir = os.path.join(work, 'run')
    log_path = os.path.join(work, 'trainer.log')
    # The move comes at the checkpoint of step 10 (20 or 30 on a loaded
    # machine): at least 9 traced steps after it up to a move at step 30.
    steps = 50
    with netns.Lab(2) as lab, netns.Workers(lab) as workers:
      # Host 1 is a slow host: its worker gets 0.3 cores.
      with cpu_quota.CpuQuota('gpipe_netns_test_%d' % os.getpid(),
                              0.3) as quota:
        quota.Add(workers.pids[1])
        trainer = netns_testlib.PopenTrainer(
            lab, trainer_testlib.ResumableFlags(EVERY) + [
                '--model_params_override=' + trainer_testlib.WIDE_TOY,
                '--logdir=' + logdir, '--cluster_spec=' + workers.cluster_spec,
                '--elastic', '--max_steps=%d' % steps,
                '--trace_every_n_steps=2'], log_path)
        trainer.wait(timeout=300)
      out = netns_testlib.ReadFile(log_path)
    self.assertEqual(0, trainer.returncode, out[-5000:])
    self.assertRegex(
        out, r'elastic: rebalancing after step \d+: stage\(s\) 1 slower than '
        r'their share of the cost .*: cut \[2, 2\] -> \[3, 1\]')
    events = elastic.ReadEvents(logdir)
    self.assertEqual(['rebalance'], [e['kind'] for e in events], out)
    move = events[0]
    self.assertEqual(0, move['steps_redone'])
    # Faster after the move, with an uninterrupted run's losses.
    trainer_testlib.AssertFasterAfterTheMoveWithUninterruptedLosses(
        self, logdir, move, steps, os.path.join(work, 'reference'))


if __name__ == '__main__':
  tf.test.main()
