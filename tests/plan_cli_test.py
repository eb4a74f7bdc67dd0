"""python -m tools.plan: on a saved profile (the table, the plan, errors), and
measuring a registered model through traced runs of the trainer."""

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
from gpipe.plan import choice
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from tests import plan_testlib
from tools.plan import cli
from gpipe.plan import profiling
from tools.plan import trainer_step
from tools.trainer import timed_run

MIB = float(1 << 20)


def _Main(*args):
  """(exit status, stdout, stderr) of the planner with `args`."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(list(args))
  return code, out.getvalue(), err.getvalue()


class PlanCliTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.profile = os.path.join(self.dir, 'profile.json')
    profile_lib.Save(plan_testlib.UniformProfile(
        8, batch=64, forward=0.01, backward=0.01, weight=0.01,
        activation=4 * MIB, boundary=0.5 * MIB, weight_bytes=2 * MIB,
        temporary=0.5 * MIB, param_bytes=2 * MIB, call_seconds=1e-4,
        memory_bandwidth=5e9, update_traffic=3.0, step_seconds=1e-3),
                     self.profile)

  def testPlansFromASavedProfile(self):
    plan_path = os.path.join(self.dir, 'plan.json')
    json_path = os.path.join(self.dir, 'search.json')
    code, out, _ = _Main('--profile', self.profile, '--devices', '2',
                         '--memory_per_device', '64MiB', '--top', '3',
                         '--max_micro_batches', '8', '--plan_out', plan_path,
                         '--json', json_path)
    self.assertEqual(code, 0)
    self.assertIn('Plan for uniform on 2 device(s), 64.0 MiB each', out)
    plan = choice.Load(plan_path)
    self.assertIn('Best: %s' % plan.Describe(), out)
    with open(json_path) as f:
      result = json.load(f)
    self.assertLen(result['candidates'], 3)
    self.assertEqual(result['candidates'][0]['label'], plan.config.label)
    self.assertIn('does not fit the memory cap', result['dropped_by_reason'])
    # The trainer's update reads every gradient first: the conservative
    # rule, said under the table.
    self.assertEqual(result['update'], 'all_gradients')
    self.assertIn("keeps each stage's gradient sum to the end of the step",
                  out)

  def testMeasuresAModelThroughTracedTrainerRuns(self):
    path = os.path.join(self.dir, 'measured.json')
    trainer_runs = []
    layer_runs = []
    real_run = timed_run.TrainerRuns.Run
    real_one = profiling._MeasureOne

    def CountedRun(runs, plan_paths, *args, **kwargs):
      result = real_run(runs, plan_paths, *args, **kwargs)
      trainer_runs.append((len(plan_paths), len(result)))
      return result

    def CountedOne(*args, **kwargs):
      layer_runs.append(args[2])  # The rows.
      return real_one(*args, **kwargs)

    with mock.patch.object(timed_run.TrainerRuns, 'Run', CountedRun), \
        mock.patch.object(profiling, '_MeasureOne', CountedOne):
      code, out, err = _Main('--model', 'toy.PipelinedDigitsMlp',
                             '--rows', '8', '--repeats', '1',
                             '--profile_out', path, '--devices', '2',
                             '--max_micro_batches', '4')
    self.assertEqual(code, 0, err)
    self.assertIn('Best: ', out)
    profile = profile_lib.Load(path)
    self.assertGreater(profile.num_layers, 1)
    # The planner's budget, counted: each layer once per size (equal layers
    # once), three traced trainer runs in one trainer process and, the
    # toy's steps being a few milliseconds, each again after them, no
    # separate calibration.
    self.assertLessEqual(len(layer_runs), profile.num_layers)
    self.assertEqual(trainer_runs, [(3, 6)])
    self.assertRegex(err, r'the fastest reference took [\d.]+ ms a step, '
                     r'under 50 ms: each runs 2 times')
    self.assertIn('6 trainer runs in one process took', err)
    # The first (data-parallel) reference's graph was built while the
    # layers were measured, and its run took it; the others built theirs.
    self.assertIn('%s 1 ahead in' % timed_run.BUILT_AHEAD_LINE, err)
    self.assertIn('%s: kept the training graph built ahead' %
                  (timed_run.PLAN_MARKER % 1), err)
    for i in range(2, 7):
      self.assertIn('%s: built the training graph in' %
                    (timed_run.PLAN_MARKER % i), err)
    # Each reference's step is the faster of its two runs' medians.
    runs = re.findall(r"the trainer's step of (.*) in 2 runs: ([\d.]+), "
                      r"([\d.]+) ms \(run [12], the fastest, counts\)", err)
    self.assertLen(runs, 3, err)
    self.assertNotIn('calibrat', err)
    # The trainer's own step, timed data-parallel and pipelined over the
    # two devices (split backward); the task factors come from their
    # traced steps, at their micro-batch size.
    measured = re.findall(r"the trainer's step of (.*): ([\d.]+) ms", err)
    self.assertEqual([label for label, _ in measured],
                     ['gpipe R=2 K=1 M=1 never', 'zb_h1 R=1 K=2 M=2 never',
                      'zb_v R=1 K=4 v=2 M=2 never'],
                     err)
    self.assertEqual([label for label, _, _ in runs],
                     [label for label, _ in measured])
    for (_, a, b), (_, ms) in zip(runs, measured):
      self.assertAlmostEqual(float(ms), min(float(a), float(b)), delta=0.051)
    self.assertEqual([c.label for c in trainer_step.References(profile, 2)],
                     profile.trainer_reference['configs'])
    # Timed with the trainer's defaults: Lingvo's norms built with Square.
    self.assertIs(profile.trainer_reference['square_norms'], True)
    self.assertEqual([f.rows for f in profile.factors], [profile.batch // 2])
    self.assertEqual(profile.update_factor, 1.0)
    # The search predicts the references by their measured steps; the pick
    # says so when it is one of them.
    steps, _ = search.Measured(profile)
    self.assertEqual(sorted(round(1e3 * s, 1) for s in steps.values()),
                     sorted(float(ms) for _, ms in measured))
    result = search.Search(profile, 2, None, max_micro_batches=4)
    self.assertEqual(sum(c.measured for c in result.candidates), 3)
    self.assertIn('| trainer |', out)
    if result.best.measured:
      self.assertIn('as measured through the trainer while planning', out)

  def testAProfileTimedBeforeSquareNormsIsNoted(self):
    profile = profile_lib.Load(self.profile)
    reference = dict(configs=[], devices=2, seconds=[], measured=[],
                     fit_error=0.0, own_error=0.0)
    for record, noted in ((reference, True),
                          (dict(reference, square_norms=True), False)):
      path = os.path.join(self.dir, 'timed.json')
      profile_lib.Save(profile.Replace(trainer_reference=record), path)
      code, _, err = _Main('--profile', path, '--devices', '2')
      self.assertEqual(code, 0, err)
      self.assertEqual("built Lingvo's norms with Square ops" in err, noted,
                       err)

  def testACapBelowTheWeightsIsRefusedBeforeMeasuring(self):
    # The toy's 13,130 float32 weights (52,520 bytes) over 2 devices, x (1 +
    # Adam's 2 slots): counted from its built variables, nothing timed.
    with mock.patch.object(cli.local_cluster, 'LocalCluster',
                           side_effect=AssertionError('measured')):
      code, out, err = _Main('--model', 'toy.PipelinedDigitsMlp',
                             '--devices', '2', '--memory_per_device', '1KiB')
    self.assertEqual(code, 1, err)
    self.assertIn(
        'plan: error: --memory_per_device=1.0 KiB (972 B after the 5% '
        'headroom) cannot hold the weights and optimizer slots alone: they '
        'need at least 76.9 KiB (78780 bytes) on a device (51.3 KiB of '
        'weights over 2 device(s) at best, x (1 + 2 optimizer slot(s))), '
        'before any gradient or activation. Give --memory_per_device well '
        'above 81.0 KiB, or plan for more devices', err)
    self.assertEqual(out, '')

  def testErrorsSayWhatToDo(self):
    code, _, err = _Main('--devices', '2')
    self.assertEqual(code, 1)
    self.assertIn('give --model (to measure it) or --profile', err)
    # Above the weights' 8 MiB per device, below weights and gradients.
    code, out, _ = _Main('--profile', self.profile, '--memory_per_device',
                         '12MiB', '--max_micro_batches', '2')
    self.assertEqual(code, 1)
    self.assertIn('Nothing fits', out)
    # Below the weights alone: said without a search.
    code, out, err = _Main('--profile', self.profile, '--memory_per_device',
                           '1MiB')
    self.assertEqual(code, 1)
    self.assertIn('--memory_per_device=1.0 MiB (972.8 KiB after the 5% '
                  'headroom) cannot hold the weights and optimizer slots '
                  'alone: they need at least 8.0 MiB (8388608 bytes) on a '
                  'device (16.0 MiB of weights over 2 device(s) at best', err)
    self.assertNotIn('Plan for', out)
    code, _, err = _Main('--profile', self.profile, '--memory_per_device',
                         'lots')
    self.assertEqual(code, 1)
    self.assertIn("'lots' is not a memory size", err)
    code, _, err = _Main('--profile', os.path.join(self.dir, 'none.json'))
    self.assertEqual(code, 1)
    self.assertIn('cannot read the profile', err)


# A stand-in for timed_run's child: per stdin line (plan, steps, interval), its
# marker, a progress line per interval at the plan's rate (its file's name,
# plus 3 per run before it), its end; a plan named 0 fails, one named 999
# hangs after the first run. %s: what it does before the first run.
_FAKE_CHILD = """
import os, sys, time
%s
for i, line in enumerate(sys.stdin, 1):
  path, steps, every = line.split('\\t')
  print('timed_run: plan %%d' %% i, flush=True)
  rate = int(os.path.basename(path)[:-len('.json')])
  if not rate:
    print('bad plan', flush=True)
    sys.exit(3)
  if rate == 999 and i > 1:
    time.sleep(600)
  for step in range(int(every), int(steps) + 1, int(every)):
    print('step %%d/%%s loss 1.0, %%.1f examples/s' %% (
        step, steps, rate + 3 * (i - 1)), flush=True)
  print('timed_run: plan %%d ended' %% i, flush=True)
