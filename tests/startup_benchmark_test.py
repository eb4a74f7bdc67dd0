"""`python -m tools.benchmark startup --quick`: the trainer's start-up phases.

Runs the trainer twice on 2 worker processes (this checkout as ``--before``
and as ``after``): the phases the trainer logs, the figures measured from
outside and the side-by-side comparison (no speed checks).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PHASES = ('trainer start (imports, flags, workers)', 'layers and variables',
          'train graph', 'forward', 'stage tracing', 'learner',
          'tf.gradients', 'optimizer update', 'saver and initializers',
          'session', 'variable initialization', 'step 1', 'step 2')


class StartupBenchmarkTest(test_utils.TestCase):

  def testPhasesOfBothRunsSideBySide(self):
    path = os.path.join(tempfile.mkdtemp(), 'startup.json')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      cli.main(['startup', '--quick', '--before', HERE, '--json', path])
    with open(path) as f:
      result = json.load(f)
    text = stdout.getvalue()
    self.assertEqual(result['markdown'], text.strip('\n'))
    self.assertEqual([r['name'] for r in result['runs']], ['before', 'after'])
    for run in result['runs']:
      phases = {row['phase']: row for row in run['startup']['phases']}
      self.assertCountEqual(phases, PHASES)
      for row in phases.values():
        self.assertGreaterEqual(row['seconds'], 0, row)
        self.assertGreater(row['peak_bytes'], 0, row)
      # The stage functions are traced inside the forward pass, the
      # gradients inside the learner: nested phases, each counted once.
      self.assertEqual(phases['stage tracing']['parent'], 'forward')
      self.assertEqual(phases['tf.gradients']['parent'], 'learner')
      self.assertEqual(phases['step 2']['calls'], 1)
      total = sum(row['seconds'] for row in phases.values())
      self.assertLessEqual(total, run['startup']['since_trainer_start'] + 1)
      self.assertLess(run['to_step_1'], run['to_step_2'])
      self.assertLen(run['worker_peak_bytes'], 2)
      self.assertGreater(run['trainer_peak_bytes'], 0)
      self.assertGreater(run['startup']['graph_ops'], 0)
      self.assertLen(run['losses'], 2)
    # The same code and seed: the same losses, said in the table.
    self.assertTrue(result['same_losses'])
    self.assertIn('same losses: yes', text)
    self.assertIn('| stage tracing |', text)

  def testBeforeMustBeACheckout(self):
    with self.assertRaisesRegex(ValueError, 'not a checkout'):
      cli.main(['startup', '--quick', '--before', tempfile.mkdtemp()])


if __name__ == '__main__':
  tf.test.main()
