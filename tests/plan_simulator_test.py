"""The planner's simulator: bubble formulas, memory, hand-overs, replicas."""

import itertools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from gpipe.plan import profile as profile_lib
from gpipe.plan import simulator
from gpipe.schedules import registry
from tests import plan_testlib
from tools.plan import trainer_step

Configuration = simulator.Configuration
UniformProfile = plan_testlib.UniformProfile


def _Cases():
  for name in registry.Names():
    v = registry.Get(name).stages_per_device
    for d, m in itertools.product([1, 2, 4], [4, 8, 16]):
      yield name, d, v, m


class BubbleTest(parameterized.TestCase):

  @parameterized.parameters(_Cases())
  def testEqualCostsGiveTheRegistrysBubble(self, name, d, v, m):
    k = d * v
    config = Configuration(1, k, (1,) * k, m, name, 'never',
                           stages_per_device=v)
    try:
      registry.Orders(name, registry.Placement(name, k, d), m)
    except ValueError:
      return  # M not allowed: the search's test covers the refusal.
    prediction = simulator.Predict(UniformProfile(k, batch=m), config)
    self.assertAlmostEqual(prediction.bubble,
                           registry.BubbleFormula(name, d, v, m), places=9)
    # F, B and W cost a second each (B does W's work without a split).
    self.assertEqual(prediction.busy_seconds, [3 * v * m] * d)
    self.assertAlmostEqual(prediction.step_seconds, prediction.span_seconds)

  def testLoopedFillDrainShrinksTheBubble(self):
    for v in (1, 2, 4):
      config = Configuration(1, 2 * v, (1,) * 2 * v, 8, 'gpipe', 'never',
                             stages_per_device=v)
      self.assertAlmostEqual(
          simulator.Predict(UniformProfile(2 * v, batch=8), config).bubble,
          registry.BubbleFormula('gpipe', 2, v, 8))


