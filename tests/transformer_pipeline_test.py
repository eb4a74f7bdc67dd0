"""The Transformer through the GPipe pipeline equals its unpipelined run."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl.testing import parameterized
import numpy as np
from gpipe import pipeline
from gpipe import xla
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks.mt import stack
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import schedule_testlib

graph_rewrites.Off()
graph_rewrites.XlaWithoutLlvmOptimizations()

_B, _S, _T, _V = 8, 5, 6, 23
# Micro-batches: two already run each stage on one while the next stage runs
# the other, with their own dropout masks; more add calls of the same
# functions, and micro-batch copies of the unpipelined reference.
_M = 2
_DEVICES = graph_rewrites.CpuDevices(2)


def _Batch():
  rng = np.random.RandomState(0)
  tgt_paddings = np.zeros([_B, _T], np.float32)
  tgt_paddings[::3, 4:] = 1.0
  src_paddings = np.zeros([_B, _S], np.float32)
  src_paddings[1::2, 3:] = 1.0
  return py_utils.NestedMap(
      src_ids=tf.constant(rng.randint(4, _V, [_B, _S]), tf.int32),
      src_paddings=tf.constant(src_paddings),
      tgt_ids=tf.constant(rng.randint(4, _V, [_B, _T]), tf.int32),
      tgt_paddings=tf.constant(tgt_paddings),
      tgt_labels=tf.constant(rng.randint(4, _V, [_B, _T]), tf.int32),
      tgt_weights=tf.constant(1.0 - tgt_paddings))


class TransformerPipelineTest(test_utils.TestCase, parameterized.TestCase):
  """2 stages, 2 micro-batches (_M), against the unpipelined layers.

  The unpipelined reference does not depend on the cut or on compilation:
  the first case computes it (a graph of the layers on each micro-batch and
  its gradients), the others compare with its values
  (pipeline_testlib.CachedReference), the initial values the same by the
  graph seed.
  """

  @parameterized.named_parameters(
      # 'flops' cuts inside the decoder; [3, 3] cuts between encoder and
      # decoder, so the target states pass untouched through stage 0.
      ('CutByFlops', None),
      ('CutAfterEncoder', [3, 3]),
      # XLA-compiled stages against the uncompiled unpipelined layers, with
      # dropout: the same masks, float32 rounding apart.
      ('CompiledByXla', None, 'xla'))
  def testPipelinedLossAndGradientsEqualUnpipelined(self, stage_sizes,
                                                    compile_mode=None):
    layer_list = stack.EncoderDecoderLayers(
        vocab_size=_V, model_dim=16, hidden_dim=32, num_heads=2, num_layers=2,
        dropout_prob=0.2, logits_abs_max=10.0)
    micro = _B // _M
    shapes = [{
        'src_ids': [micro, _S], 'src_paddings': [micro, _S],
        'tgt_ids': [micro, _T], 'tgt_paddings': [micro, _T],
        'tgt_labels': [micro, _T], 'tgt_weights': [micro, _T]
    }]
    p = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=layer_list, num_stages=2, num_micro_batches=_M,
        stage_devices=_DEVICES, partition_cost='flops', input_shapes=shapes,
        stage_sizes=stage_sizes, compile=compile_mode)
    config = graph_rewrites.CpuConfig(2)
    with self.session(graph=tf.Graph(), config=config) as sess:
      tf.random.set_seed(5)
      py_utils.GetOrCreateGlobalStepVar()
      net = p.Instantiate()
      self.assertEqual(net.num_stages, 2)
      if stage_sizes:
        self.assertEqual(net.stage_sizes, stage_sizes)
      batch = _Batch()

      def LossAndGrads(fprop):
        out = fprop(net.theta, batch)
        loss = tf.reduce_sum(out.xent) / tf.reduce_sum(out.weight)
        return loss, [tf.convert_to_tensor(g)
                      for g in tf.gradients(loss, net.vars.Flatten())]

      pipelined = LossAndGrads(net.FProp)
      cache, refs = pipeline_testlib.CachedReference(self, ('M', _M))
      if refs is None:
        reference = LossAndGrads(net.FPropUnpipelined)
      calls = list(schedule_testlib.CallOps(sess.graph).values())
      self.assertNotEmpty(calls)
      for op in calls:
        self.assertEqual(compile_mode == 'xla', xla.IsCompiled(op), op.name)
      sess.run(tf.global_variables_initializer())
      if refs is None:
        (pipelined_loss, pipelined_grads), refs = sess.run(
            [pipelined, reference])
        cache['M', _M] = refs
      else:
        pipelined_loss, pipelined_grads = sess.run(pipelined)
    plain_loss, plain_grads = refs
    self.assertAllClose(pipelined_loss, plain_loss, rtol=1e-5)
    self.assertGreater(pipelined_loss, 1.0)
    self.assertLen(pipelined_grads, len(net.vars.Flatten()))
    self.assertLen(plain_grads, len(pipelined_grads))
    for a, b in zip(pipelined_grads, plain_grads):
      self.assertAllClose(a, b, rtol=1e-4, atol=1e-6)
    self.assertGreater(max(np.abs(g).max() for g in plain_grads), 1e-3)


if __name__ == '__main__':
  tf.test.main()
