"""BackgroundCall and RunIsolated (gpipe.runtime.background), memory.FormatMiB."""

import threading

from absl.testing import absltest
from gpipe.measure import memory
from gpipe.runtime import background


class BackgroundCallTest(absltest.TestCase):

  def testReturnsTheValueOfTheFunctionRunInAnotherThread(self):
    threads = []

    def Fn():
      threads.append(threading.current_thread())
      return 42

    call = background.BackgroundCall(Fn)
    self.assertEqual(42, call.Result())
    self.assertTrue(call.done)
    self.assertIsNone(call.error)
    self.assertIsNot(threads[0], threading.current_thread())
    self.assertTrue(call.thread.daemon)

  def testRaisesTheFunctionsOwnError(self):
    error = ValueError('bad input')

    def Fn():
      raise error

    call = background.BackgroundCall(Fn, daemon=False)
    self.assertFalse(call.thread.daemon)
    with self.assertRaises(ValueError) as raised:
      call.Result()
    self.assertIs(error, raised.exception)
    self.assertIs(error, call.error)

  def testWaitReportsWhetherItEnded(self):
    release = threading.Event()
    call = background.BackgroundCall(release.wait)
    self.assertFalse(call.Wait(0.01))
    self.assertFalse(call.done)
    release.set()
    self.assertTrue(call.Wait())
    self.assertTrue(call.Result())


class RunIsolatedTest(absltest.TestCase):

  def testRunsInAFreshThreadOfItsOwnAndWaitsForIt(self):
    # Lingvo's stack of layers under construction is thread-local: a fresh
    # thread starts with it empty.
    local = threading.local()
    local.building = 'outer layer'
    seen = background.RunIsolated(
        lambda: (getattr(local, 'building', None), threading.current_thread()))
    self.assertIsNone(seen[0])
    self.assertIsNot(threading.current_thread(), seen[1])
    self.assertFalse(seen[1].daemon)

  def testRaisesTheFunctionsOwnError(self):
    error = ValueError('bad layer')

    def Fn():
      raise error

    with self.assertRaises(ValueError) as raised:
      background.RunIsolated(Fn)
    self.assertIs(error, raised.exception)


class FormatMiBTest(absltest.TestCase):

  def testWholeMiBAndTheUnknown(self):
    self.assertEqual('3 MiB', memory.FormatMiB(3 * 2**20))
    self.assertEqual('2', memory.FormatMiB(1.6 * 2**20, unit=''))
    self.assertEqual('?', memory.FormatMiB(None))
    self.assertEqual('-', memory.FormatMiB(0, missing='-'))


if __name__ == '__main__':
  absltest.main()