class MemoryTest(absltest.TestCase):

  def testFillDrainHoldsEveryMicroBatch(self):
    # remat never: M activations of 10 per layer, 2 layers per stage.
    profile = UniformProfile(4, batch=8, temporary=5.0, param_bytes=100.0,
                             optimizer_slots=2)
    config = Configuration(1, 2, (2, 2), 8, 'gpipe', 'never')
    p = simulator.Predict(profile, config)
    # After the first backward: 7 x 20 kept and the gradient sum (200);
    # the second backward adds its temporaries (5), its new gradient (200)
    # and the new sum it writes (200) beside the old one.
    self.assertEqual(p.step_peak_bytes, [7 * 20 + 200 + 5 + 2 * 200] * 2)
    self.assertEqual(p.static_bytes, [200 * 3] * 2)
    self.assertEqual(p.peak_bytes, [745 + 600] * 2)

  def testTheGradientSumsLifeFollowsTheUpdate(self):
    # Looped fill-drain, M=1: device 0 runs F0 F2 B2 B0; each stage's
    # gradients (and sum) are 100, its kept activations 10.
    profile = UniformProfile(4, batch=2, param_bytes=100.0)
    config = Configuration(1, 4, (1,) * 4, 1, 'gpipe', 'never',
                           stages_per_device=2)
    # By default the update reads every gradient first: stage 2's sum is
    # kept, so B0 holds it beside its own gradients and stage 0's kept
    # activations.
    default = simulator.Predict(profile, config)
    self.assertEqual(default.step_peak_bytes, [10 + 100 + 100.0] * 2)
    self.assertEqual(
        simulator.Predict(profile, config,
                          update=simulator.UPDATE_ALL_GRADIENTS),
        default)
    # Each variable's gradient applied as soon as it is complete: stage
    # 2's sum is freed as B2 ends, so the peak is B2's gradients (100)
    # beside both stages' activations (20).
    early = simulator.Predict(profile, config,
                              update=simulator.UPDATE_EACH_VARIABLE)
    self.assertEqual(early.step_peak_bytes, [120.0] * 2)
    # Two replicas: under either update the sums wait for the other
    # replica's; replica 0's devices also receive its two stages' sums
    # (200).
    two = config._replace(replicas=2)
    for update in simulator.UPDATES:
      got = simulator.Predict(profile, two, update=update)
      self.assertEqual(got.step_peak_bytes, [10 + 100 + 100 + 200.0] * 2 +
                       [10 + 100 + 100 + 200.0] * 2)
      # The update's timing changes memory, not time.
      self.assertEqual(got.step_seconds,
                       simulator.Predict(profile, two).step_seconds)
    self.assertEqual(early.step_seconds, default.step_seconds)
    with self.assertRaisesRegex(ValueError, 'unknown update .*each_variable'):
      simulator.Predict(profile, config, update='early')

  def testRematPerStage(self):
    profile = UniformProfile(4, batch=8, activation=10.0, boundary=2.0)
    got = {}
    for remat in simulator.REMAT_MODES:
      config = Configuration(1, 2, (2, 2), 8, 'gpipe', remat)
      got[remat] = simulator.Predict(profile, config).step_peak_bytes
    # With remat a stage keeps its input (2) per micro-batch, and the first
    # backward holds the recomputed activations of its stage (20).
    self.assertEqual(got['always'], [8 * 2 + 20] * 2)
    self.assertEqual(got['never'], [8 * 20] * 2)
    # 'except_last': the last stage keeps its activations.
    self.assertEqual(got['except_last'], [8 * 2 + 20, 8 * 20])
    # Remat costs time: B runs the forward again (2 layers of 1 s).
    times = {remat: simulator.Predict(profile, Configuration(
        1, 2, (2, 2), 8, 'gpipe', remat)).step_seconds
             for remat in simulator.REMAT_MODES}
    # Fill-drain: (M + K - 1) forwards of 2 s, then backwards of 4 s.
    self.assertEqual(times['never'], (8 + 1) * 2 + (8 + 1) * 4)
    self.assertGreater(times['except_last'], times['never'])
    self.assertGreater(times['always'], times['except_last'])

  def testALayersOutputTheNextLayerReadsIsHeldOnce(self):
    profile = UniformProfile(3, batch=4)
    ms = [m._replace(input_read_bytes=4.0, output_read_bytes=3.0)
          for m in profile.layers[0].measurements]
    profile = profile._replace(layers=[
        layer._replace(measurements=ms) for layer in profile.layers])
    p = simulator.Predict(profile, Configuration(1, 1, (3,), 1, 'gpipe',
                                                 'never'))
    # 3 x 10, less the two outputs (3 each) the next layer reads again.
    self.assertEqual(p.step_peak_bytes, [3 * 10.0 - 2 * 3.0])

  def testOneFOneBHoldsAtMostKMicroBatches(self):
    profile = UniformProfile(4, batch=16)
    p = simulator.Predict(profile, Configuration(1, 4, (1,) * 4, 16, '1f1b',
                                                 'never'))
    self.assertEqual(p.step_peak_bytes, [40.0, 30.0, 20.0, 10.0])

  def testSplitBackwardKeepsWhatWReads(self):
    profile = UniformProfile(2, batch=4, weight_bytes=3.0)
    p = simulator.Predict(profile, Configuration(1, 2, (1, 1), 4, 'zb_h1',
                                                 'never'))
    # Stage 0 with ZB-H1 (K=2): F0 F1 B0 F2 B1 F3 W0 B2 W1 ...: at most 2
    # between F and B, plus those between B and W.
    _, orders = registry.Orders('zb_h1', 2, 4)
    held = peak = 0.0
    for task in orders[0]:
      if task.phase == 'F':  # Its output (1) while it runs.
        peak = max(peak, held + 1.0)
      held += {'F': 10.0, 'B': -10.0 + 3.0, 'W': -3.0}[task.phase]
      peak = max(peak, held)
    self.assertEqual(p.step_peak_bytes[0], peak)

  def testBatchedWeightsHoldEveryMicroBatchUntilTheEnd(self):
    profile = UniformProfile(2, batch=4, weight_bytes=3.0, activation=0.0,
                             boundary=0.0)
    p = simulator.Predict(profile, Configuration(
        1, 2, (1, 1), 4, 'gpipe', 'never', batched_weights=True))
    self.assertEqual(p.step_peak_bytes, [4 * 3.0] * 2)
    # One W* per stage at the end.
    phases = [t.phase for t, _, _ in p.task_times[0]]
    self.assertEqual(phases, ['F'] * 4 + ['B'] * 4 + ['W'])