"""


class TrainerRunsTest(absltest.TestCase):
  """The planner's reference runs: one trainer process, the same workers."""

  def testEachPlansOutputIsSplitOut(self):
    output = '\n'.join(['importing', timed_run.PLAN_MARKER % 1, 'a1', 'a2',
                         timed_run.PLAN_MARKER % 2, 'b1', ''])
    self.assertEqual(timed_run.SplitByPlan(output, 3),
                     ['a1\na2\n', 'b1\n', ''])
    # '-': the plans come on stdin, one a line, read as they are needed.
    self.assertEqual(list(timed_run._Plans(['-'], io.StringIO(
        'a.json\n\nb.json\n'))), ['a.json', 'b.json'])
    self.assertEqual(list(timed_run._Plans(['a.json', 'b.json'], None)),
                     ['a.json', 'b.json'])
    # A line may give the run's steps and its logging period.
    self.assertEqual(timed_run._PlanLine('a.json\t64\t16'), ('a.json', 64, 16))
    self.assertEqual(timed_run._PlanLine('a.json'), ('a.json', None, None))

  def _Runs(self, fake_child):
    """A TrainerRuns whose child is `fake_child` (Python source)."""
    logdir = self.create_tempdir().full_path
    return timed_run.TrainerRuns(
        'toy', 2, 4, 8, logdir,
        command=[sys.executable, '-c', _FAKE_CHILD % fake_child])

  def testASecondRoundIsAskedForOnceTheFirstEnded(self):
    seen = []

    def Again(first):
      # Called once, after both first runs ended: ask for 1 and 0 again.
      seen.append([round(4.0 / s[0], 1) for s, _ in first])
      return [1, 0]

    with self._Runs('') as runs:
      out = runs.Run(['/p/10.json', '/p/20.json'], batch=4, timeout=60,
                     intervals=[4, 8], again=Again)
    self.assertEqual(seen, [[10.0, 23.0]])
    # Runs in order: the two, then 1 and 0 again (each its plan's rate, 3
    # added per run before it).
    self.assertEqual([round(4.0 / s[0], 1) for s, _ in out],
                     [10.0, 23.0, 26.0, 19.0])
    self.assertEqual([len(s) for s, _ in out], [2, 2, 2, 2])

  def testAChildEndingAfterItsFirstRoundIsAskedNothingMore(self):
    # Its last run printed its steps, then it exited 5 without its end
    # marker: said as a failure after the runs, no second round.
    ended = _FAKE_CHILD.replace(
        "  print('timed_run: plan %%d ended' %% i, flush=True)",
        "  sys.exit(5)")
    again = mock.Mock(return_value=[0])
    logdir = self.create_tempdir().full_path
    with timed_run.TrainerRuns('toy', 2, 4, 8, logdir, command=[
        sys.executable, '-c', ended % '']) as runs:
      with self.assertRaisesRegex(timed_run.TimedRunError,
                                  r'failed before its run 1 \(of /p/10.json\) '
                                  r'ended \(exit status 5\)'):
        runs.Run(['/p/10.json'], batch=4, timeout=60, again=again)
    again.assert_not_called()

  def testAFailedFirstRoundIsSaidAndNoSecondIsAskedFor(self):
    again = mock.Mock(return_value=[0])
    with self._Runs('') as runs:
      with self.assertRaisesRegex(timed_run.TimedRunError,
                                  r'failed with /p/0.json \(exit status 3\)'
                                  r': bad plan'):
        runs.Run(['/p/10.json', '/p/0.json'], batch=4, timeout=60,
                 again=again)
    again.assert_not_called()

  def _Variant(self, old, new):
    """_FAKE_CHILD with `old` replaced by `new` (which must be there)."""
    variant = _FAKE_CHILD.replace(old, new)
    self.assertNotEqual(variant, _FAKE_CHILD)
    return variant

  def _Rates(self, child, plans, again):
    """Each run's rate from a stand-in `child` (source) of `plans`; logs."""
    logged = []
    logdir = self.create_tempdir().full_path
    with timed_run.TrainerRuns('toy', 2, 4, 8, logdir, command=[
        sys.executable, '-c', child % '']) as runs:
      out = runs.Run(plans, batch=4, timeout=60, again=again,
                     log=logged.append)
    return [round(4.0 / s[0]) for s, _ in out], logged

  def testAFailedSecondRoundKeepsTheFirstRoundsRuns(self):
    # Plan 999 exits 4 in the second round, after its marker.
    failing = self._Variant('    time.sleep(600)\n', '    sys.exit(4)\n')
    rates, logged = self._Rates(failing, ['/p/999.json', '/p/20.json'],
                                lambda r: [0, 1])
    self.assertEqual(rates, [999, 23])
    self.assertLen(logged, 1)
    self.assertRegex(logged[0], r"the first round's runs count: the trainer "
                     r'failed with /p/999.json \(exit status 4\)')
    # Both rounds' runs ended, then the child failed: all of them count;
    # the same with one round.
    ended = self._Variant('for i, line in enumerate(sys.stdin, 1):',
                          'import atexit; atexit.register(lambda: os._exit(6))'
                          '\nfor i, line in enumerate(sys.stdin, 1):')
    rates, logged = self._Rates(ended, ['/p/10.json'], lambda r: [0])
    self.assertEqual(rates, [10, 13])
    self.assertRegex(logged[0], r'failed after all its runs ended; their '
                     r'runs count: .*exit status 6')
    rates, logged = self._Rates(ended, ['/p/10.json'], lambda r: [])
    self.assertEqual(rates, [10])
    self.assertRegex(logged[0], r'failed after all its runs ended')
    # A second-round run that logged its steps but did not end (the child
    # failed within it): the first round counts, not a run cut short.
    end = "  print('timed_run: plan %%d ended' %% i, flush=True)"
    cut = self._Variant(end, '  if i > 1:\n    sys.exit(7)\n' + end)
    rates, logged = self._Rates(cut, ['/p/10.json'], lambda r: [0])
    self.assertEqual(rates, [10])
    self.assertRegex(logged[0], r"the first round's runs count: the trainer "
                     r'failed before its run 2 \(of /p/10.json\) ended '
                     r'\(exit status 7\)')

  def testARoundPastItsTimeoutStopsTheChild(self):
    with self._Runs('time.sleep(600)') as runs:
      with self.assertRaisesRegex(
          timed_run.TimedRunError,
          r'did not finish its 1 run\(s\) of up to 12 steps \(of '
          r'/p/10.json\) in 1 s'):
        runs.Run(['/p/10.json'], batch=4, timeout=1, again=lambda r: [0])
      self.assertIsNotNone(runs._child.poll())
    # The second round: as long per run as the first (2 runs, 2 x 3 s);
    # past it, the child is stopped and the first round's run counts.
    logged = []
    with self._Runs('') as runs:
      started = time.time()
      out = runs.Run(['/p/999.json'], batch=4, timeout=3, intervals=[8],
                     again=lambda r: [0], log=logged.append)
      self.assertLess(time.time() - started, 30)
      self.assertIsNotNone(runs._child.poll())
    self.assertEqual([round(4.0 / s[0]) for s, _ in out], [999])
    self.assertLen(logged, 1)
    self.assertRegex(logged[0], r'the second round of trainer runs failed; '
                     r"the first round's runs count: the trainer did not "
                     r'finish its 2 run\(s\) of up to 24 steps \(of '
                     r'/p/999.json\) in 6 s')

  def testNoSecondRoundOrAMarkerAfterOtherOutputEndsTheRun(self):
    # A library's line without its newline before each marker; no second
    # round.
    glued = _FAKE_CHILD.replace(
        "  print('timed_run: plan %%d ended'",
        "  print('W0000 partial', end='', flush=True)\n"
        "  print('timed_run: plan %%d ended'").replace(
            "  print('timed_run: plan %%d' %% i, flush=True)",
            "  print('I0000 partial', end='', flush=True)\n"
            "  print('timed_run: plan %%d' %% i, flush=True)")
    logdir = self.create_tempdir().full_path
    with timed_run.TrainerRuns('toy', 2, 4, 8, logdir, command=[
        sys.executable, '-c', glued % '']) as runs:
      out = runs.Run(['/p/10.json'], batch=4, timeout=60,
                     again=lambda r: [])
    self.assertEqual([round(4.0 / s[0], 1) for s, _ in out], [10.0])

  def testAStepOfAFewMillisecondsIsTimedOverLongerIntervals(self):
    # 60 ms: four steps; 5 ms: 0.2 s of steps, whole multiples of four;
    # never more than 128.
    self.assertEqual(timed_run.IntervalSteps(0.06), 4)
    self.assertEqual(timed_run.IntervalSteps(0.027), 8)
    self.assertEqual(timed_run.IntervalSteps(0.005), 40)
    self.assertEqual(timed_run.IntervalSteps(0.0025), 80)
    self.assertEqual(timed_run.IntervalSteps(1e-5), 128)
    # The benchmark's longer intervals: 0.5 s of a 4 ms step.
    self.assertEqual(timed_run.IntervalSteps(0.004, 0.5), 128)
    self.assertEqual(timed_run.IntervalSteps(0.022, 0.5), 24)

  def testAPlacementOnGivenWorkersLeavesThemRunning(self):
    from tools.trainer import placement as placement_lib  # pylint: disable=g-import-not-at-top
    workers = mock.Mock(num_workers=2, target='grpc://localhost:1',
                        task_devices=[
                            ['/job:worker/replica:0/task:%d/device:CPU:0' % i]
                            for i in range(2)])
    placement = placement_lib.Placement(2, worker_processes=2,
                                        pin_cores=True, workers=workers)
    self.assertIs(placement.cluster, workers)
    self.assertEqual(placement.target, 'grpc://localhost:1')
    self.assertLen(placement.devices, 2)
    placement.Stop()
    workers.Stop.assert_not_called()
    with self.assertRaisesRegex(placement_lib.WorkerRestartError,
                                'only restart local worker processes it '
                                'started'):
      placement.Restart()
    with self.assertRaisesRegex(ValueError, '2 running local workers given '
                                'for a run of 4'):
      placement_lib.Placement(4, worker_processes=4, workers=workers)


if __name__ == '__main__':
  absltest.main()
