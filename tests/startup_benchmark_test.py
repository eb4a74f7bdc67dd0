"""`python -m tools.benchmark startup --quick`: the trainer's start-up phases.

Runs the trainer (the toy model) twice on 2 worker processes (this checkout
as ``--before`` and as ``after``): the phases the trainer logs, the figures measured from
outside and the side-by-side comparison (no speed checks): the phases add up
to the start-up the trainer logs and agree with the time measured from
outside. ``StartupLog`` on a clock of its own: each phase's own time, nested
ones apart, adding up to the total exactly.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile
from unittest import mock

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli
from tools.trainer import startup

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PHASES = ('trainer start (imports, flags, workers)', 'layers and variables',
          'train graph', 'forward', 'stage tracing', 'learner',
          'tf.gradients', 'optimizer update', 'saver and initializers',
          'session', 'variable initialization', 'step 1', 'step 2')
# The phases not nested in another, in the order they run.
TOP_LEVEL = ('trainer start (imports, flags, workers)',
             'layers and variables', 'train graph', 'saver and initializers',
             'session', 'variable initialization', 'step 1', 'step 2')
# Of the start-up, what the trainer does between its phases (logging, the
# first read of the global step...): well under a tenth.
UNTIMED_FRACTION = 0.1
# The trainer counts from its package's import, this test from starting its
# process: slack for the interpreter's start and clock reads.
BOOT_TIME_SECONDS = 1.0


# How much lower a process's VmHWM may read later (the kernel's per-CPU
# resident-page counts; 64 pages).
PEAK_SLACK_BYTES = 64 * 4096

class _Clock:
  """A stand-in for the time module: time() is what the test sets."""

  def __init__(self, now):
    self.now = now

  def time(self):
    return self.now


class StartupBenchmarkTest(test_utils.TestCase):

  def testPhasesOfBothRunsSideBySide(self):
    # The toy model, not --quick's mt.NumbersTiny (testQuickRunsATinyModel):
    # the same phases, a graph built in a fraction of the time.
    path = os.path.join(tempfile.mkdtemp(), 'startup.json')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      cli.main(['startup', '--quick', '--model', 'toy.PipelinedDigitsMlp',
                '--worker_processes', '2', '--before', HERE, '--json',
                path])
    with open(path) as f:
      result = json.load(f)
    text = stdout.getvalue()
    self.assertEqual(result['markdown'], text.strip('\n'))
    self.assertEqual([r['name'] for r in result['runs']], ['before', 'after'])
    for run in result['runs']:
      rows = run['startup']['phases']
      phases = {row['phase']: row for row in rows}
      self.assertCountEqual(phases, PHASES)
      for row in phases.values():
        self.assertGreaterEqual(row['seconds'], 0, row)
        self.assertGreater(row['peak_bytes'], 0, row)
      # The stage functions are traced inside the forward pass, the
      # gradients inside the learner: nested phases, each counted once.
      self.assertEqual(phases['stage tracing']['parent'], 'forward')
      self.assertEqual(phases['tf.gradients']['parent'], 'learner')
      self.assertEqual(phases['step 2']['calls'], 1)
      self.assertEqual(
          [row['phase'] for row in rows if row['parent'] is None],
          list(TOP_LEVEL))
      # The phases' own times add up to the start-up the trainer logged
      # (from its start to the end of step 2), less what runs between them.
      total = sum(row['seconds'] for row in rows)
      since = run['startup']['since_trainer_start']
      self.assertLessEqual(total, since + 1e-3)
      self.assertGreaterEqual(total, (1 - UNTIMED_FRACTION) * since)
      # ... and to what is measured from outside: from starting the trainer
      # to reading its progress line of step 1 (printed after that step).
      through_step_1 = sum(row['seconds'] for row in rows[:rows.index(
          phases['step 1']) + 1])
      self.assertLessEqual(through_step_1,
                           run['to_step_1'] + BOOT_TIME_SECONDS)
      self.assertGreaterEqual(
          through_step_1, (1 - UNTIMED_FRACTION) * run['to_step_1'])
      self.assertLessEqual(since, run['to_step_2'] + BOOT_TIME_SECONDS)
      self.assertLess(run['to_step_1'], run['to_step_2'])
      # The first step also optimizes and partitions the graph and
      # instantiates the stage functions: tens of times the second.
      self.assertGreater(phases['step 1']['seconds'],
                         phases['step 2']['seconds'])
      # A high-water mark only grows: from phase to phase, and to what is
      # read from outside once step 1 is done; up to PEAK_SLACK_BYTES, as
      # Linux counts a process's resident pages per CPU and folds them in
      # lazily, so VmHWM can read a few pages lower later (seen: 4 KiB on
      # the toy model).
      peaks = [phases[name]['peak_bytes'] for name in TOP_LEVEL]
      for name, before, after in zip(TOP_LEVEL[1:], peaks, peaks[1:]):
        self.assertGreaterEqual(after, before - PEAK_SLACK_BYTES, name)
      self.assertGreaterEqual(run['trainer_peak_bytes'],
                              phases['step 1']['peak_bytes'] -
                              PEAK_SLACK_BYTES)
      self.assertLen(run['worker_peak_bytes'], 2)
      self.assertGreater(run['trainer_peak_bytes'], 0)
      self.assertGreater(run['startup']['graph_ops'], 0)
      self.assertLen(run['losses'], 2)
    # The table shows each phase's seconds in both runs.
    for name in PHASES:
      self.assertIn('| %s | %s |' % (name, ' | '.join(
          '%.1f' % {row['phase']: row['seconds'] for row in run['startup'][
              'phases']}[name] for run in result['runs'])), text)
    # The same code and seed: the same graph and losses, said in the table.
    before, after = result['runs']
    self.assertEqual(before['startup']['graph_ops'],
                     after['startup']['graph_ops'])
    self.assertTrue(result['same_losses'])
    self.assertIn('same losses: yes', text)
    self.assertIn('| stage tracing |', text)

  def testPhasesAddUpToTheTotal(self):
    # Nested phases count apart from the phase around them, a phase entered
    # again adds to its row, a hooked function is timed as a phase: the
    # rows add up to the wall time of the phases (12 s), and the total is
    # that plus the time outside them (2.25 s).
    class Builder:

      def Trace(self):
        clock.now += 2.0

    clock = _Clock(100.0)
    trace = Builder.Trace
    path = os.path.join(tempfile.mkdtemp(), 'startup.json')
    with mock.patch.object(startup, 'time', clock):
      log = startup.StartupLog(origin=100.0)
      clock.now = 103.0
      log.Mark('start', 3.0)
      with log.Phase('graph'), log.Hooks([(Builder, 'Trace', 'tracing')]):
        clock.now += 1.0
        Builder().Trace()
        clock.now += 0.5
        with log.Phase('tracing'):
          clock.now += 1.5
      # Timed inside the hooks only; between the phases, in none.
      self.assertIs(Builder.Trace, trace)
      Builder().Trace()
      clock.now += 0.25
      with log.Phase('step 1'):
        clock.now += 4.0
      result = log.Write(path)
    rows = {row['phase']: row for row in result['phases']}
    self.assertEqual(list(rows), ['start', 'graph', 'tracing', 'step 1'])
    self.assertEqual(
        {name: (row['seconds'], row['calls'], row['parent'])
         for name, row in rows.items()},
        {'start': (3.0, 1, None), 'graph': (1.5, 1, None),
         'tracing': (3.5, 2, 'graph'), 'step 1': (4.0, 1, None)})
    self.assertEqual(sum(row['seconds'] for row in rows.values()), 12.0)
    self.assertEqual(result['since_trainer_start'], 14.25)
    with open(path) as f:
      self.assertEqual(json.load(f)['phases'], result['phases'])

  def testQuickRunsATinyModel(self):
    # --quick swaps the 16-worker default for mt.NumbersTiny on 2 workers;
    # a model given stays.
    # pylint: disable=protected-access
    args = cli._Parser().parse_args(['startup', '--quick'])
    cli._ApplyQuick(args)
    self.assertEqual((args.model, args.worker_processes),
                     ('mt.NumbersTiny', 2))
    args = cli._Parser().parse_args(['startup', '--quick', '--model',
                                     'toy.PipelinedDigitsMlp'])
    cli._ApplyQuick(args)
    self.assertEqual(args.model, 'toy.PipelinedDigitsMlp')

  def testBeforeMustBeACheckout(self):
    with self.assertRaisesRegex(ValueError, 'not a checkout'):
      cli.main(['startup', '--quick', '--before', tempfile.mkdtemp()])


if __name__ == '__main__':
  tf.test.main()
