"""The trainer's start-up log (tools/trainer/startup.py) and the stage hook.

``gpipe.stage.OnTrace`` reports each stage's tracing once, whatever its
kind of backward; ``startup.TimeGraphBuild`` turns the reports into the
'stage tracing' phase, nested in the phase that traced the stages.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import stage as stage_lib
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import schedule_testlib
from tools.trainer import startup

graph_rewrites.Off()


def _Forward(k, schedule):
  """Traces a K-stage toy pipeline of `schedule` (its FProp)."""
  py_utils.GetOrCreateGlobalStepVar()
  net = schedule_testlib.Net(schedule, k, 2, 'always')
  x = tf.zeros([4, 8], tf.float64)
  return net.FProp(net.theta, x, targets=x)


class StageTraceHookTest(test_utils.TestCase):

  def testEachStageIsReportedOnceInsideTheBodyOnly(self):
    for schedule in ('gpipe', 'zb_h1'):  # zb_h1: the split backward too.
      reports = []
      with tf.Graph().as_default():
        with stage_lib.OnTrace(lambda s, secs: reports.append((s, secs))):
          _Forward(2, schedule)
      self.assertEqual([0, 1], [s.index for s, _ in reports], schedule)
      self.assertTrue(all(secs > 0 for _, secs in reports), reports)
      # Out of the body: no more reports.
      with tf.Graph().as_default():
        _Forward(2, schedule)
      self.assertLen(reports, 2)


class StartupLogTest(test_utils.TestCase):

  def testStageTracingIsNestedInTheOpenPhase(self):
    log = startup.StartupLog(origin=0.0)
    with tf.Graph().as_default():
      with log.Phase('train graph'), startup.TimeGraphBuild(log):
        with log.Phase('forward'):
          _Forward(2, 'gpipe')
    rows = {row['phase']: row for row in log.Rows()}
    self.assertEqual(['train graph', 'forward', 'stage tracing'], list(rows))
    tracing = rows['stage tracing']
    self.assertEqual('forward', tracing['parent'])
    self.assertEqual(2, tracing['calls'])
    self.assertGreater(tracing['seconds'], 0)
    self.assertGreater(tracing['peak_bytes'], 0)
    # Each phase counts its own time: tracing is not in the forward's.
    self.assertGreaterEqual(rows['forward']['seconds'], 0)
    # The hook is gone after the body.
    self.assertEmpty(stage_lib._TRACE_OBSERVERS)  # pylint: disable=protected-access

  def testMarkOutsideAPhaseHasNoParent(self):
    log = startup.StartupLog(origin=0.0)
    log.Mark('trainer start', 1.5)
    log.Mark('stage tracing', 0.5, nested=True)  # No phase open.
    self.assertEqual([(None, 1.5), (None, 0.5)],
                     [(r['parent'], r['seconds']) for r in log.Rows()])


if __name__ == '__main__':
  tf.test.main()
