"""Training across hosts: workers in network namespaces, links with latency.

Each host is a network namespace of a tools.netlab.netns.Lab, with one
``python -m gpipe.worker`` in it; the trainer runs in the lab's client
namespace with ``--cluster_spec``. Latency comes from the project's own
delaying TCP relay (tools/netlab/delay_relay.py: this kernel has no netem
qdisc): with ``delayed`` workers every connection to a worker, from the
trainer or another worker, crosses it with DELAY_MS each way. The losses
must equal those of the same model on local worker processes
(``--worker_processes``), with and without the delay.
"""

from gpipe import lingvo_import  # pylint: disable=unused-import

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
    return netns_testlib.Losses(logdir)

  def _TrainOnHosts(self, num_hosts, reference, *flags):
    """Trains on one worker per host, direct then delayed links."""
    with netns.Lab(num_hosts, delay_ms=netns_testlib.DELAY_MS) as lab:
      for delayed in (False, True):
        with netns.Workers(lab, delayed=delayed) as workers:
          logdir = self.create_tempdir().full_path
          result = netns_testlib.RunTrainer(
              lab, ['--model=' + TOY, '--logdir=' + logdir,
                    '--max_steps=%d' % STEPS,
                    '--cluster_spec=' + workers.cluster_spec] +
              netns_testlib.QUIET + list(flags))
          self.assertEqual(0, result.returncode, result.stderr)
          self.assertIn('/job:worker/replica:0/task:%d/device:CPU:0' %
                        (num_hosts - 1), result.stdout)
          # Exactly the losses of local worker processes.
          self.assertEqual(reference, netns_testlib.Losses(logdir))
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

  def testTwoStagesOnTwoHosts(self):
    self._TrainOnHosts(2, self._Reference(worker_processes=2))

  def testTwoReplicasOfTwoStagesOnFourHosts(self):
    # R=2 x K=2 over four single-device hosts.
    self._TrainOnHosts(4, self._Reference(worker_processes=4,
                                          data_parallel=2),
                       '--data_parallel=2')


if __name__ == '__main__':
  tf.test.main()
