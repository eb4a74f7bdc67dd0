"""tools/benchmark/: every subcommand at a tiny size (no speed checks)."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli
from tools.benchmark import floor
from tools.benchmark import memory
from tools.benchmark import runner

PNG_MAGIC = b'\x89PNG'


class BenchmarkTest(test_utils.TestCase):

  def _Run(self, command, *flags):
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, command + '.json')
    png_path = os.path.join(out_dir, command + '.png')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
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
                                '--micro_batches', '2', '--memory_m', '2')
    model = result['models']['transformer']
    got = {(c['schedule'], c['K'], c['v'], c['M']) for c in model['configs']}
    self.assertEqual(got, {('gpipe', 1, 1, 1), ('gpipe', 2, 1, 2),
                           ('1f1b', 2, 1, 2), ('interleaved_1f1b', 2, 2, 2),
                           ('zb_h1', 2, 1, 2), ('zb_v', 2, 2, 2)})
    for c in model['configs']:
      self.assertGreater(c['seconds'], 0)
      if c['K'] == 2:
        self.assertLen(c['measured_bubbles'], 2)
        self.assertTrue(all(0 <= b < 1 for b in c['measured_bubbles']))
    self.assertLen(model['memory'], 5)
    for m in model['memory']:
      self.assertTrue(all(p > 0 for p in m['peak_bytes']), m)
    self.assertIn('| zb_v | 2 | 2 |', text)

  def testCostRunsBatchedWeightsBesideTheDefault(self):
    out_dir = tempfile.mkdtemp()
    json_path = os.path.join(out_dir, 'cost.json')
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
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
    with contextlib.redirect_stdout(stdout):
      result = cli.main(['cost', '--quick', '--model', 'transformer',
                         '--no-batched_weight_gradients'])
    self.assertEqual(result, 0)
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
    headline = result['models']['transformer']['headline']
    for key in ('pipeline_overhead_fraction',
                'inline_micro_batch_cost_fraction', 'looping_speedup_K2',
                'looping_ours_over_lingvo_K2'):
      self.assertIsNotNone(headline[key], key)
    for c in configs:
      self.assertGreater(c['step_seconds'], 0)
      self.assertLen(c['all_step_seconds'], 1)
    base = [c for c in configs if c['impl'] == 'gpipe' and c['K'] == 1 and
            c['M'] == 1][0]
    self.assertAllClose(base['speedup_vs_gpipe_K1M1'], 1.0)
    self.assertEqual(result['models']['transformer']['headline']['best_M'] in
                     (1, 2), True)
    self.assertIn('Headline:', text)

  def testDataParallel(self):
    result, text, _ = self._Run('data_parallel', '--models', 'transformer')
    model = result['models']['transformer']
    self.assertEqual([(1, 1, 1), (1, 1, 2), (2, 1, 1)],
                     [(c['R'], c['K'], c['M']) for c in model['configs']])
    for c in model['configs']:
      self.assertGreater(c['step_seconds'], 0)
      self.assertGreaterEqual(c['tail_seconds'], 0)
      self.assertGreaterEqual(c['head_seconds'], 0)
      # Shares only where there is a second replica.
      self.assertEqual(c['R'] == 2, c['allreduce_share'] is not None)
    self.assertAllClose(model['configs'][0]['speedup_vs_R1K1M1'], 1.0)
    self.assertIsNotNone(model['headline']['speedup_R2K1'])
    self.assertIn('| 2 | 1 | 1 | 2 |', text)
    self.assertIn('Headline: R=2, K=1 runs', text)

  def testMemory(self):
    result, text, _ = self._Run('memory', '--models', 'transformer',
                                '--max_layers', '6')
    modes = result['models']['transformer']
    self.assertCountEqual(modes, ['naive-1', 'pipeline-1', 'pipeline-2'])
    for mode in modes.values():
      fit = mode['fit']
      if fit:
        # Fitting means parameters + measured step peak within the cap.
        self.assertLessEqual(fit['fits_bytes'], 4 * (1 << 20))
        self.assertGreater(fit['step_peak_bytes'], 0)
      if mode['first_not_fitting']:
        self.assertGreater(mode['first_not_fitting']['fits_bytes'],
                           4 * (1 << 20))
    self.assertIn('pipeline-1', text)

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
      self.assertLen(c['measured_bubbles'], 2)
      for b in c['measured_bubbles']:
        self.assertBetween(b, 0.0, 1.0)
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


if __name__ == '__main__':
  tf.test.main()
