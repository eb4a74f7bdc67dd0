"""Pipelined decoding across worker processes equals the unpipelined decoder.

The copy model of ``decode_testlib`` (trained with K=2 in this process)
decodes with K = 2 and 4 stages on 4 local TensorFlow worker processes, one
stage each, in M = 1, 2 and 4 lanes, greedily and with beam search; the
workers' peak memory is read. (K = 1, one stage, crosses no process:
pipelined_decode_test decodes it in every M.)
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import xla
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import decode_testlib as dt
from tests import graph_rewrites

graph_rewrites.Off()


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

  def _AssertDecodesMatch(self, k):
    dt.AssertDecodesMatch(self, self.checkpoint, self.cluster.devices[:k],
                          target=self.cluster.target)

  def testTwoStages(self):
    self._AssertDecodesMatch(2)

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
    self._AssertDecodesMatch(4)
    peaks = self.cluster.PeakRssBytes()
    self.assertLen(peaks, 4)
    self.assertTrue(all(p is None or p > 0 for p in peaks), peaks)


if __name__ == '__main__':
  tf.test.main()
