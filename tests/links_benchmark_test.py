"""python -m tools.benchmark links: its critical-path model, and a tiny run.

The tiny run needs network namespaces (root); without them it is skipped,
saying why, and the subcommand's own refusal is checked instead.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import sys
from unittest import mock

from gpipe import schedules
from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli
from tools.benchmark import links
from tools.netlab import netns

PNG_MAGIC = b'\x89PNG'


class CriticalPathTest(test_utils.TestCase):

  def testWithoutLatencyTheSpanIsTheSchedulesOwn(self):
    for name in ('gpipe', '1f1b', 'zb_h1'):
      for k, m in ((2, 4), (4, 8)):
        costs = schedules.registry.Costs(name, forward=1, backward=2, weight=1)
        _, orders = schedules.Orders(name, k, m, costs)
        lanes = schedules.simulate.Simulate(
            orders, k, m, per_micro_batch_loss=True, costs=costs)
        self.assertEqual(len(lanes[0]),
                         links.SimulatedSpan(name, k, m, True, 0.0))

  def testFillDrainExposesItsFillAndDrainOnly(self):
    # K-1 hand-overs filling, K-1 draining, the client's request and reply;
    # the master's RunGraph messages overlap with its first forward.
    for k in (2, 4):
      for m in (4, 8, 16):
        self.assertEqual(2 * (k - 1) + 2,
                         links.CriticalCrossings('gpipe', k, m, True))

  def testOneFOneBExposesAHandOverPerMicroBatchAndZeroBubbleFewer(self):
    one_f_one_b = [links.CriticalCrossings('1f1b', 2, m, True)
                   for m in (4, 8, 16)]
    self.assertEqual([6, 10, 18], one_f_one_b)
    zero_bubble = [links.CriticalCrossings('zb_h1', 2, m, True)
                   for m in (4, 8, 16)]
    self.assertTrue(all(z <= o for z, o in zip(zero_bubble, one_f_one_b)))

  def testADelayLongerThanATaskExposesMoreOfZeroBubble(self):
    # ZB-H1's W tasks fill short waits only: a delay of 10 tasks shows
    # more hand-overs than the critical path of a short one. Fill-drain
    # streams its micro-batches whatever the delay.
    for name, critical, exposed in (('zb_h1', 6, 9.8), ('gpipe', 4, 4)):
      self.assertEqual(critical, links.CriticalCrossings(name, 2, 8, True))
      added = (links.SimulatedSpan(name, 2, 8, True, 10.0) -
               links.SimulatedSpan(name, 2, 8, True, 0.0))
      self.assertAlmostEqual(exposed, added / 10.0)


class LinksBenchmarkTest(test_utils.TestCase):

  def testRefusedWithoutNamespaces(self):
    with mock.patch.object(netns, 'Unavailable',
                           return_value='no privilege, for the test'):
      with self.assertRaisesRegex(SystemExit, 'links: the hosts are network '
                                  'namespaces, which cannot be made here: no '
                                  'privilege, for the test'):
        cli.main(['links', '--quick'])

  def testTinyRun(self):
    reason = netns.Unavailable()
    if reason:
      print('skipped: %s' % reason, file=sys.stderr)
      self.skipTest('network namespaces are not available here: %s' % reason)
    out_dir = self.create_tempdir().full_path
    json_path = os.path.join(out_dir, 'links.json')
    png_path = os.path.join(out_dir, 'links.png')
    stdout = io.StringIO()
    # The smallest model of one layer per stage: what is checked (the
    # configurations, their step times at each delay, the crossings on the
    # critical path, the report, the namespaces gone) is the subcommand's,
    # whatever the stages compute; the dense layers build and run fastest.
    with contextlib.redirect_stdout(stdout):
      cli.main(['links', '--quick', '--model', 'dense', '--num_layers', '2',
                '--json', json_path, '--plot', png_path])
    text = stdout.getvalue()
    with open(json_path) as f:
      result = json.load(f)
    with open(png_path, 'rb') as f:
      self.assertEqual(PNG_MAGIC, f.read(4))
    self.assertIn('## Links with latency', text)
    self.assertIn('| 2 | gpipe | 2 |', text)
    self.assertIn('| 2 | 1f1b | 2 |', text)
    self.assertEqual(result['markdown'], text.strip('\n'))
    got = {(c['K'], c['schedule'], c['M']) for c in result['configs']}
    self.assertEqual({(2, 'gpipe', 2), (2, '1f1b', 2)}, got)
    for c in result['configs']:
      self.assertCountEqual(['0', '1'], c['seconds'])
      self.assertTrue(all(s > 0 for s in c['seconds'].values()), c)
      self.assertEqual(2 * 2 + links.CONTROL_CROSSINGS, c['crossings'])
      self.assertEqual(links.CriticalCrossings(c['schedule'], 2, 2, True),
                       c['critical'])
    # Every namespace of the run is gone.
    self.assertFalse([n for n in netns.Namespaces()
                      if n.startswith('%s%dx' % (netns.PREFIX, os.getpid()))])


if __name__ == '__main__':
  tf.test.main()
