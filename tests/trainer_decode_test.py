"""The trainer evaluates and decodes a pipelined Transformer through its stages.

``mt.NumbersTiny`` (the number corpus, 2 stages) trains a few steps; then
``--mode=eval`` runs the forward-only schedule, and ``--mode=decode`` decodes
pipelined by default: the same outputs and BLEU as ``--nopipelined_decode``,
in this process's virtual CPUs and across worker processes; a number of
lanes that does not divide the batch is refused.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re

from lingvo import compat as tf
from lingvo.core import test_utils
from tests.trainer_testlib import RunInProcess

MODEL = 'mt.NumbersTiny'
STEPS = 40


class TrainerDecodeTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.logdir = os.path.join(
        os.environ.get('TEST_TMPDIR', '/tmp'), 'trainer_decode_test_%d' %
        os.getpid())
    code, _, err = RunInProcess(
        model=MODEL, logdir=cls.logdir, max_steps=STEPS,
        eval_after_train=False, trace_every_n_steps=0, log_every_n_steps=20)
    assert code == 0, err

  def _Decode(self, **flags):
    code, out, err = RunInProcess(model=MODEL, logdir=self.logdir,
                                  mode='decode', decode_max_batches=2, **flags)
    self.assertEqual(0, code, err)
    bleu = float(re.search(r'decode Test at step %d \(2 batches\): bleu '
                           r'([\d.]+)' % STEPS, out).group(1))
    path = os.path.join(self.logdir, 'decode_test',
                        'decode_out_%d.txt' % STEPS)
    with open(path) as f:
      lines = f.readlines()
    self.assertLen(lines, 2 * 32)
    return bleu, lines

  def testDecodeIsPipelinedByDefaultAndEqualsTheUnpipelinedDecoder(self):
    bleu, lines = self._Decode()
    ref_bleu, ref_lines = self._Decode(pipelined_decode=False)
    self.assertEqual(ref_lines, lines)
    self.assertEqual(ref_bleu, bleu)
    # Some hypotheses are not empty: the comparison means something.
    self.assertTrue(any(line.split('\t')[1].strip() for line in lines))
    # Across 2 worker processes, in 2 lanes.
    worker_bleu, worker_lines = self._Decode(worker_processes=2,
                                             decode_micro_batches=2)
    self.assertEqual(ref_lines, worker_lines)
    self.assertEqual(ref_bleu, worker_bleu)

  def testEvalRunsTheForwardOnlyPipeline(self):
    code, out, err = RunInProcess(model=MODEL, logdir=self.logdir,
                                  mode='eval')
    self.assertEqual(0, code, err)
    self.assertRegex(out, r'eval Test at step %d \(ckpt-%d, 160 examples\): '
                     r'accuracy [\d.]+' % (STEPS, STEPS))

  def testLanesThatDoNotDivideTheBatchAreRefused(self):
    code, _, err = RunInProcess(model=MODEL, logdir=self.logdir,
                                mode='decode', decode_micro_batches=3)
    self.assertEqual(1, code)
    self.assertIn('decode_micro_batches=3 does not divide the batch of 32 '
                  'examples', err)
    code, _, err = RunInProcess(model='image.AmoebaNetD_Digits',
                                logdir=self.logdir + '_digits', mode='decode',
                                decode_micro_batches=2)
    self.assertEqual(1, code)
    self.assertIn('has no pipelined decoder', err)


if __name__ == '__main__':
  tf.test.main()
