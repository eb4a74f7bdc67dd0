"""gpipe/runtime/liveness.py: does the TensorFlow server at an address answer."""

import socket
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils


def _ClosedPort():
  return 'localhost:%d' % local_cluster.FreePort()


class LivenessTest(test_utils.TestCase):

  def testServedPortAnswers(self):
    # A TensorFlow server in this process, as a worker serves.
    server = tf.distribute.Server.create_local_server()
    address = server.target[len('grpc://'):]
    self.assertIsNone(liveness.Probe(address))
    self.assertIsNone(liveness.Probe(address, connect_only=True))

  def testClosedPortCannotConnect(self):
    start = time.time()
    self.assertEqual('cannot connect: Connection refused',
                     liveness.Probe(_ClosedPort(), timeout_secs=3))
    # Refused at once, not after the timeout.
    self.assertLess(time.time() - start, 2)
    self.assertEqual('cannot connect: Connection refused',
                     liveness.Probe(_ClosedPort(), connect_only=True))

  def testSilentListenerTimesOutNamingTheTimeout(self):
    with socket.socket() as listener:
      listener.bind(('localhost', 0))
      listener.listen(4)
      address = 'localhost:%d' % listener.getsockname()[1]
      start = time.time()
      reason = liveness.Probe(address, timeout_secs=1)
      took = time.time() - start
      # Something listens: enough for a caller that only connects.
      self.assertIsNone(liveness.Probe(address, 1, connect_only=True))
    self.assertEqual('accepts connections, but no TensorFlow server answered '
                     'within 1 s: is something else listening there?', reason)
    self.assertBetween(took, 0.9, 3)

  def testAwaitServingEndsWhenServedWhenTheProcessEndsOrAtTheDeadline(self):
    server = tf.distribute.Server.create_local_server()
    served = server.target[len('grpc://'):]
    self.assertIsNone(liveness.AwaitServing(served, lambda: True,
                                            time.time() + 5))
    # A closed port: probed until its process is gone, or until the deadline.
    checks = []
    reason = liveness.AwaitServing(
        _ClosedPort(), lambda: checks.append(1) or len(checks) < 3,
        time.time() + 60, poll_secs=0.01)
    self.assertEqual('cannot connect: Connection refused', reason)
    self.assertLen(checks, 3)
    start = time.time()
    self.assertEqual('cannot connect: Connection refused',
                     liveness.AwaitServing(_ClosedPort(), lambda: True,
                                           start + 0.3, poll_secs=0.05))
    self.assertBetween(time.time() - start, 0.3, 3)

  def testUnknownHostIsNamed(self):
    reason = liveness.Probe('no-such-host.invalid:2222', timeout_secs=3)
    self.assertTrue(reason.startswith('cannot connect: ') or
                    reason.startswith('no answer'), reason)


if __name__ == '__main__':
  tf.test.main()
