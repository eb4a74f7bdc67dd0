"""The planner's search, its table and plan files (pure Python, quick)."""

import os
import tempfile

from absl.testing import absltest
from gpipe import pipeline
from gpipe.plan import choice
from gpipe.plan import search
from gpipe.plan import simulator
from tests import plan_testlib

UniformProfile = plan_testlib.UniformProfile
MIB = float(1 << 20)


def _Profile(**fields):
  """8 equal layers, batch 64, sizes like a small Transformer stack's."""
  values = dict(forward=0.01, backward=0.01, weight=0.01, activation=4 * MIB,
                boundary=0.5 * MIB, weight_bytes=2 * MIB, temporary=0.5 * MIB,
                param_bytes=2 * MIB, call_seconds=1e-4,
                memory_bandwidth=5e9, update_traffic=3.0, step_seconds=1e-3,
                optimizer_slots=0)
  values.update(fields)
  return UniformProfile(8, batch=64, **values)


class SearchTest(absltest.TestCase):

  def testRanksByPredictedSpeedAndGivesReasons(self):
    profile = _Profile()
    result = search.Search(profile, 2, 64 * MIB, max_micro_batches=8)
    speeds = [c.prediction.examples_per_second for c in result.candidates]
    self.assertEqual(speeds, sorted(speeds, reverse=True))
    self.assertIs(result.best, result.candidates[0])
    self.assertEqual(result.best.config.num_devices, 2)
    for c in result.candidates:
      self.assertTrue(c.prediction.Fits(0.95 * 64 * MIB), c.config.label)
    kinds = {c.reason[0] for c in result.dropped}
    self.assertEqual(kinds, {search.NOT_ALLOWED, search.DOES_NOT_FIT})
    for c in result.dropped:
      if c.reason[0] == search.DOES_NOT_FIT:
        self.assertFalse(c.prediction.Fits(64 * MIB))
        self.assertRegex(c.reason[1], r'needs [\d.]+ MiB on device \d, '
                         r'over 60.8 MiB \(the cap less 5% headroom\)')
      else:
        self.assertIsNone(c.prediction)
    one_f_one_b = [c for c in result.dropped
                   if c.config.schedule == '1f1b' and
                   c.config.micro_batches < c.config.num_stages]
    self.assertNotEmpty(one_f_one_b)
    self.assertIn('needs at least as many micro-batches as stages',
                  one_f_one_b[0].reason[1])
    table = search.Table(result, top=3)
    self.assertIn('configurations fit', table)
    self.assertIn('| 1 | %s |' % result.best.config.schedule, table)
    self.assertIn('%d %s' % (len([c for c in result.dropped
                                  if c.reason[0] == search.DOES_NOT_FIT]),
                             search.DOES_NOT_FIT), table)

  def testEquivalentConfigurationsAreTriedOnce(self):
    configs = search.Configurations(_Profile(), 2, max_micro_batches=4)
    labels = [c.label for c in configs]
    self.assertLen(set(labels), len(labels))
    for c in configs:
      if c.num_stages == 1:
        self.assertEqual(c.schedule, 'gpipe')
        self.assertNotEqual(c.remat, 'except_last')
      if c.micro_batches == 1:
        self.assertFalse(c.batched_weights)
      self.assertEqual(sum(c.stage_sizes), 8)

  def testEveryConfigurationUsesEveryDevice(self):
    # The trainer's layout uses every device it has (R x D = N, or a
    # LayoutError): a plan on fewer would be refused after the measuring.
    # tests/layout_test.py lays each out as the trainer does.
    self.assertEqual(search.DeviceShapes(1), [(1, 1)])
    self.assertEqual(search.DeviceShapes(2), [(1, 2), (2, 1)])
    self.assertEqual(search.DeviceShapes(3), [(1, 3), (3, 1)])
    self.assertEqual(search.DeviceShapes(4), [(1, 4), (2, 2), (4, 1)])
    self.assertEqual(search.DeviceShapes(8),
                     [(1, 8), (2, 4), (4, 2), (8, 1)])
    for n in (1, 2, 3, 4):
      configs = search.Configurations(_Profile(), n, max_micro_batches=2)
      self.assertNotEmpty(configs)
      self.assertEqual({c.num_devices for c in configs}, {n})

  def testACapBelowTheWeightsAloneIsRefusedWithTheBytes(self):
    layers = [2 * MIB] * 8  # 16 MiB of weights.
    # Spread over 4 devices at best, x (1 + 2 slots).
    self.assertEqual(search.WeightBytesPerDevice(layers, 2, 4), 12 * MIB)
    # A layer is never split.
    self.assertEqual(search.WeightBytesPerDevice(layers, 0, 16), 2 * MIB)
    search.CheckCapHoldsWeights(layers, 2, 4, 12 * MIB, headroom=0.0)
    search.CheckCapHoldsWeights(layers, 2, 4, None)
    with self.assertRaisesRegex(
        search.CapTooSmallError,
        r'--memory_per_device=12.0 MiB \(11.4 MiB after the 5% headroom\) '
        r'cannot hold the weights and optimizer slots alone: they need at '
        r'least 12.0 MiB \(12582912 bytes\) on a device \(16.0 MiB of '
        r'weights over 4 device\(s\) at best, x \(1 \+ 2 optimizer '
        r'slot\(s\)\)\), before any gradient or activation. Give '
        r'--memory_per_device well above 12.6 MiB, or plan for more devices'):
      search.CheckCapHoldsWeights(layers, 2, 4, 12 * MIB)
    with self.assertRaisesRegex(
        search.CapTooSmallError, r'\(the largest layer has 2.0 MiB of '
        r'weights, x \(1 \+ 0 optimizer slot\(s\)\)\).* well above 2.1 MiB$'):
      search.CheckCapHoldsWeights(layers, 0, 16, 1 * MIB)
    # Nothing under such a cap fits, as the search would have found.
    result = search.Search(_Profile(optimizer_slots=2), 4, 12 * MIB,
                           max_micro_batches=2)
    self.assertIsNone(result.best)

  def testHalfOfFillDrainsMemoryStillFits(self):
    profile = _Profile()
    need = simulator.Predict(profile, simulator.Configuration(
        1, 2, (4, 4), 8, 'gpipe', 'never')).peak_bytes
    result = search.Search(profile, 2, max(need) / 2)
    self.assertIsNotNone(result.best)
    best = result.best
    self.assertTrue(best.config.remat != 'never' or
                    best.config.schedule != 'gpipe', best.config.label)
    self.assertLessEqual(max(best.prediction.peak_bytes), max(need) / 2)

  def testTheUpdatesTimingIsPassedOn(self):
    # Looped fill-drain at M=1 with remat: freeing each stage's sum after
    # its last weight gradient needs less than keeping every sum to the
    # step's end.
    profile = _Profile()
    config = simulator.Configuration(1, 4, (2,) * 4, 1, 'gpipe', 'always',
                                     stages_per_device=2)
    kept = search.Evaluate(profile, config).prediction
    freed = search.Evaluate(
        profile, config,
        update=simulator.UPDATE_EACH_VARIABLE).prediction
    self.assertLess(max(freed.peak_bytes), max(kept.peak_bytes))
    cap = (max(freed.peak_bytes) + max(kept.peak_bytes)) / 2
    labels = {}
    for update in simulator.UPDATES:
      result = search.Search(profile, 2, cap, headroom=0.0, update=update,
                             schedules=['gpipe'], max_micro_batches=1)
      self.assertEqual(result.update, update)
      self.assertEqual(search.ToJson(result)['update'], update)
      labels[update] = {c.config.label for c in result.candidates}
    self.assertIn(config.label, labels[simulator.UPDATE_EACH_VARIABLE])
    self.assertNotIn(config.label, labels[simulator.UPDATE_ALL_GRADIENTS])
    self.assertEqual(search.Search(profile, 2, cap).update,
                     simulator.UPDATE_ALL_GRADIENTS)
    with self.assertRaisesRegex(ValueError, 'unknown update'):
      search.Search(profile, 2, cap, update='early')

  def testNothingFitsSaysWhatToDo(self):
    result = search.Search(_Profile(), 2, 1 * MIB)
    self.assertIsNone(result.best)
    self.assertIn('Nothing fits', search.Table(result))

  def testZeroBubbleAutoUsesTheMemoryTheCapLeaves(self):
    profile = _Profile(backward=0.02)  # B recomputes: room to fill.
    config = simulator.Configuration(1, 2, (4, 4), 16, 'zb_auto', 'always')
    roomy = search.Evaluate(profile, config, 1e12).prediction
    # A stage needs 8 MiB of weights, their sum and 16.5 MiB while a W
    # adds into it: 48 MiB leave room for about one micro-batch in flight.
    tight = search.Evaluate(profile, config, 48 * MIB).prediction
    self.assertGreater(max(roomy.task_costs['max_in_flight']),
                       max(tight.task_costs['max_in_flight']))
    self.assertLessEqual(roomy.step_seconds, tight.step_seconds)
    self.assertLessEqual(max(tight.peak_bytes), 48 * MIB)

  def testParseBytes(self):
    self.assertEqual(search.ParseBytes('16GiB'), 16 << 30)
    self.assertEqual(search.ParseBytes('256 MiB'), 256 << 20)
    self.assertEqual(search.ParseBytes('1.5GB'), 1500000000)
    self.assertEqual(search.ParseBytes('1000'), 1000)
    with self.assertRaisesRegex(ValueError, "'16 apples' is not a memory "
                                'size; write e.g. 16GiB'):
      search.ParseBytes('16 apples')


