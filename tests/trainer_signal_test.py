"""SIGTERM and Ctrl-C: the checkpoint, the console and the step log agree.

A signal stops the trainer after the step it arrived in: that step is
counted, logged and saved, and the console names it. A second Ctrl-C stops
at once without saving; Ctrl-C during set-up stops without a traceback. A
run resumed after any of these has the losses of an uninterrupted run.

Most signals are sent by tests/trainer_signal_probe.py from inside the
trainer binary at a chosen moment (in a step's session run, in a
checkpoint's save), where a signal sent from outside lands only by chance;
one comes from another thread of this test, at whatever moment it lands.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re
import signal
import subprocess
import threading
from unittest import mock

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling
from tests import trainer_testlib
from tools.trainer import checkpoints
from tools.trainer import model_graph

PROBE = 'tests.trainer_signal_probe'
EVERY = 5
FLAGS = trainer_testlib.ResumableFlags(EVERY)
# The console's word on the step a signal stopped the run after.
_STOPPED = re.compile(r'interrupted (?:at|after) step (\d+)')


def _NewestStep(logdir):
  newest = checkpoints.Newest(logdir)
  return checkpoints.GlobalStepOf(newest) if newest else None


class TrainerSignalTest(test_utils.TestCase):

  def _Probe(self, logdir, max_steps, *signals, evaluate=False):
    """Runs the probe binary to its end; returns the CompletedProcess."""
    return trainer_testlib.Run(
        FLAGS + ['--logdir=' + logdir, '--max_steps=%d' % max_steps,
                 '--probe_signals=' + ','.join(signals),
                 '--eval_after_train=%s' % str(evaluate).lower()],
        module=PROBE)

  def _AssertStoppedAfter(self, logdir, result, name, step):
    """The run stopped after `step` on `name`, and everything says so."""
    output = result.stdout + result.stderr
    # The signal's status, as if it had killed the process (a supervisor
    # requeues the run), and no evaluation after the stop.
    self.assertEqual({'SIGTERM': 143, 'SIGINT': 130}[name], result.returncode,
                     output)
    self.assertIn('stopped by %s after step %d' % (name, step), output)
    self.assertNotIn('final test', output)
    # The step log goes on to the stop, without a gap.
    self.assertDictEqual(
        {'console': [step], 'checkpoint': step,
         'step log': list(range(1, step + 1))},
        {'console': [int(s) for s in _STOPPED.findall(output)],
         'checkpoint': _NewestStep(logdir),
         'step log': [s for s, _ in trainer_testlib.Losses(logdir)]}, output)
    self.assertIn('interrupted after step %d (%s)' % (step, name), output)
    self.assertTrue(checkpoints.Newest(logdir).endswith('ckpt-%d' % step))

  def testEveryStopAgreesAndTheResumedRunEqualsAnUninterruptedOne(self):
    logdir = self.create_tempdir().full_path

    # SIGTERM in the session run of step 5, a checkpoint step: the periodic
    # checkpoint is that of the step the console names; none at exit.
    # (With the final evaluation asked for: a stopped run skips it.)
    result = self._Probe(logdir, 1000, 'SIGTERM@step5', evaluate=True)
    self._AssertStoppedAfter(logdir, result, 'SIGTERM', 5)
    self.assertIn('interrupted after step 5 (SIGTERM): its checkpoint '
                  '%s/ckpt-5 is saved' % logdir, result.stdout)
    # Acknowledged while the step still ran.
    self.assertIn('SIGTERM during step 5: training stops once it ends',
                  result.stdout)

    # Ctrl-C in the session run of the 2nd step of a resumed run (step 7).
    result = self._Probe(logdir, 1000, 'SIGINT@step2')
    self._AssertStoppedAfter(logdir, result, 'SIGINT', 7)
    self.assertIn('interrupted after step 7 (SIGINT): saving a checkpoint '
                  '(Ctrl-C again stops at once, without saving)',
                  result.stdout)
    self.assertIn('saved %s/ckpt-7' % logdir, result.stdout)

    # Ctrl-C from another thread, once this run is past step 8: whenever it
    # lands (a step's run, between steps, a checkpoint), everything agrees.
    # (In this process: a trainer process costs seconds of imports.)
    stop = self._CtrlCInProcess(logdir, after_step=8)

    # Ctrl-C twice in the session run of the 2nd step of the next run (the
    # 1st if the 1st is a checkpoint step): it stops at once, before
    # counting that step, and saves nothing.
    forced = 1 if (stop + 1) % EVERY == 0 else 2
    result = self._Probe(logdir, 1000, 'SIGINT@step%d' % forced,
                         'SIGINT@step%d' % forced)
    output = result.stdout + result.stderr
    self.assertEqual(130, result.returncode, output)
    self.assertIn(
        'stopped at once by a second Ctrl-C, without saving the steps after '
        'the last checkpoint (%s/ckpt-%d)' % (logdir, stop), result.stdout)
    self.assertIn('trainer: stopped by Ctrl-C', result.stderr)
    self.assertNotIn('Traceback', output)
    self.assertNotIn('saved ', result.stdout)
    self.assertEqual(stop, _NewestStep(logdir))
    # The steps before the forced one are logged, not saved: the next run
    # drops them from the log and redoes them.
    self.assertEqual(list(range(1, stop + forced)),
                     [s for s, _ in trainer_testlib.Losses(logdir)])

    # To the end, with SIGTERM while the exit checkpoint is written: it is
    # written whole, and the run ends as it would have anyway.
    final_step = stop + 4 if (stop + 4) % EVERY else stop + 3
    result = self._Probe(logdir, final_step, 'SIGTERM@ckpt%d' % final_step)
    output = result.stdout + result.stderr
    self.assertEqual(0, result.returncode, output)
    self.assertIn('resumed from %s/ckpt-%d at step %d' % (logdir, stop, stop),
                  result.stdout)
    self.assertIn('SIGTERM while saving the checkpoint of step %d' %
                  final_step, result.stdout)
    self.assertIn('saved %s/ckpt-%d' % (logdir, final_step), result.stdout)
    self.assertIsNone(_STOPPED.search(output), output)
    self.assertEqual(final_step, _NewestStep(logdir))
    resumed = trainer_testlib.Losses(logdir, 'accuracy')

    # The same steps without interruption (in this process), bit-identical:
    # no step lost, none run twice.
    self.assertEqual(
        trainer_testlib.UninterruptedLosses(
            self.create_tempdir().full_path, final_step, EVERY), resumed)

  def _CtrlCInProcess(self, logdir, after_step):
    """Trains in this process; Ctrl-C once step `after_step` is logged.

    Returns:
      The step the run stopped after (checked like _AssertStoppedAfter).
    """
    done = threading.Event()  # The run ended before the signal: none.

    def CtrlC():
      polling.WaitUntil(
          lambda: done.is_set() or (
              (trainer_testlib.Losses(logdir) or [(0,)])[-1][0] > after_step),
          'step %d' % (after_step + 1))
      if not done.is_set():
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own handler outside the loop, whatever this test was
    # started with (a runner may ignore SIGINT; the trainer respects that).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=CtrlC, daemon=True)
    sender.start()
    try:
      code, out, err = trainer_testlib.RunInProcess(
          logdir=logdir, max_steps=1000,
          **trainer_testlib.ResumableSettings(EVERY))
    finally:
      done.set()
      sender.join()
      signal.signal(signal.SIGINT, previous)
    stopped = _STOPPED.search(out)
    self.assertIsNotNone(stopped, out + err)
    stop = int(stopped.group(1))
    self.assertGreater(stop, after_step)
    self._AssertStoppedAfter(
        logdir, subprocess.CompletedProcess([], code, out, err), 'SIGINT',
        stop)
    return stop

  def testCtrlCDuringSetUpStopsWithoutSavingOrTraceback(self):
    # In this process (a trainer process costs seconds of imports): Ctrl-C
    # once the graph is built, with Python's own SIGINT handler.
    logdir = self.create_tempdir().full_path
    build = model_graph.Build
    built = []

    def BuildThenCtrlC(*args, **kwargs):
      built.append(build(*args, **kwargs))
      os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt here.
      return built[0]

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
      with mock.patch.object(model_graph, 'Build', BuildThenCtrlC):
        code, out, err = trainer_testlib.RunInProcess(
            logdir=logdir, max_steps=3,
            **trainer_testlib.ResumableSettings(EVERY))
    finally:
      signal.signal(signal.SIGINT, previous)
    self.assertEqual(130, code, out + err)
    self.assertEqual('trainer: stopped by Ctrl-C\n', err)
    self.assertLen(built, 1)
    self.assertIsNone(checkpoints.Newest(logdir), out)
    self.assertEqual([], trainer_testlib.Losses(logdir))


if __name__ == '__main__':
  tf.test.main()
