"""Training across hosts: workers in network namespaces, links with latency.

Each host is a network namespace of a tools.netlab.netns.Lab, with one
``python -m gpipe.worker`` in it; the trainer runs in the lab's client
namespace with ``--cluster_spec``. Latency comes from the project's own
delaying TCP relay (tools/netlab/delay_relay.py: this kernel has no netem
qdisc): with ``delayed`` workers every connection to a worker, from the
trainer or another worker, crosses it with DELAY_MS each way. The losses
must equal those of the same model on local worker processes
(``--worker_processes``), with and without the delay (the replicas' layout
with it only: direct links are the two stages' case).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import re

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import netns_testlib
from tests import trainer_testlib
from tools.netlab import netns

TOY = netns_testlib.TOY
STEPS = 4


class NetnsTrainTest(test_utils.TestCase):

  def setUp(self):
    super().setUp()
    netns_testlib.SkipUnlessNamespaces(self)

  def _Reference(self, **flags):
    """Losses of the same training on local worker processes."""
    logdir = self.create_tempdir().full_path
    code, _, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, max_steps=STEPS, trace_every_n_steps=0,
        eval_after_train=False, **flags)
    self.assertEqual(0, code, err)
    return trainer_testlib.Losses(logdir)

  def _TrainOnHosts(self, num_hosts, reference, *flags, cpu_devices=1,
                    delays=(False, True)):
    """Trains on one worker per host, direct then delayed links.

    Args:
      num_hosts: hosts, one worker each.
      reference: the losses the runs must have.
      *flags: more trainer flags.
      cpu_devices: virtual CPU devices per worker.
      delays: the runs: without the delay (False), with it (True).

    Returns:
      The trainer's output of the delayed run.
    """
    with netns.Lab(num_hosts, delay_ms=netns_testlib.DELAY_MS) as lab:
      for delayed in delays:
        with netns.Workers(lab, delayed=delayed,
                           cpu_devices=cpu_devices) as workers:
          logdir = self.create_tempdir().full_path
          result = netns_testlib.RunTrainer(
              lab, ['--model=' + TOY, '--logdir=' + logdir,
                    '--max_steps=%d' % STEPS,
                    '--cluster_spec=' + workers.cluster_spec] +
              netns_testlib.QUIET + list(flags))
          self.assertEqual(0, result.returncode, result.stderr)
          self.assertIn('/job:worker/replica:0/task:%d/device:CPU:%d' %
                        (num_hosts - 1, cpu_devices - 1), result.stdout)
          # Exactly the losses of local worker processes.
          self.assertEqual(reference, trainer_testlib.Losses(logdir))
          self.assertEqual(
              [lab.Address(i, delayed) for i in range(num_hosts)],
              [a.split(':')[0] for a in workers.addresses])
        connections = re.findall(r'connection ([\d.]+):\d+ -> ([\d.]+):',
                                 netns_testlib.ReadFile(lab.relay_log))
        if not delayed:
          self.assertEqual([], connections)
      # The delayed run went through the relay: the trainer to the master
      # (task 0), and worker to worker.
      self.assertIn((lab.client_address, lab.host_addresses[0]), connections)
      self.assertIn((lab.host_addresses[0], lab.host_addresses[1]),
                    connections)
    return result.stdout

  def testTwoStagesOnTwoHosts(self):
    out = self._TrainOnHosts(2, self._Reference(worker_processes=2))
    self.assertIn('stage 0 on task 0 (CPU:0), stage 1 on task 1 (CPU:0)',
                  out)

  def testTwoReplicasOfTwoStagesOnTwoHostsWithTwoDevicesEach(self):
    # Each replica's two stages on one host's two devices; the replicas
    # meet across the link (the weights are read from, and the gradients
    # added on, the first replica's devices). Through the delayed links
    # only: direct links are testTwoStagesOnTwoHosts's, and the delay is
    # what the replicas' crossing must survive.
    reference = self._Reference(worker_processes=2, devices_per_task=2,
                                data_parallel=2)
    out = self._TrainOnHosts(2, reference, '--data_parallel=2',
                             cpu_devices=2, delays=(True,))
    self.assertIn('replica 1: stages 0-1 on task 1 (CPU:0, CPU:1)', out)


if __name__ == '__main__':
  tf.test.main()