class PlanFileTest(absltest.TestCase):

  def testRoundTripAndApply(self):
    profile = _Profile(backward=0.02)
    result = search.Search(profile, 2, 64 * MIB, schedules=['zb_auto'],
                           max_micro_batches=8)
    plan = choice.FromCandidate(result.best, 2, 64 * MIB, profile.model)
    path = os.path.join(tempfile.mkdtemp(), 'plan.json')
    choice.Save(plan, path)
    loaded = choice.Load(path)
    self.assertEqual(loaded, plan)
    self.assertIn('predicted', loaded.Describe())
    p = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=[pipeline.PipeliningLayer.Params()] * 8,
        num_stages=1, micro_batch_size=4)
    choice.ApplyToPipeline(p, loaded)
    c = loaded.config
    self.assertEqual((p.num_stages, p.stage_sizes, p.num_micro_batches,
                      p.micro_batch_size, p.schedule, p.remat,
                      p.batched_weight_gradients),
                     (c.num_stages, list(c.stage_sizes), c.micro_batches,
                      None, 'zb_auto', c.remat, c.batched_weights))
    self.assertEqual(p.task_costs, plan.task_costs)
    self.assertIn('max_in_flight', p.task_costs)
    short = p.Copy().Set(layers=p.layers[:6])
    with self.assertRaisesRegex(ValueError, 'the plan cuts 8 layers .* but '
                                'the pipeline has 6: plan again'):
      choice.ApplyToPipeline(short, loaded)
    plan_testlib.AssertRefusesOtherFormats(self, choice.Load, path,
                                           'not a gpipe-plan-1 plan file')