class TimeTest(absltest.TestCase):

  def testHandoversDelayTheNextStage(self):
    profile = UniformProfile(2, batch=1, boundary=1000.0,
                             handover=profile_lib.Handover(0.5, 4000.0))
    p = simulator.Predict(profile, Configuration(1, 2, (1, 1), 1, 'gpipe',
                                                 'never'))
    # F, hand-over 0.75, F, B (2), hand-over 0.75, B (2).
    self.assertAlmostEqual(p.step_seconds, 1 + 0.75 + 1 + 2 + 0.75 + 2)

  def testCallsUpdatesAndReplicas(self):
    profile = UniformProfile(
        2, batch=8, param_bytes=1000.0, call_seconds=0.25,
        memory_bandwidth=1000.0, update_traffic=4.0, step_seconds=0.5,
        handover=profile_lib.Handover(0.0, 2000.0))
    one = simulator.Predict(profile, Configuration(1, 1, (2,), 1, 'gpipe',
                                                   'never'))
    # F (2 + 0.25), B (2 x 2 + adding 2000 gradient bytes into the sum: 6,
    # + 0.25), the update (4 x 2000 bytes: 8), the step's 0.5.
    self.assertAlmostEqual(one.step_seconds, 2.25 + 10.25 + 8 + 0.5)
    two = simulator.Predict(profile, Configuration(2, 1, (2,), 1, 'gpipe',
                                                   'never'))
    # Each replica has half the rows: the same times (flat profile); then
    # replica 1's gradients (2000 bytes: 1 s) and one AddN of two (4 s).
    self.assertAlmostEqual(two.step_seconds, one.step_seconds + 1 + 4)
    self.assertLen(two.idle_fractions, 2)
    self.assertEqual(two.static_bytes, [2000.0, 0.0])
    # Replica 1 reads the weights onto its device; replica 0 receives its
    # gradients.
    self.assertEqual(two.step_peak_bytes[1] - one.step_peak_bytes[0], 2000)
    self.assertEqual(two.step_peak_bytes[0] - one.step_peak_bytes[0], 2000)

  def testLingvosUpdateWaitsForEveryGradient(self):
    # Stage 1 holds 3 of the 4 layers' weights: its update takes 12 s, stage
    # 0's 4 s. Lingvo's learner (a global norm first) starts no update
    # before the last gradient sum; a per-variable update starts each
    # device's after its own. The update factor scales both.
    profile = UniformProfile(4, batch=8, param_bytes=1000.0,
                             memory_bandwidth=1000.0, update_traffic=4.0)
    config = Configuration(1, 2, (1, 3), 2, 'gpipe', 'never')
    for factor in (1.0, 2.5):
      scaled = profile.Replace(update_factor=factor)
      each = simulator.Predict(scaled, config,
                               update=simulator.UPDATE_EACH_VARIABLE)
      ends = [max(e for _, _, e in lane) for lane in each.task_times]
      self.assertAlmostEqual(
          each.step_seconds,
          max(ends[0] + 4 * factor, ends[1] + 12 * factor))
      every = simulator.Predict(scaled, config)
      self.assertAlmostEqual(every.step_seconds, max(ends) + 12 * factor)
      self.assertGreater(every.step_seconds, each.step_seconds)

  def testTheTrainersStepAddsToEveryConfiguration(self):
    # What the trainer's step adds (input, Lingvo's learner, its client) is
    # a fixed cost of each step, whatever the configuration.
    profile = UniformProfile(4, batch=8, call_seconds=0.1,
                             handover=profile_lib.Handover(0.01, 1e6))
    with_trainer = profile.Replace(trainer_seconds=0.75)
    for config in (Configuration(1, 1, (4,), 1, 'gpipe', 'never'),
                   Configuration(2, 2, (2, 2), 2, '1f1b', 'always'),
                   Configuration(1, 4, (1, 1, 1, 1), 8, 'zb_auto', 'never')):
      self.assertAlmostEqual(
          simulator.Predict(with_trainer, config).step_seconds,
          simulator.Predict(profile, config).step_seconds + 0.75)
    # A profile written before the field existed reads as 0.
    path = os.path.join(tempfile.mkdtemp(), 'p.json')
    profile_lib.Save(with_trainer, path)
    self.assertEqual(profile_lib.Load(path).trainer_seconds, 0.75)
    old = profile_lib.ReadJson(path, 'profile')
    del old['trainer_seconds']
    profile_lib.WriteJson(old, path)
    self.assertEqual(profile_lib.Load(path).trainer_seconds, 0.0)

  def testTheTrainersReferences(self):
    # Data-parallel, then pipelined over the devices under a split backward
    # (the fit to them: tests/plan_trainer_fit_test.py).
    profile = UniformProfile(4, batch=8)
    self.assertEqual([c.label for c in trainer_step.References(profile, 2)],
                     ['gpipe R=2 K=1 M=1 never', 'zb_h1 R=1 K=2 M=2 never',
                      'zb_v R=1 K=4 v=2 M=2 never'])
    self.assertEqual(
        [c.label for c in trainer_step.References(
            profile.Replace(loss_in_pipeline=False), 2)],
        ['gpipe R=2 K=1 M=1 never', 'gpipe R=1 K=2 M=2 never'])
    self.assertLen(trainer_step.References(profile, 1), 1)

  def testCalibrationScalesEachKindOfTask(self):
    factors = (profile_lib.Factors(rows=1, F=2.0, B=3.0, W=4.0, BW=5.0,
                                   R=0.5),)
    profile = UniformProfile(2, batch=4, factors=factors, contention=1.5)
    one = simulator.StageModels(profile, Configuration(
        1, 1, (2,), 4, 'gpipe', 'always'))[0]
    # Two layers of 1 s: F x 2; unsplit B (input + weight: 4 s) x 5 plus
    # the recomputed forward (2 s) x 0.5; one device: no contention.
    self.assertEqual((one.forward, one.backward), (4.0, 21.0))
    split = simulator.StageModels(profile, Configuration(
        1, 2, (1, 1), 4, 'zb_h1', 'never'))[0]
    # Two devices compute at once: x 1.5.
    self.assertEqual((split.forward, split.backward, split.weight),
                     (3.0, 4.5, 6.0))
    self.assertEqual(profile_lib.FactorsAt(factors, 64), factors[0])
    two = factors + (profile_lib.Factors(rows=3, F=4.0, B=3.0, W=4.0, BW=5.0,
                                         R=0.5),)
    self.assertEqual(profile_lib.FactorsAt(two, 2).F, 3.0)

  def testRefusals(self):
    profile = UniformProfile(4, batch=8)
    cases = [
        (Configuration(1, 2, (1, 2), 8, 'gpipe', 'never'),
         'must be 2 positive numbers summing to the 4 layers'),
        (Configuration(1, 2, (2, 2), 3, 'gpipe', 'never'),
         'R x M = 1 x 3 does not divide the batch of 8'),
        (Configuration(1, 4, (1,) * 4, 2, '1f1b', 'never'),
         'at least as many micro-batches as stages'),
        (Configuration(1, 2, (2, 2), 8, 'gpipe', 'sometimes'),
         'unknown remat'),
    ]
    for config, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        simulator.Predict(profile, config)
    after = profile.Replace(loss_in_pipeline=False, batched_weights=False)
    with self.assertRaisesRegex(ValueError, 'loss after it'):
      simulator.Predict(after, Configuration(1, 2, (2, 2), 8, '1f1b',
                                             'never'))
    with self.assertRaisesRegex(ValueError, 'cannot batch its weight'):
      simulator.Predict(after, Configuration(1, 2, (2, 2), 8, 'gpipe',
                                             'never', batched_weights=True))


