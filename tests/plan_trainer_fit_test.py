"""The fit of a profile's absolute times to traced reference runs."""

import os

from absl.testing import absltest
from gpipe.measure import timeline
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.plan import trainer_fit
from tests import plan_testlib
from tools.plan import trainer_step
from tools.trainer import timed_run

# How much a traced step slows every task down in these synthetic runs.
TRACE_SLOWDOWN = 1.3


def _Traced(truth, config):
  """The tasks of a traced step of `config` as `truth` runs it.

  A task's call cost is its dispatch, outside the traced task.
  """
  prediction = simulator.Predict(truth, config)
  tasks = []
  for replica in range(config.replicas):
    for dev, lane in enumerate(prediction.task_times):
      for task, start, end in lane:
        tasks.append(timeline.TaskTime(
            task.stage, task.micro_batch, task.phase,
            'worker%d' % (replica * config.devices_per_replica + dev),
            TRACE_SLOWDOWN * start,
            TRACE_SLOWDOWN * (end - truth.call_seconds),
            TRACE_SLOWDOWN * start))
  return sorted(tasks, key=lambda t: (t.start, t.stage))


def _References(truth, bare, devices):
  return [trainer_fit.Reference(c, simulator.Predict(truth, c).step_seconds,
                                _Traced(truth, c))
          for c in trainer_step.References(bare, devices)]


def _Profile(**fields):
  # Layers of unequal costs: the stages of a cut differ.
  profile = plan_testlib.UniformProfile(4, batch=8, **fields)
  layers = [l._replace(measurements=[m._replace(
      forward=m.forward * (1 + i), backward=m.backward * (2 + i),
      weight=m.weight * (3 - 0.5 * i)) for m in l.measurements])
            for i, l in enumerate(profile.layers)]
  return profile.Replace(layers=layers)


def _CallCostCase():
  """(bare profile, its truth with a call cost, the truth's 3 references)."""
  bare = _Profile()
  truth = bare.Replace(
      factors=(profile_lib.Factors(rows=4, F=2.0, B=3.0, W=1.5, BW=2.5,
                                   R=2.0),),
      call_seconds=0.4, trainer_seconds=0.75)
  return bare, truth, _References(truth, bare, 2)