class MeasuredTest(absltest.TestCase):
  """Configurations the planner ran through the trainer (search.Measured)."""

  def _WithMeasured(self, profile, steps, fit_error):
    """`profile` with `steps` ({Configuration: seconds}) measured."""
    return profile.Replace(trainer_reference=dict(
        configs=[c.label for c in steps], devices=2,
        seconds=list(steps.values()),
        measured=[[c.ToJson(), s] for c, s in steps.items()],
        fit_error=fit_error))

  def _Ranked(self, profile):
    return search.Search(profile, 2, None, max_micro_batches=4)

  def testAMeasuredStepReplacesThePrediction(self):
    profile = _Profile()
    plain = self._Ranked(profile)
    # The model's third best, measured at half the model's best step.
    third = plain.candidates[2]
    half = plain.best.prediction.step_seconds / 2
    result = self._Ranked(self._WithMeasured(profile, {third.config: half},
                                             0.1))
    self.assertEqual(result.best.config, third.config)
    self.assertTrue(result.best.measured)
    self.assertEqual(result.best.prediction.step_seconds, half)
    self.assertAlmostEqual(result.best.prediction.examples_per_second,
                           64 / half)
    self.assertEqual(sum(c.measured for c in result.candidates), 1)
    # Its memory is still the simulator's.
    self.assertEqual(result.best.prediction.peak_bytes,
                     third.prediction.peak_bytes)
    plan = choice.FromCandidate(result.best, 2, None, profile.model)
    self.assertTrue(plan.predicted['measured'])
    self.assertIn('measured through the trainer', plan.Describe())
    self.assertFalse(choice.FromCandidate(plain.best, 2, None, profile.model
                                          ).predicted['measured'])
    table = search.Table(result, top=3)
    self.assertIn('| trainer |', table)
    self.assertIn('| model |', table)
    self.assertIn('as if 10% longer', table)
    self.assertTrue(search.ToJson(result)['candidates'][0]['measured'])

  def testAnExtrapolationWinsOnlyByMoreThanTheFitsError(self):
    profile = _Profile()
    plain = self._Ranked(profile)
    best, second = plain.candidates[0], plain.candidates[1]
    # The model's best is unmeasured; the second measured 5% slower than
    # the best's prediction.
    slower = best.prediction.step_seconds * 1.05
    steps = {second.config: slower}
    # The fit misses by up to 20%: the measurement is the safer pick.
    result = self._Ranked(self._WithMeasured(profile, steps, 0.2))
    self.assertEqual(result.best.config, second.config)
    self.assertEqual(result.fit_error, 0.2)
    # The fit misses by up to 2%: the extrapolation is faster beyond that.
    result = self._Ranked(self._WithMeasured(profile, steps, 0.02))
    self.assertEqual(result.best.config, best.config)
    self.assertFalse(result.best.measured)
    # Either way the unmeasured keep their own predictions.
    self.assertEqual(result.best.prediction.step_seconds,
                     best.prediction.step_seconds)

  def testAProfileWithoutMeasurementsRanksAsBefore(self):
    profile = _Profile()
    self.assertEqual(search.Measured(profile), ({}, 0.0))
    old = profile.Replace(trainer_reference=dict(
        configs=['gpipe R=2 K=1 M=1 never'], devices=2, seconds=[0.1]))
    self.assertEqual(search.Measured(old), ({}, 0.0))
    self.assertEqual([c.config for c in self._Ranked(old).candidates],
                     [c.config for c in self._Ranked(profile).candidates])


if __name__ == '__main__':
  absltest.main()
