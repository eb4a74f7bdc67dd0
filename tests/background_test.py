"""BackgroundCall and RunIsolated (gpipe.runtime.background), memory.FormatMiB."""

import functools
import gc
import threading
import weakref

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


  def testAFinishedCallDoesNotKeepWhatItsFunctionHolds(self):
    # A session's close keeps the session (and its graph) referenced only
    # while it runs.
    class Held:
      pass

    held = Held()
    ref = weakref.ref(held)
    call = background.BackgroundCall(functools.partial(id, held))
    del held
    call.Result()
    gc.collect()
    self.assertIsNone(ref())

  def testRunIsolatedBuildsInADefaultLingvoClusterOfItsOwn(self):
    from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
    caller = cluster_factory.ForTestingWorker(mode='sync', job='evaler',
                                              do_eval=True)
    with caller:
      tops = background.RunIsolated(
          lambda: (cluster_factory.Cluster.Top(), cluster_factory.Current()))
    # One cluster for the whole scratch build, not the caller's eval one.
    self.assertIsNotNone(tops[0])
    self.assertIs(tops[0], tops[1])
    self.assertIsNot(caller, tops[0])
    self.assertFalse(tops[0].do_eval)


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