class TrainerFitTest(absltest.TestCase):

  def testRecoversTaskTimesAndTheFixedCost(self):
    bare = _Profile(handover=profile_lib.Handover(0.01, 1e30))
    truth = bare.Replace(
        factors=(profile_lib.Factors(rows=4, F=2.0, B=3.0, W=1.5, BW=2.5,
                                     R=2.0),),
        handover=profile_lib.Handover(0.2, 1e30), trainer_seconds=0.75)
    refs = _References(truth, bare, 2)
    self.assertEqual([r.config.label for r in refs],
                     ['gpipe R=2 K=1 M=1 never', 'zb_h1 R=1 K=2 M=2 never',
                      'zb_v R=1 K=4 v=2 M=2 never'])
    # The traced factors carry the trace's slowdown; the scale removes it.
    traced = trainer_fit.TaskFactors(bare, refs)
    for kind, want in (('F', 2.0), ('B', 3.0), ('W', 1.5), ('BW', 2.5)):
      self.assertAlmostEqual(getattr(traced, kind), TRACE_SLOWDOWN * want,
                             places=6)
    fitted = trainer_fit.Fit(bare, refs)
    # Within a few hundredths of steps of tens of seconds.
    self.assertAlmostEqual(fitted.trainer_seconds, 0.75, delta=0.05)
    self.assertAlmostEqual(fitted.factors[0].F, 2.0, places=2)
    self.assertAlmostEqual(fitted.handover.latency, 0.2, places=2)
    self.assertEqual(fitted.contention, 1.0)
    # The references and configurations not run are predicted as truth.
    others = [
        simulator.Configuration(1, 2, (2, 2), 4, '1f1b', 'never'),
        simulator.Configuration(1, 2, (2, 2), 4, 'zb_h1', 'never'),
        simulator.Configuration(2, 1, (4,), 2, 'gpipe', 'never'),
    ]
    for c in [r.config for r in refs] + others:
      want = simulator.Predict(truth, c).step_seconds
      got = simulator.Predict(fitted, c).step_seconds
      self.assertAlmostEqual(got / want, 1.0, delta=0.05, msg=c.label)

  def testTheThirdReferenceGivesTheCostOfACall(self):
    bare, truth, refs = _CallCostCase()
    fitted = trainer_fit.Fit(bare, refs)
    # A waiting task's dispatch shows in the traced hand-over delays too:
    # the fit may share the call's cost with the hand-over's latency.
    self.assertGreater(fitted.call_seconds, 0.2)
    self.assertLessEqual(fitted.call_seconds, 0.45)
    for c in [r.config for r in refs] + [
        simulator.Configuration(1, 2, (2, 2), 4, '1f1b', 'never'),
        simulator.Configuration(1, 4, (1, 1, 1, 1), 2, 'zb_v', 'never',
                                stages_per_device=2),
        simulator.Configuration(2, 1, (4,), 2, 'gpipe', 'never')]:
      want = simulator.Predict(truth, c).step_seconds
      got = simulator.Predict(fitted, c).step_seconds
      self.assertAlmostEqual(got / want, 1.0, delta=0.05, msg=c.label)
    # Two references: no call cost is fitted.
    self.assertEqual(trainer_fit.Fit(bare, refs[:2]).call_seconds, 0.0)

  def testOneUntracedReferenceGivesTheFixedCostAlone(self):
    bare = _Profile()
    config = trainer_step.References(bare, 1)[0]
    seconds = simulator.Predict(bare, config).step_seconds + 0.4
    fitted = trainer_fit.Fit(bare, [trainer_fit.Reference(config, seconds,
                                                          [])])
    self.assertEqual(fitted.factors, ())
    self.assertAlmostEqual(fitted.trainer_seconds, 0.4)

  def testScaleStaysWithinItsBounds(self):
    bare = _Profile()
    truth = bare.Replace(factors=(profile_lib.Factors(
        rows=4, F=1.0, B=1.0, W=1.0, BW=1.0, R=1.0),))
    refs = _References(truth, bare, 2)
    # A first reference far slower than any scale explains.
    wild = [refs[0]._replace(seconds=refs[0].seconds * 100), refs[1]]
    scale, _, _ = trainer_fit.FitScale(trainer_fit.Fit(bare, refs), wild)
    self.assertBetween(scale, trainer_fit.MIN_SCALE, trainer_fit.MAX_SCALE)

  def testTheRecordOfTheReferencesIsWhatTheSearchMeasures(self):
    bare, truth, refs = _CallCostCase()
    # The data-parallel reference ran 30% slower than its truth (a loaded
    # machine): the fit cannot match every reference.
    refs[0] = refs[0]._replace(seconds=1.3 * refs[0].seconds)
    fitted = trainer_fit.Fit(bare, refs)
    error = trainer_fit.FitError(fitted, refs)
    want = max(abs(simulator.Predict(fitted, r.config).step_seconds /
                   r.seconds - 1) for r in refs)
    self.assertAlmostEqual(error, want)
    self.assertGreater(error, 0.02)
    # The first ran twice (the second counted), the others once.
    refs[0] = refs[0]._replace(runs=(1.5 * refs[0].seconds, refs[0].seconds))
    record = trainer_fit.ReferenceRecord(bare, fitted, refs, 2)
    self.assertEqual(record['configs'], [r.config.label for r in refs])
    self.assertEqual(record['runs'], [[1.5 * refs[0].seconds,
                                       refs[0].seconds]] +
                     [[r.seconds] for r in refs[1:]])
    self.assertEqual(record['own_error'], error)
    # Each reference predicted by a fit to the others: the slow one is
    # missed by about its 30%.
    loo = trainer_fit.LeaveOneOutError(bare, refs)
    self.assertEqual(record['fit_error'], max(error, loo))
    self.assertBetween(loo, 0.15, 0.45)
    error = record['fit_error']
    # Through a saved profile, as the trainer's --plan=auto reads it.
    path = self.create_tempfile().full_path
    profile_lib.Save(fitted.Replace(trainer_reference=record), path)
    loaded = profile_lib.Load(path)
    self.assertEqual(loaded.trainer_reference['runs'], record['runs'])
    steps, got_error = search.Measured(loaded)
    self.assertEqual(steps, {r.config: r.seconds for r in refs})
    self.assertEqual(got_error, error)
    result = search.Search(loaded, 2, None, max_micro_batches=2)
    measured = {c.config: c.prediction.step_seconds
                for c in result.candidates if c.measured}
    self.assertEqual(measured, steps)
    # A perfect fit has no error.
    exact = [trainer_fit.Reference(r.config, simulator.Predict(
        fitted, r.config).step_seconds, r.tasks) for r in refs]
    self.assertAlmostEqual(trainer_fit.FitError(fitted, exact), 0.0)

  def testThreeReferencesFitThemselvesButNotOneLeftOut(self):
    bare, truth, refs = _CallCostCase()
    # Consistent references: each is predicted well by the others.
    self.assertLess(trainer_fit.LeaveOneOutError(bare, refs), 0.06)
    # The looped one runs 40% slower than any cost of a call explains when
    # left out: three unknowns still fit the three, not it alone.
    refs[2] = refs[2]._replace(seconds=1.4 * refs[2].seconds)
    fitted = trainer_fit.Fit(bare, refs)
    own = trainer_fit.FitError(fitted, refs)
    self.assertLess(own, 0.1)
    self.assertGreater(trainer_fit.LeaveOneOutError(bare, refs), 2 * own)
    self.assertGreater(trainer_fit.LeaveOneOutError(bare, refs), 0.2)
    # One reference: nothing to leave out.
    self.assertEqual(trainer_fit.LeaveOneOutError(bare, refs[:1]), 0.0)

  def testChromeTraceRoundTrip(self):
    tasks = [timeline.TaskTime(0, 0, 'F', '/job:w/task:0', 0.0, 0.5, 0.0),
             timeline.TaskTime(1, 0, 'B', '/job:w/task:1', 0.5, 1.25, 0.75)]
    path = self.create_tempfile().full_path
    timeline.WriteChromeTrace(tasks, path)
    got = timeline.ReadChromeTrace(path)
    self.assertLen(got, 2)
    for a, b in zip(got, tasks):
      self.assertEqual(a[:4], b[:4])
      for x, y in zip(a[4:], b[4:]):
        self.assertAlmostEqual(x, y)


