"""Pipelined decoding across worker processes equals the unpipelined decoder.

The copy model of ``decode_testlib`` (trained with K=2 in this process)
decodes on 4 local TensorFlow worker processes, one stage each, greedily and
with beam search: K = 2 in M = 1 lane (one stage waits for the other) and
M = 2 (a lane per stage, the default), also with XLA-compiled stages, and
K = 4 on all four in M = 4; the workers' peak memory is read. Every other
(K, M) builds the same graph as one of these on other devices, and
pipelined_decode_test decodes it in process: K = 1 (which crosses no
process), K = 2 in M = 4 (with early stopping, uniform and with a decode
cut) and K = 4 in M = 1 and 2. A lane count is the number of call ops per
stage and step in one loop body whatever the devices; what crossing
processes adds (the carry and the tokens sent between workers, each
worker's order of its calls) is there in each of these.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import xla
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import decode_testlib as dt
from tests import graph_rewrites

graph_rewrites.Off()
# Set before the workers start, which compile the XLA case's stages: what it
# checks (a step XLA can compile on a Grappler worker, the unpipelined
# decoder's tokens) does not depend on LLVM's optimizations.
graph_rewrites.XlaWithoutLlvmOptimizations()


class PipelinedDecodeWorkersTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checkpoint = dt.TrainedCheckpoint()
    cls.cluster = local_cluster.LocalCluster(4)

  @classmethod
  def tearDownClass(cls):
    cls.cluster.Stop()
    super().tearDownClass()

  def _AssertDecodesMatch(self, k, lanes):
    dt.AssertDecodesMatch(self, self.checkpoint, self.cluster.devices[:k],
                          lanes=lanes, target=self.cluster.target)

  def testTwoStages(self):
    self._AssertDecodesMatch(2, lanes=(1, 2))

  def testTwoStagesCompiledByXlaUnderGrappler(self):
    # Worker sessions run Grappler; xla.SessionConfig keeps its remapper
    # from fusing a decoding step's batch matmul and add into a oneDNN op
    # that XLA cannot compile (the step then failed on the worker).
    graph, _ = dt.AssertDecodesMatch(
        self, self.checkpoint, self.cluster.devices[:2], lanes=(2,),
        target=self.cluster.target, config=xla.SessionConfig(),
        compile_mode='xla')
    steps = [fn for fn in graph.graph.as_graph_def().library.function
             if fn.signature.name.startswith('__inference_stage') and
             '_D_' in fn.signature.name]
    self.assertNotEmpty(steps)
    for fn in steps:
      self.assertTrue(fn.attr[xla.MUST_COMPILE_ATTR].b, fn.signature.name)

  def testFourStages(self):
    # M = 4: every worker busy at once (M = 1 and 2:
    # pipelined_decode_test.testFourStagesOneOfThemEncoderOnly).
    self._AssertDecodesMatch(4, lanes=(4,))
    peaks = self.cluster.PeakRssBytes()
    self.assertLen(peaks, 4)
    self.assertTrue(all(p is None or p > 0 for p in peaks), peaks)


if __name__ == '__main__':
  tf.test.main()
