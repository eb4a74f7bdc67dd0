"""train_loop: what becomes of a session that a run ended in, without one."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import threading
import types

from lingvo.core import test_utils
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
    self._abandoned = list(train_loop._ABANDONED_SESSIONS)
    del train_loop._ABANDONED_SESSIONS[:]

  def tearDown(self):
    train_loop._ABANDONED_SESSIONS[:] = self._abandoned
    super().tearDown()

  def _Run(self, loop, sess):
    with self.assertRaises(_Lost):
      loop._RunSession(sess, None, None, None, None, None, None, None)

  def testAnElasticRunClosesTheSessionItEndedIn(self):
    sess = _Session()
    self._Run(_Loop(elastic=True), sess)
    self.assertTrue(sess.closed.is_set())
    self.assertEqual(0, train_loop.AbandonedSessions())

  def testAnElasticRunLeavesASessionOpenWhoseCloseHangs(self):
    sess = _Session(hangs=True)
    old = train_loop.CLOSE_SECS
    try:
      train_loop.CLOSE_SECS = 0.1
      self._Run(_Loop(elastic=True), sess)
    finally:
      train_loop.CLOSE_SECS = old
      sess.release.set()
    self.assertEqual(1, train_loop.AbandonedSessions())

  def testADistributedRunLeavesItOpen(self):
    sess = _Session()
    self._Run(_Loop(elastic=False), sess)
    self.assertFalse(sess.closed.is_set())
    self.assertEqual(1, train_loop.AbandonedSessions())


if __name__ == '__main__':
  test_utils.main()
