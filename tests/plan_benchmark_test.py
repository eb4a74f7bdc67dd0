"""The benchmark's plan subcommand on simulated steps; a planned real step."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile
from unittest import mock

from gpipe.plan import search
from gpipe.plan import simulator
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import simulated_runner
from tools.benchmark import cli
from tools.benchmark import plan
from tools.benchmark import plan_trainer
from tools.benchmark import runner

PNG_MAGIC = b'\x89PNG'
# The in-process real steps' devices, set before TensorFlow's runtime starts.
graph_rewrites.VirtualCpus(2)


class PlanBenchmarkTest(test_utils.TestCase):

  def testPredictionsBesideSimulatedSteps(self):
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, 'plan.json')
    png_path = os.path.join(out_dir, 'plan.png')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), mock.patch.object(
        runner, 'Runner', simulated_runner.SimulatedRunner):
      # At the tiny sizes of --quick the weights outweigh the activations: a
      # cap of fill-drain's whole need (at K=2) still drops the K=1 ones.
      cli.main(['plan', '--quick', '--models', 'transformer', '--json',
                json_path, '--plot', png_path, '--profile_dir', out_dir,
                '--cap_fraction', '1.0'])
    text = stdout.getvalue()
    with open(json_path) as f:
      result = json.load(f)
    with open(png_path, 'rb') as f:
      self.assertEqual(f.read(4), PNG_MAGIC)
    model = result['models']['transformer']
    self.assertTrue(os.path.exists(os.path.join(out_dir,
                                                'profile_transformer.json')))
    labels = [r['label'] for r in model['records']]
    self.assertEqual(labels[:2], ['#1', '#2'])
    self.assertIn('K=1 M=1', labels)
    shape = dict(num_layers=model['num_layers'], batch=model['batch'],
                 width=model['width'])
    for r in model['records']:
      config = simulator.Configuration.FromJson(r['config'])
      step = simulated_runner.SimulatedRunner().Add(runner.Config(
          'gpipe', 'transformer', shape['num_layers'], shape['batch'],
          config.devices_per_replica, config.micro_batches, config.remat,
          shape['width'], config.stages_per_device, config.schedule,
          replicas=config.replicas))
      self.assertAllClose(r['measured_step_seconds'], step.seconds)
      self.assertLen(r['measured_step_peak_bytes'], config.num_devices)
      self.assertLen(r['predicted_step_peak_bytes'], config.num_devices)
      if r['planned']:
        # The planner's candidates fit its cap as predicted.
        self.assertLessEqual(
            max(p + s for p, s in zip(r['predicted_step_peak_bytes'],
                                      r['static_bytes'])),
            model['cap_bytes'])
    self.assertGreater(model['num_dropped'], 0)
    self.assertIn(search.DOES_NOT_FIT, model['dropped'])
    headline = model['headline']
    self.assertIn('pick_over_fastest', headline)
    self.assertGreaterEqual(headline['pick_over_fastest'], 1.0)
    self.assertIn('Predicted vs measured', text)
    self.assertIn('Largest error: step time', text)

  def testPlannedConfigurationRunsWithItsCutAndCosts(self):
    profile_config = simulator.Configuration(
        1, 2, (1, 3), 2, 'zb_auto', 'never')
    costs = {'F': [1.0, 3.0], 'B': [1.0, 3.0], 'W': [1.0, 3.0],
             'handover': [0.0], 'max_in_flight': [2, 1],
             'max_awaiting_weight': [2, 2]}
    prediction = mock.Mock(task_costs=costs)
    shape = dict(num_layers=4, batch=4, width=16)
    config = plan.RunnerConfig('dense', shape, profile_config, prediction)
    self.assertEqual(config.stage_sizes, (1, 3))
    self.assertEqual(json.loads(config.task_costs), costs)
    self.assertIn('cut=1,3 measured-costs', config.label)
    r = simulated_runner.InProcessRunner(log=lambda *a: None)
    try:
      step = r.Add(config)
      self.assertGreater(step.Run(), 0)
      with step.graph.as_default():
        net_ops = [op.name for op in step.graph.get_operations()
                   if op.name.endswith('stage0_F1/PartitionedCall')]
      self.assertLen(net_ops, 1)
    finally:
      r.Close()


class PlanTrainerTest(test_utils.TestCase):

  def testThePlannersPhasesAreRead(self):
    output = '\n'.join([
        'describing the model took 1.9 s', 'a line', '  stem (StemLayer) at '
        '2 rows in float32: 0.3 s', 'measuring the layers took 23.6 s',
        "timing the trainer's step took 73.3 s", 'planning took 105.9 s'])
    self.assertEqual(plan_trainer.Phases(output), {
        'describing the model': 1.9, 'measuring the layers': 23.6,
        "timing the trainer's step": 73.3, 'planning': 105.9})

  def testThePickIsJudgedAgainstTheFastestAndItsSpread(self):
    def Config(pick, passes):
      return dict(pick=pick, measured_ms=min(passes), passes_ms=passes)

    # The fastest by 11%, but one of its passes is slower than the pick's
    # fastest: not told apart.
    close = [Config(True, [28.6, 28.4, 34.1]), Config(False, [30.1, 29.4,
                                                               25.6])]
    self.assertEqual(plan_trainer.PickVerdicts(close), (False, True))
    # Every pass of the other is faster: told apart.
    apart = [Config(True, [28.6, 28.4]), Config(False, [25.0, 26.1])]
    self.assertEqual(plan_trainer.PickVerdicts(apart), (False, False))
    # Within 5%; the pick the fastest; no pick measured.
    self.assertEqual(plan_trainer.PickVerdicts(
        [Config(True, [26.0]), Config(False, [25.0])]), (True, False))
    self.assertEqual(plan_trainer.PickVerdicts(
        [Config(True, [25.0, 27.0]), Config(False, [26.0])]), (True, True))
    self.assertEqual(plan_trainer.PickVerdicts([Config(False, [25.0])]),
                     (False, False))

  def testAPredictionIsJudgedAgainstThePassesRange(self):
    # Inside the passes' range: as good as another pass.
    self.assertEqual(plan_trainer.RangeError(100.0, [86.0, 104.0, 95.0]), 0)
    self.assertEqual(plan_trainer.RangeError(86.0, [86.0, 104.0]), 0)
    # Outside: against the nearer end, the sign saying which.
    self.assertAlmostEqual(plan_trainer.RangeError(110.0, [86.0, 100.0]), 0.1)
    self.assertAlmostEqual(plan_trainer.RangeError(80.0, [100.0, 90.0, 95.0]),
                           80.0 / 90.0 - 1)
    self.assertAlmostEqual(plan_trainer.RangeError(5.0, [4.0]), 0.25)

  def testSideBySideJudgesEachAgainstTheOthersOfItsPass(self):
    predicted = [100.0, 120.0, 90.0]
    # Right relative to each other, every pass's speed its own: no error,
    # and each pass's factor is its speed against the prediction.
    passes = [[p * f for f in (1.2, 0.9, 1.0)] for p in predicted]
    errors, factors = plan_trainer.SideBySide(predicted, passes)
    for e in errors:
      self.assertAlmostEqual(e, 0.0)
    for s, f in zip(factors, (1.2, 0.9, 1.0)):
      self.assertAlmostEqual(s, f)
    # The second configuration 20% slower than predicted in every pass
    # against the others, whatever the pass's speed: its whole error, not
    # diluted by its own share of the factor; the others each see it in
    # theirs (one of their two others).
    passes[1] = [p * 1.2 for p in passes[1]]
    errors, factors = plan_trainer.SideBySide(predicted, passes)
    self.assertAlmostEqual(errors[1], 1 / 1.2 - 1)
    self.assertAlmostEqual(errors[0], 1.2 ** 0.5 - 1)
    self.assertAlmostEqual(errors[2], 1.2 ** 0.5 - 1)
    self.assertAlmostEqual(factors[0], 1.2 * 1.2 ** (1 / 3))
    # Two configurations: the error in their ratio.
    errors, _ = plan_trainer.SideBySide([10.0, 10.0], [[10.0], [12.0]])
    self.assertAlmostEqual(errors[1], 10 / 12 - 1)
    self.assertAlmostEqual(errors[0], 12 / 10 - 1)
    # The median over passes: one pass's outlier does not decide.
    errors, _ = plan_trainer.SideBySide(
        [10.0, 10.0], [[10.0, 10.0, 30.0], [10.0, 10.0, 10.0]])
    self.assertEqual(errors, [0.0, 0.0])
    # One configuration is its own scale: nothing to say.
    self.assertEqual(plan_trainer.SideBySide([10.0], [[12.0, 11.0]]),
                     (None, None))


if __name__ == '__main__':
  tf.test.main()
