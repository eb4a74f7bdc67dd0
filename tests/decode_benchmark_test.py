"""`python -m tools.benchmark decode` at a tiny size (no speed checks).

Its figures are checked against each other, not against a speed: the
throughput and the per-token latency are the timed decode's, the speed-ups
are over the best K=1 configuration, the lane formula is the loop's.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile

from gpipe.schedules import decode_lanes
from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import cli

PNG_MAGIC = b'\x89PNG'


class DecodeBenchmarkTest(test_utils.TestCase):

  def testDecodeReportsEveryConfigurationWithTheSameTokens(self):
    out_dir = tempfile.mkdtemp()
    paths = {name: os.path.join(out_dir, name)
             for name in ('d.json', 'd.png', 'timeline.png')}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      cli.main(['decode', '--quick', '--json', paths['d.json'], '--plot',
                paths['d.png'], '--timeline', paths['timeline.png']])
    text = stdout.getvalue()
    with open(paths['d.json']) as f:
      result = json.load(f)
    for name in ('d.png', 'timeline.png'):
      with open(paths[name], 'rb') as f:
        self.assertEqual(f.read(4), PNG_MAGIC)
    self.assertEqual(result['markdown'], text.strip('\n'))
    self.assertIn('Machine:', text)
    got = {(c['K'], c['M'], c['beam']) for c in result['configs']}
    self.assertEqual(got, {(k, m, b) for b in (1, 2) for k, m in (
        (1, None), (1, 2), (2, 2))})
    steps = result['settings']['max_decode_len']
    for c in result['configs']:
      self.assertTrue(c['same_tokens'], c)
      # Sentences per second and milliseconds per token: of the timed
      # decode of the batch, of its steps.
      self.assertGreater(c['seconds'], 0)
      self.assertAllClose(c['sentences_per_second'] * c['seconds'],
                          c['batch'], rtol=1e-9, atol=0)
      self.assertAllClose(c['ms_per_token'], 1e3 * c['seconds'] / steps,
                          rtol=1e-9, atol=0)
      if c['M'] is not None:
        # One idle fraction per device, beside the lane formula of the
        # loop's devices (none idles alone: K=1), and the lane schedule
        # with the traced task times (on one device nothing waits).
        self.assertLen(c['measured_bubbles'], c['K'])
        self.assertTrue(all(0 <= b < 1 for b in c['measured_bubbles']))
        self.assertAllClose(
            c['formula_bubble'],
            decode_lanes.BubbleFraction(c['K'], c['M'], steps), rtol=1e-12,
            atol=0)
        self.assertLen(c['timed_model_bubbles'], c['K'])
        if c['K'] == 1:
          self.assertEqual(c['formula_bubble'], 0.0)
          self.assertAllClose(c['timed_model_bubbles'], [0.0], atol=1e-9)
        self.assertGreater(c['loop_seconds'], 0)
        self.assertGreater(c['encoder_seconds'], 0)
    # Speed-ups over the best K=1 configuration of the same search: that
    # one's is 1, the others' the ratio of their sentences per second, as
    # the table says.
    for beam in (1, 2):
      configs = [c for c in result['configs'] if c['beam'] == beam]
      best = max(c['sentences_per_second'] for c in configs if c['K'] == 1)
      for c in configs:
        self.assertAllClose(c['speedup_over_best_k1'],
                            c['sentences_per_second'] / best, rtol=1e-12,
                            atol=0)
        self.assertIn('%.2fx' % c['speedup_over_best_k1'], text)
      self.assertEqual(max(c['speedup_over_best_k1'] for c in configs
                           if c['K'] == 1), 1.0)
    # K=2 also with the decoder cut at whole layers (--whole_layer_lanes).
    whole = [c for c in result['configs'] if c['whole_layers']]
    self.assertEqual({(c['K'], c['M'], c['beam']) for c in whole},
                     {(2, 2, 1), (2, 2, 2)})
    for c in whole:
      self.assertEqual(c['lead_parts'], [0] * len(c['stage_sizes']))
      self.assertIn('%d, whole layers' % c['M'], text)
    self.assertEqual(sorted(result['worker_peak_rss_bytes']), ['1', '2'])


if __name__ == '__main__':
  tf.test.main()
