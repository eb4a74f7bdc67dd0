"""`python -m tools.benchmark elastic`: its figures from the runs' records.

The three scenarios train for minutes (the benchmark's own runs, and
//tests:trainer_elastic_test and //tests:trainer_rebalance_test for what the
trainer does in them); here the arithmetic on their step logs and events,
the cut override its static runs use, and the report, JSON and plot from
the scenarios' results.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
from unittest import mock

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli
from tools.benchmark import elastic
from tools.trainer import model_select


def _Records(steps_and_times):
  return [dict(step=s, loss=1.0, time=t) for s, t in steps_and_times]


class ElasticBenchmarkTest(test_utils.TestCase):

  def testRatesSkipTheGapWhereARunRedoesSteps(self):
    # Steps 1-4, then a move back to the checkpoint of step 2: 3 and 4 are
    # redone. No rate spans the move (step 4 -> step 3).
    records = _Records([(1, 0.0), (2, 0.5), (3, 1.0), (4, 2.0), (3, 9.0),
                        (4, 9.25), (5, 9.5)])
    self.assertEqual([(0.5, 64.0), (1.0, 64.0), (2.0, 32.0), (9.25, 128.0),
                      (9.5, 128.0)], elastic._Rates(records, 32))
    # A move's first step (its interval holds the move) has no rate.
    self.assertEqual([(0.5, 64.0), (2.0, 32.0), (9.25, 128.0), (9.5, 128.0)],
                     elastic._Rates(records, 32, first_steps={3}))
    # Medians of a window of time, [start, end).
    rates = elastic._Rates(records, 32)
    self.assertEqual(64.0, elastic._Median(rates, 0, 2.0))
    self.assertEqual(128.0, elastic._Median(rates, 9.0, float('inf')))
    self.assertIsNone(elastic._Median(rates, 3.0, 9.0))
    # The median step in (start, end] and the newest record of a step.
    self.assertEqual(0.5, elastic._StepSecs(records, 1, 3))
    self.assertEqual(0.25, elastic._StepSecs(records, 3, 5))
    # Traced steps (multiples of 3) and the steps after them left out:
    # only step 2's 0.5 s and the second step 5's 0.25 s... of (1, 5].
    self.assertEqual(0.5, elastic._StepSecs(records, 1, 4, skip_every=3))
    self.assertEqual(0.375, elastic._StepSecs(records, 0, 5, skip_every=3))
    self.assertEqual(9.0, elastic._FirstStepTime(records, 3))

  def testLossesAreComparedStepByStepWithTheRedoneStepsOnce(self):
    reference = [dict(step=s, loss=2.0 / s) for s in range(1, 7)]
    # The run's log: steps 5 and 6 redone after a move replaced the first
    # tries (one history), step 4 off by 1e-5 relative.
    run = [dict(step=s, loss=2.0 / s) for s in (1, 2, 3)] + [
        dict(step=4, loss=0.5 * (1 + 1e-5)), dict(step=5, loss=0.4),
        dict(step=6, loss=2.0 / 6)]
    got = elastic.CompareLosses(run, reference)
    self.assertEqual((6, 4), (got['steps'], got['at_step']))
    self.assertAllClose(1e-5, got['max_relative'], rtol=1e-6)
    # Steps the reference did not log are not compared.
    self.assertEqual(0, elastic.CompareLosses(
        [dict(step=9, loss=1.0)], reference)['steps'])
    # A step logged twice (a first try, then its redo) counts once, as
    # redone; a NaN loss is no match.
    twice = run[:5] + [dict(step=5, loss=0.4 * 3)] + run[5:]
    self.assertEqual(6, elastic.CompareLosses(twice, reference)['steps'])
    nan = elastic.CompareLosses(run[:2] + [dict(step=3, loss=float('nan'))],
                                reference)
    self.assertEqual((float('inf'), 3), (nan['max_relative'], nan['at_step']))
    # R x M of a shape's label.
    self.assertEqual(4, elastic._MicroBatchesPerStep('R=1 K=2 M=4 gpipe'))
    self.assertEqual(4, elastic._MicroBatchesPerStep('R=2 K=2 M=2 zb_v v=2'))

  def testTheStartUpIsTheRunsFirstNotAMoves(self):
    path = os.path.join(self.create_tempdir().full_path, 'trainer.log')
    with open(path, 'w') as f:
      f.write("start-up: 38.3 s from the trainer's start to the end of step 2"
              "; trainer peak memory 1415 MiB\nelastic: first step in ...\n"
              'start-up: 19.9 s from the restart (or move) to the end of step '
              '2; trainer peak memory 1748 MiB\n')
    self.assertEqual(38.3, elastic._StartupSecs(path))

  def testCutOverrideSetsEveryPipelinesCut(self):
    model = 'toy.PipelinedDigitsMlp'
    cfg = model_select.ModelParams(
        model, override=elastic._CutOverride(model, [3, 1]))
    (_, pp), = model_select.FindPipelines(cfg)
    self.assertEqual((2, [3, 1]), (pp.num_stages, pp.stage_sizes))

  def testReportJsonAndPlotFromTheScenarios(self):
    rates = [(100.0 + i, 50.0 + i) for i in range(20)]
    loss_and_return = dict(
        startup_secs=30.0, before=60.0, shrunk=40.0, after=58.0,
        shrink_secs=12.5, shrink_redone=4, kill_to_first_step=20.0,
        grow_secs=9.0, grow_redone=0, steps=80,
        shapes=['R=2 K=2 M=2 gpipe', 'R=1 K=2 M=4 gpipe',
                'R=2 K=2 M=2 gpipe'],
        marks=dict(loss=104.0, shrunk=110.0, grown=115.0, **{'return': 112.0}),
        rates=rates, losses=dict(steps=120, max_relative=3.2e-6, at_step=77))
    restart = dict(startup_secs=31.0, secs=8.0, redone=3,
                   kill_to_first_step=10.0)
    throttled = dict(old_cut=[2, 2], new_cut=[3, 1], factors=[1.0, 2.0],
                     before=0.2, after=0.125, predicted=0.12,
                     static_old=0.21, static_new=0.13, unthrottled=0.1,
                     move_secs=5.0,
                     rates=rates, moved_at=110.0)
    calls = []

    def Fake(name, result):
      def Scenario(model, args, workdir):
        calls.append((name, model, os.path.basename(workdir)))
        self.assertTrue(os.path.isdir(workdir))
        return result
      return Scenario

    out = self.create_tempdir().full_path
    stdout = io.StringIO()
    with mock.patch.object(elastic, 'LossAndReturn',
                           Fake('loss', loss_and_return)), \
        mock.patch.object(elastic, 'Restart', Fake('restart', restart)), \
        mock.patch.object(elastic, 'Throttled', Fake('slow', throttled)), \
        contextlib.redirect_stdout(stdout):
      cli.main(['elastic', '--models', 'a.A,b.B', '--json',
                os.path.join(out, 'e.json'), '--plot',
                os.path.join(out, 'e.png')])
    self.assertEqual(
        [('loss', 'a.A', 'loss_and_return'), ('restart', 'a.A', 'restart'),
         ('slow', 'a.A', 'throttled'), ('loss', 'b.B', 'loss_and_return'),
         ('restart', 'b.B', 'restart'), ('slow', 'b.B', 'throttled')], calls)
    text = stdout.getvalue()
    self.assertIn('| a.A | R=2 K=2 M=2 gpipe -> R=1 K=2 M=4 gpipe -> R=2 K=2 '
                  'M=2 gpipe | 60.0 | 40.0 | 58.0 | 30.0 | 20.0 | 12.5 | 4 | '
                  '9.0 | 0 | 3.2e-06 (120 steps) |', text)
    self.assertIn('| b.B | 31.0 | 10.0 | 8.0 | 3 |', text)
    self.assertIn('| a.A | [2, 2] -> [3, 1] | 200.0 | 125.0 | 120.0 | 210.0 '
                  '| 130.0 | 100.0 |', text)
    with open(os.path.join(out, 'e.json')) as f:
      result = json.load(f)
    self.assertEqual(['a.A', 'b.B'], [r['model'] for r in result['results']])
    self.assertEqual(4, result['results'][0]['loss_and_return']['shrink_redone'])
    with open(os.path.join(out, 'e.png'), 'rb') as f:
      self.assertEqual(b'\x89PNG', f.read(4))

  def testTheBenchmarksOverrideGoesToEveryRunBeforeARunsOwn(self):
    # pylint: disable=protected-access
    args = cli._Parser().parse_args(
        ['elastic', '--model_params_override', 'task.dtype=float64'])
    self.assertEqual('--model_params_override=task.dtype=float64',
                     elastic._CommonFlags('toy.X', '/l', args)[-1])
    self.assertEqual(['--model_params_override=task.dtype=float64; a.b=1'],
                     elastic._Override(args, 'a.b=1'))
    args = cli._Parser().parse_args(['elastic'])
    self.assertEqual([], elastic._Override(args))
    self.assertEqual(['--model_params_override=a.b=1'],
                     elastic._Override(args, 'a.b=1'))

  def testAFailedRunIsReportedAndTheOthersStillAre(self):
    def Failed(model, args, workdir):
      raise elastic.ElasticBenchmarkError('the trainer failed (exit 1):\n'
                                          'trainer: error: no such param')

    restart = dict(startup_secs=31.0, secs=8.0, redone=3,
                   kill_to_first_step=10.0)
    stdout = io.StringIO()
    with mock.patch.object(elastic, 'LossAndReturn', Failed), \
        mock.patch.object(elastic, 'Restart', lambda *a: restart), \
        contextlib.redirect_stdout(stdout):
      cli.main(['elastic', '--models', 'a.A', '--scenarios',
                'loss_and_return,restart'])
    text = stdout.getvalue()
    self.assertIn('| a.A | 31.0 | 10.0 | 8.0 | 3 |', text)
    self.assertIn('a.A: loss_and_return failed: trainer: error: no such param',
                  text)

  def testShapeFlagsAndWorkersAreChecked(self):
    for argv, error in (
        (['--workers', '1'], '--workers=1: a run that loses a worker needs 2'),
        (['--shape_flags=--model_params_override=x=1'],
         '--shape_flags may not set --model_params_override')):
      with self.assertRaisesRegex(elastic.ElasticBenchmarkError, error):
        elastic.Elastic(cli._Parser().parse_args(['elastic'] + argv))  # pylint: disable=protected-access

  def testQuickTrainsTheToyModelWithoutTheThrottledRun(self):
    # pylint: disable=protected-access
    args = cli._Parser().parse_args(['elastic', '--quick'])
    cli._ApplyQuick(args)
    self.assertEqual(('toy.PipelinedDigitsMlp', 'loss_and_return,restart'),
                     (args.models, args.scenarios))
    args = cli._Parser().parse_args(['elastic', '--quick', '--scenarios',
                                     'throttled'])
    cli._ApplyQuick(args)
    self.assertEqual('throttled', args.scenarios)


if __name__ == '__main__':
  tf.test.main()
