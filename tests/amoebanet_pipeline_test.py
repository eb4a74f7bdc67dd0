"""A pipelined tiny AmoebaNet equals the same layers run unpipelined."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import pipeline
from gpipe import xla
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks.image import cells
from tasks.image import network
from tasks.image import task
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import schedule_testlib

graph_rewrites.Off()
# Its compiled case's time is XLA compiling the stages, most of it in LLVM.
graph_rewrites.XlaWithoutLlvmOptimizations()

BATCH = 8
NUM_CLASSES = 5


def _TinyNet():
  # stem_filters: the output channels of the first cell (4 filters x the 4
  # states a D normal cell concatenates), see _Layers.
  return network.AmoebaNetParams().Set(
      genotype='D', num_cells=3, filters=4, num_classes=NUM_CLASSES,
      image_size=8, in_channels=1, stem='cifar', stem_filters=16,
      aux_hidden_dim=8, aux_features_dim=16, drop_path_keep_prob=0.6,
      dropout_keep_prob=0.7)


def _Layers():
  """Two cells of the tiny net with the aux head between them.

  The stem, reduction_1, the aux head, stack_1_cell_0 (a normal cell after a
  reduction cell: it reduces its previous state) and the classifier: every
  kind of layer of the net, 2 cells to build, trace, compile and
  differentiate instead of 5. The cells left out add no op: the first normal
  cell adjusts its inputs by 1x1 convolutions as the reduction cell does and
  runs the operations of the other normal cell; the third stack repeats the
  second. The stem has the first cell's output channels, so the reduction
  cell and the normal cell keep their params; the heads are sized for the
  cells before them.

  Returns:
    The list of layer params.
  """
  net = _TinyNet()
  by_name = {p.name: p.Copy() for p in network.LayerParams(net)}
  stem, reduction = by_name['stem'], by_name['reduction_1']
  cell = by_name['stack_1_cell_0']
  shapes = network.InputShapes(net, BATCH // 2)
  for p in (stem, reduction):
    shapes = p.cls.FPropMeta(p, *shapes).out_shapes
  _, height, width, dim = shapes[0].ToTensorShape().as_list()
  aux = by_name['aux_head'].Set(in_dim=dim, height=height, width=width)
  classifier = by_name['classifier'].Set(
      in_dim=cells.CellLayer.OutDim(cell))
  return [stem, reduction, aux, cell, classifier]


class AmoebaNetPipelineTest(test_utils.TestCase):
  """2 stages on 2 virtual CPUs, 2 micro-batches, drop path and dropout on.

  In float64, so the comparison is exact up to summation order. The
  unpipelined reference does not depend on compilation: the first case
  computes it (a graph of the layers on each micro-batch and its gradients),
  the other compares with its values (pipeline_testlib.CachedReference), the
  initial values the same by the graph seed.
  """

  def testSameLossAndGradientsAsUnpipelined(self):
    self._AssertSameAsUnpipelined(compile_mode=None)

  def testCompiledByXlaSameLossAndGradientsAsUnpipelined(self):
    # The stages' convolutions, batch norms, drop path and dropout compiled
    # by XLA against the uncompiled unpipelined layers: the same masks and
    # the same mathematics.
    self._AssertSameAsUnpipelined(compile_mode='xla')

  def _AssertSameAsUnpipelined(self, compile_mode):
    layers = _Layers()
    names = [l.name for l in layers]
    # Cut so that the aux head is in stage 0: its logits must travel through
    # stage 1 to the output.
    sizes = [names.index('aux_head') + 1, len(names) - names.index('aux_head')
             - 1]
    with self.session(
        graph=tf.Graph(),
        config=graph_rewrites.CpuConfig(2)) as sess:
      tf.random.set_seed(1)
      py_utils.GetOrCreateGlobalStepVar()
      net = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=layers, num_stages=2, stage_sizes=sizes,
          num_micro_batches=2, dtype=tf.float64, compile=compile_mode,
          stage_devices=graph_rewrites.CpuDevices(2)).Instantiate()
      rng = np.random.RandomState(0)
      images = tf.constant(rng.randn(BATCH, 8, 8, 1))
      labels = tf.constant(rng.randint(0, NUM_CLASSES, [BATCH]), tf.int32)
      variables = [v for v in net.vars.Flatten() if v.trainable]

      def LossAndGrads(fprop):
        logits, aux_logits = fprop(net.theta, images)
        loss = tf.reduce_mean(
            task.SmoothedCrossEntropy(logits, labels, NUM_CLASSES, 0.1)
        ) + 0.4 * tf.reduce_mean(
            task.SmoothedCrossEntropy(aux_logits, labels, NUM_CLASSES, 0.1))
        return loss, tf.gradients(loss, variables)

      loss_p, grads_p = LossAndGrads(net.FProp)
      cache, refs = pipeline_testlib.CachedReference(self, 'tiny')
      if refs is None:
        reference = LossAndGrads(net.FPropUnpipelined)
      calls = list(schedule_testlib.CallOps(sess.graph).values())
      self.assertNotEmpty(calls)
      for op in calls:
        self.assertEqual(compile_mode == 'xla', xla.IsCompiled(op), op.name)
      sess.run(tf.global_variables_initializer())
      if refs is None:
        (loss, grads), refs = sess.run([(loss_p, grads_p), reference])
        cache['tiny'] = refs
      else:
        loss, grads = sess.run((loss_p, grads_p))
    self.assertEqual(net.stage_sizes, sizes)
    self.assertAllClose(loss, refs[0], rtol=1e-10)
    self.assertLen(grads, len(variables))
    self.assertLen(refs[1], len(variables))
    for v, gp, gu in zip(variables, grads, refs[1]):
      self.assertAllClose(gp, gu, rtol=1e-9, atol=1e-10, msg=v.name)
    # Every weight gets a gradient (nothing disconnected by the cut).
    self.assertTrue(all(np.any(g != 0) for g in grads))

  def testFlopsPartitionUsesFPropMeta(self):
    net = _TinyNet()
    p = pipeline.PipeliningLayer.Params().Set(
        name='pipe', layers=_Layers(), num_stages=2,
        num_micro_batches=2, partition_cost='flops',
        input_shapes=network.InputShapes(net, BATCH // 2),
        stage_devices=graph_rewrites.CpuDevices(2))
    with tf.Graph().as_default():
      layer = p.Instantiate()
      self.assertLen(layer.stage_sizes, 2)
      self.assertIn('flops', layer.PartitionReport())


if __name__ == '__main__':
  tf.test.main()