class _FakeRuns:
  """timed_run.TrainerRuns' part Measure uses: per plan file, a step.

  Each run of a plan has its next median step from `steps[path's index]`;
  the traced tasks name the run.
  """

  def __init__(self, steps, second_round_fails=False):
    self.steps = steps
    self.sent = []
    self.seen = {}
    # As TrainerRuns.Run when the second round failed: the first's runs.
    self.second_round_fails = second_round_fails

  def _Results(self, plan_paths):
    out = []
    for path in plan_paths:
      i = int(os.path.basename(path)[len('reference_'):-len('.json')])
      run = self.seen.get(i, 0)
      self.seen[i] = run + 1
      s = self.steps[i][run]
      out.append(([0.9 * s, 1.3 * s, s], ['run %d of %d' % (run, i)]))
    return out

  def Run(self, plan_paths, batch, timeout=None, log=None, intervals=None,
          again=None):
    del batch, timeout, log
    paths, intervals = list(plan_paths), list(intervals)
    out = self._Results(paths)
    if again:
      more = again(out)
      paths += [paths[k] for k in more]
      intervals += [intervals[k] for k in more]
      second = self._Results(paths[len(plan_paths):])
      if not self.second_round_fails:
        out += second
    self.sent.append((paths, intervals))
    return out


