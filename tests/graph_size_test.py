"""The training graph grows with stages x micro-batches, not layers x M.

The session graph of a pipeline (forward, ``tf.gradients``) holds a few
call ops per stage and micro-batch; each layer adds its variables' reads
once. A change that adds ops per variable and micro-batch (e.g. summing the
weight gradients across micro-batches with one op per variable) makes the
128-layer, 32-micro-batch structure's graph, and its start-up, several times
bigger: these tests fail on it.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.benchmark import graph

# Ops the session graph may add per stage and micro-batch, whatever the
# stage's layers: the forward call, its backward call(s), the fork of the
# weights and the add of its weight gradients, the split and merge of the
# micro-batch and the hand-over.
MAX_OPS_PER_STAGE_AND_MICRO_BATCH = 12


def Ops(layers, stages, micro_batches):
  _, ops = graph._BuildSeconds(layers, stages, micro_batches, width=8,
                               batch=2 * micro_batches)
  return ops


class GraphSizeTest(test_utils.TestCase):

  def testOpsPerMicroBatchDoNotGrowWithLayers(self):
    stages = 2
    per_m = {}
    for layers in (4, 16):
      per_m[layers] = (Ops(layers, stages, 4) - Ops(layers, stages, 2)) / 2
    # 4x the layers and variables per stage, the same ops per micro-batch.
    self.assertEqual(per_m[4], per_m[16], per_m)
    self.assertLessEqual(per_m[16],
                         MAX_OPS_PER_STAGE_AND_MICRO_BATCH * stages, per_m)

  def testOpsPerLayerDoNotGrowWithMicroBatches(self):
    per_layer = {}
    for m in (2, 8):
      per_layer[m] = (Ops(16, 2, m) - Ops(4, 2, m)) / 12
    self.assertEqual(per_layer[2], per_layer[8], per_layer)


if __name__ == '__main__':
  tf.test.main()
