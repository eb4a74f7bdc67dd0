"""A Transformer too big for one capped worker decodes on two.

Every worker process runs under a memory cap (``LocalCluster``'s
``memory_cap_bytes``, a cgroup each). The model's weights exceed the cap
less a worker's own footprint, and half of them do not: on one worker the
restore is killed by the cap, and the run fails with the error that names
the worker, its cap and what to do (no hang); on two workers, cut by weight
bytes, the pipelined decoder gives the unpipelined decoder's tokens and
each worker's peak stays under the cap and above its stage's weights.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import subprocess
import sys
import tempfile
import unittest

from gpipe.runtime import local_cluster
from gpipe.runtime import memory_cap
from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import decode_memory

MIB = 2**20
# About 95M float32 parameters (380 MiB), two thirds of them in the
# embedding and the softmax: [embedding, encoder] and [decoder, softmax]
# hold 182 and 198 MiB.
SHAPE = dict(vocab_size=32000, model_dim=1024, hidden_dim=4096, num_heads=16,
             num_layers=1, src_len=6, max_decode_len=4)
BATCH = 4
# A worker's own footprint (Python, TensorFlow, Lingvo, the gRPC server)
# and half the model fit; the whole model does not.
# One worker needs about 690 MiB (its ~330 MiB footprint and 362 MiB of
# weights), each of two about 495 MiB: the cap sits between with margin.
CAP = 600 * MIB


def _CgroupsMissing():
  try:
    memory_cap.ParentDirectory()
  except memory_cap.MemoryCapError as e:
    return str(e)
  return None


@unittest.skipIf(_CgroupsMissing(), _CgroupsMissing())
class DecodeMemoryCapTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checkpoint = os.path.join(tempfile.mkdtemp(), 'model')
    cls.reference, cls.weight_bytes = decode_memory.ReferenceDecode(
        SHAPE, BATCH, cls.checkpoint)

  def testAProcessOverItsCapIsKilledAndCounted(self):
    cap = memory_cap.MemoryCap('gpipe_test_%d' % os.getpid(), 64 * MIB)
    try:
      code = subprocess.call(cap.Command(
          [sys.executable, '-c', 'x = bytearray(%d)' % (128 * MIB)]))
      self.assertEqual(code, -9)
      self.assertEqual(cap.OomKills(), 1)
      self.assertLessEqual(cap.PeakBytes(), 64 * MIB)
    finally:
      cap.Remove()
    self.assertFalse(os.path.exists(cap.path))

  def testOneWorkerFailsClearly(self):
    self.assertGreater(self.weight_bytes, CAP // 2)
    with self.assertRaisesRegex(
        local_cluster.WorkerMemoryCapError,
        r'pipeline worker 0 \(pid \d+, localhost:\d+\) was killed by its '
        r'memory cap of 600 MiB .*more stages'):
      decode_memory.CappedDecode(SHAPE, 1, CAP, BATCH, self.checkpoint,
                                 steps=0, log=lambda *_: None)

  def testTwoWorkersDecodeTheUnpipelinedTokens(self):
    run = decode_memory.CappedDecode(SHAPE, 2, CAP, BATCH, self.checkpoint,
                                     steps=0, log=lambda *_: None)
    self.assertAllEqual(run['ids'], self.reference)
    self.assertEqual(run['M'], 2)  # The default: K lanes.
    self.assertEqual(sum(run['stage_weight_bytes']), self.weight_bytes)
    for peak, weights in zip(run['peak_bytes'], run['stage_weight_bytes']):
      self.assertLessEqual(peak, CAP)
      self.assertGreater(peak, weights)


if __name__ == '__main__':
  tf.test.main()
