"""tools/benchmark/: each subcommand's logic, quickly; real steps at tiny sizes.

Most tests run a subcommand on ``tests.simulated_runner``: its steps are
simulated from their schedules (no graphs, no worker processes), so in
seconds a test checks which configurations the subcommand compares and that
what it reports from their step times, traces and memory records is what the
simulation predicts. Real steps are built and run, in this process on
virtual CPUs, by ``testStepsOfEveryImplementation`` (ours with a schedule and
with replicas, Lingvo's GPipe, plain and inline) and ``testCost...`` (the
cost subcommand's traced steps, with batched weight gradients; its kernel
floor on two pinned worker processes).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import math
import os
import tempfile
from unittest import mock

from gpipe import schedules
from gpipe.measure import timeline
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import simulated_runner
from tools.benchmark import cli
from tools.benchmark import floor
from tools.benchmark import memory
from tools.benchmark import runner

PNG_MAGIC = b'\x89PNG'
# The memory cap of testMemory: the simulated transformer's boundaries for
# every mode lie below its 12 layers.
CAP_MIB = 1.0
# Virtual CPU devices of this process for the in-process real steps; set
# before TensorFlow's runtime starts.
LOCAL_DEVICES = graph_rewrites.VirtualCpus(2)


def _Simulated():
  """Runs subcommands on simulated steps (tests.simulated_runner)."""
  return mock.patch.object(runner, 'Runner', simulated_runner.SimulatedRunner)


def _SimulatedStep(config):
  """What the simulated runner makes of `config` (the prediction)."""
  return simulated_runner.SimulatedRunner().Add(config)


class BenchmarkTest(test_utils.TestCase):

  def _Run(self, command, *flags):
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, command + '.json')
    png_path = os.path.join(out_dir, command + '.png')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), _Simulated():
      cli.main([command, '--quick', '--json', json_path, '--plot',
                png_path] + list(flags))
    text = stdout.getvalue()
    with open(json_path) as f:
      result = json.load(f)
    with open(png_path, 'rb') as f:
      self.assertEqual(f.read(4), PNG_MAGIC)
    # The table, the machine and the settings are printed.
    self.assertIn('| ---', text.replace('|---', '| ---'))
    self.assertIn('Machine:', text)
    self.assertIn('Settings:', text)
    self.assertEqual(result['markdown'], text.strip('\n'))
    self.assertEqual(result['machine']['cpus'], os.cpu_count())
    return result, text, out_dir

  def testSchedules(self):
    result, text, _ = self._Run('schedules', '--models', 'transformer',
                                '--micro_batches', '2', '--memory_m', '4')
    model = result['models']['transformer']
    got = {(c['schedule'], c['K'], c['v'], c['M']) for c in model['configs']}
    self.assertEqual(got, {('gpipe', 1, 1, 1), ('gpipe', 2, 1, 2),
                           ('1f1b', 2, 1, 2), ('interleaved_1f1b', 2, 2, 2),
                           ('zb_h1', 2, 1, 2), ('zb_v', 2, 2, 2),
                           ('zb_auto', 2, 1, 2)})
    shape = dict(num_layers=model['num_layers'], batch=model['batch'],
                 width=model['width'])
    base = _SimulatedStep(runner.Config(
        'gpipe', 'transformer', shape['num_layers'], shape['batch'], 1, 1,
        'always', shape['width'], 1, 'gpipe'))
    for c in model['configs']:
      step = _SimulatedStep(runner.Config(
          'gpipe', 'transformer', shape['num_layers'], shape['batch'], c['K'],
          c['M'], 'always', shape['width'], c['v'], c['schedule']))
      self.assertAllClose(c['seconds'], step.seconds)
      self.assertAllClose(c['speedup'], base.seconds / step.seconds)
      if c['K'] == 2:
        # Each device's idle share of the traced tasks' span.
        self.assertLen(c['measured_bubbles'], 2)
        self.assertTrue(all(0 <= b < 1 for b in c['measured_bubbles']))
        self.assertEqual(c['formula_bubble'], schedules.registry.BubbleFormula(
            c['schedule'], 2, c['v'], c['M']))
        if c['schedule'] == 'gpipe':
          # Fill-drain's bubble does not depend on the task costs.
          self.assertAllClose(c['measured_bubbles'], [c['formula_bubble']] * 2)
    # remat='never', M=4: 1F1B holds K=2 micro-batches' activations, not 4.
    self.assertLen(model['memory'], 6)
    for m in model['memory']:
      self.assertTrue(all(p > 0 for p in m['peak_bytes']), m)
    ratios = {m['schedule']: m['ratio_to_gpipe'] for m in model['memory']}
    self.assertEqual(ratios['gpipe'], [1.0, 1.0])
    self.assertLess(ratios['1f1b'][0], 1.0)
    self.assertIn('| zb_v | 2 | 2 |', text)
    self.assertIn('Best M per schedule', text)

  def testCostRunsBatchedWeightsBesideTheDefault(self):
    # Real steps and traces: the pipeline's in this process, the kernel
    # floor's on its two pinned worker processes.
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, 'cost.json')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), mock.patch.object(
        runner, 'Runner', simulated_runner.InProcessRunner):
      cli.main(['cost', '--quick', '--json', json_path, '--model', 'dense'])
    with open(json_path) as f:
      result = json.load(f)
    got = [(c['K'], c['M'], c['batched_weights']) for c in result['configs']]
    self.assertEqual(got, [(1, 1, False), (2, 2, False), (2, 2, True)])
    for c in result['configs']:
      self.assertGreater(c['step_seconds'], 0)
      self.assertLen(c['breakdown_ms'], c['K'])
      for calls in c['task_calls'].values():
        # Each worker runs its stage's M forwards and M backwards ...
        self.assertEqual(calls['F'][1], c['M'])
        self.assertEqual(calls['B'][1], c['M'])
        # ... and, batched, one W task for all of them.
        self.assertEqual(calls.get('W*', [0, 0])[1],
                         1 if c['batched_weights'] else 0)
    self.assertEqual(result['configs'][1]['added_per_micro_batch_ms'].keys(),
                     result['configs'][2]['added_per_micro_batch_ms'].keys())
    self.assertIn('M=2 batched W', stdout.getvalue())
    self.assertIn('Speed-up over K=1 M=1', stdout.getvalue())
    # The kernel floor of the same M, and the ceiling it implies.
    fl = result['floor']
    self.assertGreater(fl['K1M1_ms'], 0)
    self.assertEqual([r['M'] for r in fl['M']], [2])
    for r in fl['M']:
      self.assertAllClose(r['floor_step_ms'],
                          r['stage_both_ms'] + r['bubble_ms'])
      self.assertAllClose(r['ceiling'], fl['K1M1_ms'] / r['floor_step_ms'])
    self.assertIn('### Kernel floor', stdout.getvalue())

  def testCostFloorIsSkippedWhereItIsNotDefined(self):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), _Simulated():
      result = cli.main(['cost', '--quick', '--model', 'transformer',
                         '--no-batched_weight_gradients'])
    self.assertEqual(result, 0)
    # K=1 M=1 and K=2 M=2 only: no batched weight gradients.
    self.assertIn('M=2 |', stdout.getvalue())
    self.assertNotIn('batched W', stdout.getvalue())
    self.assertIn('Kernel floor: measured for the dense model in float32 at '
                  'K=2 only; this run is transformer', stdout.getvalue())

  def testFloorGradientsEqualThePlainModels(self):
    # The floor's stage work (per micro-batch forward and input gradients,
    # batched weight gradients) computes the gradients of the plain model,
    # with the hoisted transpose (64 rows) and without it (128 rows).
    for micro_batches in (4, 2, 1):
      work = floor.Work('/cpu:0', '', num_layers=3, batch=256, width=8,
                        micro_batches=micro_batches)
      with work.graph.as_default():
        h = work.x
        for w, b in zip(work.weights, work.biases):
          h = tf.nn.relu(tf.matmul(h, w) + b)
        loss = tf.reduce_sum(h * work.dy)
        want = tf.gradients(loss, work.weights + work.biases)
      got = [g for pair in work.gradients for g in pair]
      got = got[0::2] + got[1::2]
      got, want = work.session.run((got, want))
      for g, w in zip(got, want):
        self.assertAllClose(g, w, rtol=1e-5, atol=1e-4)
      work.Close()

  def testZeroBubbleVNeedsTwoStagesPerDevice(self):
    config = runner.Config('gpipe', 'dense', 4, 8, 2, 4, 'never', 16, 1,
                           'zb_v')
    with self.assertRaisesRegex(ValueError, 'set stages_per_device=2'):
      runner.Step(config, '', ['/cpu:0', '/cpu:0'])

  def testFloorErrors(self):
    with self.assertRaisesRegex(ValueError, 'batch 10 does not divide into 4'):
      floor.Work('/cpu:0', '', 2, 10, 8, 4)
    with self.assertRaisesRegex(ValueError, '3 layers do not make two equal'):
      floor.Floor(3, 8, 8, [2])

  def testStepsOfEveryImplementation(self):
    # Real graphs and sessions, in this process: ours with a schedule (the
    # loss inside the pipeline, stages in a V), ours with two replicas,
    # Lingvo's GPipe, plain TensorFlow and the inline micro-batches.
    configs = [
        runner.Config('gpipe', 'dense', 4, 4, 2, 2, 'always', 16, 2, 'zb_v'),
        runner.Config('gpipe', 'dense', 4, 4, 1, 2, 'always', 16,
                      replicas=2),
        runner.Config('lingvo', 'dense', 4, 4, 2, 2, 'always', 16),
        runner.Config('plain', 'dense', 4, 4, 1, 1, 'never', 16),
        runner.Config('inline', 'dense', 4, 4, 1, 2, 'never', 16)]
    steps = simulated_runner.InProcessRunner(log=lambda *unused: None)
    try:
      traced = {}
      for config in configs:
        step = steps.Add(config)
        before = step.session.run(step.variables)
        self.assertTrue(math.isfinite(step.session.run(step.loss)))
        seconds, metadata = step.Run(trace=True)
        self.assertGreater(seconds, 0)
        # The step updated the weights.
        after = step.session.run(step.variables)
        self.assertTrue(any((b != a).any() for b, a in zip(before, after)),
                        config.label)
        traced[config.impl, config.replicas, config.schedule] = (
            timeline.ParseStepStats(metadata.step_stats), metadata)
    finally:
      steps.Close()
    devices = LOCAL_DEVICES
    # ZB-V: each device runs F, B and W of its 2 stages for both
    # micro-batches.
    tasks, _ = traced['gpipe', 1, 'zb_v']
    for device in devices:
      phases = sorted(t.phase + str(t.micro_batch) for t in tasks
                      if t.device == device)
      self.assertEqual(phases, sorted(2 * ['B0', 'B1', 'F0', 'F1', 'W0', 'W1']),
                       device)
    # Two replicas: each device runs one replica's forward tasks.
    tasks, _ = traced['gpipe', 2, None]
    self.assertEqual({t.device for t in tasks if t.phase == 'F'},
                     set(devices))
    # Lingvo's GPipe: its two cells on the two virtual CPUs.
    _, metadata = traced['lingvo', 1, None]
    busy = {d.device for d in metadata.step_stats.dev_stats if d.node_stats}
    self.assertContainsSubset(devices, busy)

  def testThroughput(self):
    result, text, _ = self._Run('throughput', '--models', 'transformer')
    configs = result['models']['transformer']['configs']
    got = [(c['impl'], c['K'], c['M'], c['v'], c['remat']) for c in configs]
    a, n = 'always', 'never'
    self.assertCountEqual(
        got, [('gpipe', 1, 1, 1, a), ('gpipe', 1, 2, 1, a),
              ('gpipe', 2, 1, 1, a), ('gpipe', 2, 2, 1, a),
              ('gpipe', 2, 2, 2, a), ('lingvo', 1, 1, 1, a),
              ('lingvo', 2, 1, 1, a), ('lingvo', 2, 2, 1, a),
              ('plain', 1, 1, 1, n), ('gpipe', 1, 1, 1, n),
              ('gpipe', 1, 2, 1, n), ('inline', 1, 1, 1, n),
              ('inline', 1, 2, 1, n)])
    model = result['models']['transformer']
    shape = model['shape']
    seconds = {}
    for c in configs:
      step = _SimulatedStep(runner.Config(
          c['impl'], 'transformer', shape['num_layers'], shape['batch'],
          c['K'], c['M'], c['remat'], shape['width'], c['v']))
      self.assertEqual(c['all_step_seconds'], [step.seconds])  # --steps 1
      self.assertAllClose(c['step_seconds'], step.seconds)
      seconds[(c['impl'], c['K'], c['M'], c['v'], c['remat'])] = step.seconds
    ours = lambda k, m, v=1: seconds[('gpipe', k, m, v, a)]
    for c in configs:
      self.assertAllClose(c['speedup_vs_gpipe_K1M1'],
                          ours(1, 1) / c['step_seconds'])
    headline = model['headline']
    # Simulated fill-drain at K=2 gains most at the largest M.
    self.assertEqual(headline['best_M'], 2)
    self.assertAllClose(headline['speedup_best_M'], ours(1, 1) / ours(2, 2))
    self.assertEqual(headline['looping_best_v'], 2)
    self.assertAllClose(headline['looping_speedup_K2'],
                        ours(1, 1) / ours(2, 2, 2))
    self.assertAllClose(headline['looping_ours_over_lingvo_K2'],
                        seconds[('lingvo', 2, 2, 1, a)] / ours(2, 2, 2))
    self.assertAllClose(
        headline['ours_over_lingvo_K2_by_M'],
        {str(m): seconds[('lingvo', 2, m, 1, a)] / ours(2, m) for m in (1, 2)})
    self.assertAllClose(headline['micro_batch_overhead_fraction'],
                        1 - ours(1, 1) / ours(1, 2))
    self.assertAllClose(
        headline['pipeline_overhead_fraction'],
        1 - seconds[('inline', 1, 2, 1, n)] / seconds[('gpipe', 1, 2, 1, n)])
    self.assertIn('Headline: K=2 M=8 speed-up n/a; best M=2 %.2fx' %
                  headline['speedup_best_M'], text)

  def testDataParallel(self):
    result, text, _ = self._Run('data_parallel', '--models', 'transformer')
    model = result['models']['transformer']
    self.assertEqual([(1, 1, 1), (1, 1, 2), (2, 1, 1)],
                     [(c['R'], c['K'], c['M']) for c in model['configs']])
    shape = model['shape']
    steps = [_SimulatedStep(runner.Config(
        'gpipe', 'transformer', shape['num_layers'], shape['batch'], c['K'],
        c['M'], 'always', shape['width'], replicas=c['R']))
             for c in model['configs']]
    for c, step in zip(model['configs'], steps):
      self.assertAllClose(c['step_seconds'], step.seconds)
      self.assertAllClose(c['speedup_vs_R1K1M1'],
                          steps[0].seconds / step.seconds)
      # The tail after the last backward task: the update, and with two
      # replicas their gradient sum first; both replicas start at once.
      self.assertAllClose(c['tail_seconds'], step.seconds - step.update_start +
                          (simulated_runner.ALLREDUCE_SECS if c['R'] == 2
                           else 0.0), atol=2e-6)
      self.assertAllClose(c['head_seconds'], 0.0)
      if c['R'] == 2:
        self.assertAllClose(c['allreduce_share'],
                            simulated_runner.ALLREDUCE_SECS / step.seconds,
                            atol=1e-4)
      else:
        self.assertIsNone(c['allreduce_share'])
    self.assertAllClose(model['headline']['speedup_R2K1'],
                        steps[0].seconds / steps[2].seconds)
    self.assertIn('| 2 | 1 | 1 | 2 |', text)
    self.assertIn('Headline: R=2, K=1 runs', text)

  def testMemory(self):
    cap = CAP_MIB * (1 << 20)
    result, text, _ = self._Run('memory', '--models', 'transformer',
                                '--max_layers', '12', '--cap_mib',
                                str(CAP_MIB))
    modes = result['models']['transformer']
    self.assertCountEqual(modes, ['naive-1', 'pipeline-1', 'pipeline-2'])
    for mode in modes.values():
      # Fitting means parameters + measured step peak within the cap; one
      # more layer (per stage) does not fit.
      fit, over = mode['fit'], mode['first_not_fitting']
      self.assertLessEqual(fit['fits_bytes'], cap)
      self.assertGreater(fit['step_peak_bytes'], 0)
      if over:
        self.assertGreater(over['fits_bytes'], cap)
        self.assertLessEqual(over['num_layers'] - fit['num_layers'], 2)
    # Re-materialization keeps one input per micro-batch instead of every
    # layer's activations: more layers fit.
    layers = {name: mode['fit']['num_layers'] for name, mode in modes.items()}
    self.assertLess(layers['naive-1'], layers['pipeline-1'])
    self.assertLessEqual(layers['pipeline-1'], layers['pipeline-2'])
    self.assertAllClose(
        result['pipeline1_over_naive1_layers']['transformer'],
        layers['pipeline-1'] / layers['naive-1'])
    self.assertIn('Headline: pipeline-1 fits transformer', text)

  def _Search(self, cost, cap, max_layers, step_size):
    calls = []
    def Measure(layers):
      self.assertEqual(layers % step_size, 0)
      self.assertBetween(layers, step_size, max_layers)
      calls.append(layers)
      return cost(layers)
    got = memory.LargestFitting(Measure, cap, max_layers, step_size)
    self.assertEqual(len(calls), len(set(calls)), 'measured twice: %s' % calls)
    return got, calls

  def testLargestFittingFindsTheBoundary(self):
    for step_size in (1, 2):
      for cap in (30, 100, 257, 400):
        # Affine with a steeper start, like a model's fixed costs.
        cost = lambda layers: 25 + 3 * layers + (10 if layers > 4 else 0)
        (fit, over), calls = self._Search(cost, cap, 96, step_size)
        brute = [l for l in range(step_size, 97, step_size) if cost(l) <= cap]
        self.assertEqual(fit, brute[-1] if brute else None, (cap, step_size))
        if over is not None:
          self.assertEqual(over, (fit or 0) + step_size)
          self.assertGreater(cost(over), cap)
        self.assertLessEqual(len(calls), 8, calls)

  def testLargestFittingConvergesWhenTheSlopeChanges(self):
    # Cheap layers at first, expensive later (a small-L slope misleads).
    cost = lambda layers: 30 + layers + (layers - 100) ** 2 // 20 * (
        layers > 100)
    (fit, over), calls = self._Search(cost, 256, 192, 1)
    brute = max(l for l in range(1, 193) if cost(l) <= 256)
    self.assertEqual((fit, over), (brute, brute + 1))
    self.assertLessEqual(len(calls), 12)

  def testLargestFittingEdges(self):
    # Even the smallest size is over the cap.
    self.assertEqual(self._Search(lambda l: 100 * l, 50, 96, 2)[0], (None, 2))
    # Everything up to max_layers fits: no first size over the cap.
    self.assertEqual(self._Search(lambda l: l, 1000, 97, 2)[0], (96, None))
    with self.assertRaisesRegex(ValueError, 'raise --max_layers'):
      memory.LargestFitting(lambda l: l, 100, 1, 2)

  def testBubble(self):
    timeline_png = os.path.join(tempfile.mkdtemp(), 't.png')
    result, _, _ = self._Run('bubble', '--timeline', timeline_png)
    self.assertEqual([c['M'] for c in result['configs']], [1, 2])
    for c in result['configs']:
      self.assertAllClose(c['model_bubble'], 1.0 / (c['M'] + 1))
      # The simulated fill-drain step idles exactly as the model says.
      self.assertAllClose(c['measured_bubbles'], [c['model_bubble']] * 2)
      # Every forward and backward task of both stages was traced.
      self.assertLen(c['tasks'], 2 * 2 * c['M'])
    with open(timeline_png, 'rb') as f:
      self.assertEqual(f.read(4), PNG_MAGIC)

  def testGraph(self):
    result, text, _ = self._Run('graph')
    ops = [p['ops'] for p in result['M_sweep']]
    self.assertEqual(ops, sorted(ops))
    self.assertGreater(result['ops_per_micro_batch'], 0)
    self.assertGreater(result['ops_per_layer'], 0)
    self.assertEqual(result['big']['L'], 8)
    self.assertIn('builds in', text)


  def testXlaTrainerGivesTheUncompiledLosses(self):
    # The trainer with --xla on a model with dropout (the toy MLP keeps
    # 0.9): the same first loss and, one update later, the same second
    # loss as without --xla, to float32 rounding.
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, 'xla.json')
    with contextlib.redirect_stdout(io.StringIO()):
      cli.main(['xla_trainer', '--quick', '--schedules=zb_v', '--json',
                json_path])
    with open(json_path) as f:
      (row,) = json.load(f)['results']
    self.assertEqual(('toy.PipelinedDigitsMlp', 'zb_v'),
                     (row['model'], row['schedule']))
    self.assertLess(row['first_loss_error'], 1e-6)
    self.assertLess(row['first_grad_norm_error'], 1e-5)
    self.assertLess(row['later_loss_error'], 1e-5)


if __name__ == '__main__':
  tf.test.main()
