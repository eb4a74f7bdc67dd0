"""`python -m tools.benchmark decode` at a tiny size (no speed checks)."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import tempfile

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
    for c in result['configs']:
      self.assertTrue(c['same_tokens'], c)
      self.assertGreater(c['sentences_per_second'], 0)
      if c['M'] is not None:
        # One idle fraction per device, beside the lane formula.
        self.assertLen(c['measured_bubbles'], c['K'])
        self.assertTrue(all(0 <= b < 1 for b in c['measured_bubbles']))
        self.assertGreaterEqual(c['formula_bubble'], 0)
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