class MeasureTest(absltest.TestCase):
  """trainer_step.Measure's runs: a model of short steps runs each again."""

  def _Measure(self, profile, steps, second_round_fails=False, **kwargs):
    runs = _FakeRuns(steps, second_round_fails)
    started = trainer_step.Started('toy', runs, self.create_tempdir().full_path,
                                   trainer_step.TIMED_STEPS)
    return runs, trainer_step.Measure(started, profile, 2, **kwargs)

  def _Names(self, runs):
    (paths, _), = runs.sent
    return [int(os.path.basename(p)[len('reference_'):-len('.json')])
            for p in paths]

  def testShortStepsRunAgainAfterTheOthersAndTheFastestRunCounts(self):
    # Layers of 0.1 ms: every reference's step is a few milliseconds.
    profile = _Profile(forward=1e-4, backward=1e-4, weight=1e-4)
    logged = []
    runs, refs = self._Measure(profile, [[5e-3, 4e-3], [6e-3, 7e-3],
                                         [3e-3, 3e-3]], log=logged.append)
    self.assertEqual(self._Names(runs), [0, 1, 2, 0, 1, 2])
    intervals = runs.sent[0][1]
    self.assertEqual(intervals[:3], intervals[3:])
    self.assertTrue(all(n > timed_run.LOG_EVERY for n in intervals))
    # The fastest run's median and its own traced step (a tie: the first).
    self.assertEqual([r.seconds for r in refs], [4e-3, 6e-3, 3e-3])
    self.assertEqual([r.tasks for r in refs],
                     [['run 1 of 0'], ['run 0 of 1'], ['run 0 of 2']])
    self.assertEqual([r.config for r in refs],
                     trainer_step.References(profile, 2))
    self.assertIn("the trainer's step of %s in 2 runs: 5.0, 4.0 ms (run 2, "
                  'the fastest, counts)' % refs[0].config.label, logged)
    # Each run's step is kept, for the profile's record.
    self.assertEqual([r.runs for r in refs],
                     [(5e-3, 4e-3), (6e-3, 7e-3), (3e-3, 3e-3)])
    # Three runs: round after round.
    runs, refs = self._Measure(profile, [[5e-3, 4e-3, 2e-3], [6e-3] * 3,
                                         [3e-3, 1e-3, 3e-3]],
                               short_step_runs=3)
    self.assertEqual(self._Names(runs), [0, 1, 2] * 3)
    self.assertEqual([r.seconds for r in refs], [2e-3, 6e-3, 1e-3])
    self.assertEqual([r.tasks for r in refs],
                     [['run 2 of 0'], ['run 0 of 1'], ['run 1 of 2']])
    # Once each when asked; fewer than one is refused.
    runs, refs = self._Measure(profile, [[5e-3], [6e-3], [3e-3]],
                               short_step_runs=1)
    self.assertEqual(self._Names(runs), [0, 1, 2])
    self.assertEqual([r.seconds for r in refs], [5e-3, 6e-3, 3e-3])
    self.assertEqual([r.runs for r in refs], [(), (), ()])
    with self.assertRaisesRegex(ValueError, 'at least once'):
      self._Measure(profile, [[5e-3], [6e-3], [3e-3]], short_step_runs=0)

  def testAFailedSecondRoundLeavesTheFirstRoundsRuns(self):
    profile = _Profile(forward=1e-4, backward=1e-4, weight=1e-4)
    runs, refs = self._Measure(profile, [[5e-3, 4e-3], [6e-3, 7e-3],
                                         [3e-3, 2e-3]],
                               second_round_fails=True)
    self.assertEqual(self._Names(runs), [0, 1, 2, 0, 1, 2])
    self.assertEqual([r.seconds for r in refs], [5e-3, 6e-3, 3e-3])
    self.assertEqual([r.tasks for r in refs],
                     [['run 0 of 0'], ['run 0 of 1'], ['run 0 of 2']])
    self.assertEqual([r.runs for r in refs], [(), (), ()])

  def testOneShortReferenceRunsEveryReferenceAgain(self):
    # Layers of a second (steps predicted far above 50 ms), but the
    # data-parallel reference took 40 ms in the trainer.
    runs, refs = self._Measure(_Profile(), [[4e-2, 3e-2], [6e-2, 7e-2],
                                            [8e-2, 9e-2]])
    self.assertEqual(self._Names(runs), [0, 1, 2, 0, 1, 2])
    self.assertEqual([r.seconds for r in refs], [3e-2, 6e-2, 8e-2])

  def testLongStepsRunOnceEvenWhenTheLayersPredictShortOnes(self):
    # Layers of 0.1 ms (the layers alone predict a few milliseconds), but
    # the trainer's steps took 80 ms and more (its own part): no repeat,
    # as for the default model.
    logged = []
    profile = _Profile(forward=1e-4, backward=1e-4, weight=1e-4)
    runs, refs = self._Measure(profile, [[8e-2], [9e-2], [1e-1]],
                               log=logged.append)
    self.assertEqual(self._Names(runs), [0, 1, 2])
    self.assertEqual([r.seconds for r in refs], [8e-2, 9e-2, 1e-1])
    self.assertFalse([l for l in logged if ' runs' in l], logged)
    # Layers of a second: steps far above 50 ms, each timed over LOG_EVERY.
    runs, refs = self._Measure(_Profile(), [[2.0], [3.0], [4.0]])
    self.assertEqual(self._Names(runs), [0, 1, 2])
    self.assertEqual(runs.sent[0][1], [timed_run.LOG_EVERY] * 3)
    self.assertEqual([r.seconds for r in refs], [2.0, 3.0, 4.0])

if __name__ == '__main__':
  absltest.main()