class ProfileTest(absltest.TestCase):

  def testInterpolationAndRoundTrip(self):
    ms = [profile_lib.Measurement(rows, 'float32', 0.001 * rows + 0.01,
                                  0.002 * rows, 0.001 * rows, 4 * rows,
                                  4 * rows, 12 * rows, 8 * rows, 0.0)
          for rows in (8, 32)]
    layer = profile_lib.Layer('dense', 4096, ms)
    at = layer.At(16)
    self.assertAlmostEqual(at.forward, 0.026)
    self.assertAlmostEqual(at.activation_bytes, 192)
    self.assertAlmostEqual(layer.At(64).backward, 0.128)  # Extrapolated.
    self.assertEqual(layer.At(1).output_bytes, 4)
    with self.assertRaisesRegex(ValueError, 'not measured in bfloat16'):
      layer.At(8, 'bfloat16')
    profile = UniformProfile(3)._replace(layers=[layer] * 3)
    path = os.path.join(tempfile.mkdtemp(), 'p.json')
    profile_lib.Save(profile, path)
    self.assertEqual(profile_lib.Load(path), profile)
    plan_testlib.AssertRefusesOtherFormats(
        self, profile_lib.Load, path, 'not a gpipe-profile-1 profile')


if __name__ == '__main__':
  absltest.main()
