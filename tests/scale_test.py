"""The 16-worker structure of T64_16384_32, small: trains across 16 processes.

The full run (``mt.T64Structure_Numbers``: 130 layers, 32 micro-batches) is a
benchmark (docs/BENCHMARKS.md, "Scale"); this stand-in has the same pipeline
shape (16 stages on 16 local worker processes) with 18 layers, in 2
micro-batches.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import math
import re
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib


# The trainer's own limit for one step (it names a stuck step), and the
# test's for the whole run (start-up, graph building, 2 steps and shutdown of
# 16 worker processes): both below the 900 s that Bazel gives a large test,
# so a slow run fails with a message instead of being killed.
STEP_TIMEOUT_SECS = 540
RUN_TIMEOUT_SECS = 780
# Micro-batches: 2, not the model's 16. Two micro-batches in flight already
# hand each stage's output to the next process while that stage takes the
# next one; more calls per pass prove nothing more, and the graph and the
# first step (3/4 of the run at 16) grow with them.
MICRO_BATCHES = 2


class ScaleTest(test_utils.TestCase):

  def testTrainsAcrossSixteenWorkerProcesses(self):
    logdir = tempfile.mkdtemp()
    proc = trainer_testlib.Run([
        '--model=mt.T64Structure_Tiny', '--logdir=' + logdir,
        '--worker_processes=16', '--num_micro_batches=%d' % MICRO_BATCHES,
        '--max_steps=2', '--log_every_n_steps=1',
        '--eval_after_train=false',
        '--step_timeout_secs=%d' % STEP_TIMEOUT_SECS], timeout=RUN_TIMEOUT_SECS)
    out = proc.stdout + proc.stderr
    self.assertEqual(proc.returncode, 0, out[-3000:])
    self.assertIn('started 16 worker processes', out)
    # 16 stages, stage k on worker task k.
    header = re.search(r'pipeline \S+: (\d+) stages, (\d+) micro-batches.*'
                       r'devices (.*)', out)
    self.assertIsNotNone(header, out[-3000:])
    self.assertEqual(header.group(1), '16')
    self.assertEqual(header.group(2), str(MICRO_BATCHES))
    devices = [d.strip() for d in header.group(3).split(',')]
    self.assertEqual(devices[:16], [
        '/job:worker/replica:0/task:%d/device:CPU:0' % k for k in range(16)])
    rows = re.findall(r'^\s*(\d+) \|\s+(\d+) \| (\S+) \.\. (\S+) \|', out,
                      re.MULTILINE)
    self.assertEqual([int(r[0]) for r in rows], list(range(16)))
    self.assertEqual(sum(int(r[1]) for r in rows), 18)  # 8 + 8, emb, softmax
    self.assertTrue(all(int(r[1]) >= 1 for r in rows))
    # Both steps ran and their losses are finite.
    losses = [float(x) for x in re.findall(r'loss[ =:]+([-+0-9.eE]+|nan|inf)',
                                           out)]
    self.assertNotEmpty(losses, out[-3000:])
    self.assertTrue(all(math.isfinite(x) for x in losses), losses)
    self.assertRegex(out, r'step\s*2\b')
    # Every worker's peak memory is reported.
    memory = re.search(r'worker peak memory \(VmHWM\):(.*)', out)
    self.assertIsNotNone(memory, out[-3000:])
    self.assertLen(re.findall(r'\d+(?:\.\d+)? ?[MG]i?B', memory.group(1)), 16)


if __name__ == '__main__':
  tf.test.main()
