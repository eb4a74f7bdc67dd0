"""ImageClassificationTask: Lingvo train op over a pipelined AmoebaNet."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import pipeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import base_model
from lingvo.core import cluster_factory
from lingvo.core import test_utils
from tasks.image import inputs
from tasks.image import network
from tasks.image import task
from tests import graph_rewrites

graph_rewrites.Off()

BATCH, NUM_MICRO_BATCHES = 8, 2


def _OneCellAndHeads(net, micro_batch):
  """The stem, first cell, aux head and classifier of AmoebaNet `net`.

  What this file tests (the task's losses, Lingvo's train op through the
  pipeline, the micro-batch batch norm averages) does not depend on the
  depth: with one cell instead of the five of the smallest AmoebaNet, the
  training step's test takes about a quarter of the time. The heads are
  sized for the cell's output.

  Args:
    net: network.AmoebaNetParams.
    micro_batch: examples per micro-batch.

  Returns:
    A list of layer params.
  """
  layers = network.LayerParams(net)
  kept = layers[:2]
  shapes = network.InputShapes(net, micro_batch)
  for p in kept:
    shapes = p.cls.FPropMeta(p, *shapes).out_shapes
  _, height, width, dim = shapes[0].ToTensorShape().as_list()
  aux, classifier = [p for p in layers if p.name == 'aux_head'] + layers[-1:]
  return kept + [aux.Set(in_dim=dim, height=height, width=width),
                 classifier.Set(in_dim=dim)]


def _ModelParams():
  net = network.AmoebaNetParams().Set(
      genotype='D', num_cells=3, filters=4, num_classes=10, image_size=8,
      in_channels=1, stem='cifar', stem_filters=8, aux_hidden_dim=8,
      aux_features_dim=16, bn_decay=0.5)
  task_p = task.ImageClassificationTask.Params().Set(
      name='classifier', num_classes=10,
      network=pipeline.PipeliningLayer.Params().Set(
          layers=_OneCellAndHeads(net, BATCH // NUM_MICRO_BATCHES),
          num_stages=2, num_micro_batches=NUM_MICRO_BATCHES,
          stage_devices=graph_rewrites.CpuDevices(2)))
  task_p.input = inputs.DigitsInput.Params().Set(image_size=8,
                                                 batch_size=BATCH)
  task_p.train.learning_rate = 1e-3
  return base_model.SingleTaskModel.Params(task_p).Set(name='model')


class ImageTaskTest(test_utils.TestCase):
  """Training steps through Lingvo's own train op."""

  def testTrainStepUpdatesWeightsAndBatchNormAverages(self):
    with self.session(
        graph=tf.Graph(),
        config=graph_rewrites.CpuConfig(2)) as sess:
      with cluster_factory.ForTestingWorker(cpus=2, split_size=2):
        model = _ModelParams().Instantiate()
        model.ConstructFPropBPropGraph()
      t = model.GetTask()
      metrics = t.eval_metrics
      stem = t.network.children['layer_000']
      moving_mean = stem.bn.vars.moving_mean
      weight = stem.conv.vars.w
      sess.run(tf.global_variables_initializer())
      before = sess.run([moving_mean, weight])
      for _ in range(2):
        _, values = sess.run([t.train_op, {k: v[0] for k, v in
                                           metrics.items()}])
      after = sess.run([moving_mean, weight])
    for key in ('loss', 'classifier_loss', 'aux_loss', 'accuracy'):
      self.assertTrue(np.isfinite(values[key]), key)
    # loss = classifier loss + 0.4 x aux loss.
    self.assertAllClose(values['loss'],
                        values['classifier_loss'] + 0.4 * values['aux_loss'])
    self.assertNotAllClose(before[1], after[1])
    # Micro-batch batch norm averages move although Lingvo's train op only
    # runs the updates whose statistic the loss depends on.
    self.assertNotAllClose(before[0], after[0])

  def testSmoothedCrossEntropy(self):
    with self.session(graph=tf.Graph()):
      logits = tf.constant([[2.0, 0.0, -1.0]])
      plain = task.SmoothedCrossEntropy(logits, tf.constant([0]), 3, 0.0)
      smooth = task.SmoothedCrossEntropy(logits, tf.constant([0]), 3, 0.3)
      log_p = tf.nn.log_softmax(logits)[0]
      plain, smooth, log_p = self.evaluate([plain, smooth, log_p])
    self.assertAllClose(plain[0], -log_p[0])
    targets = np.array([0.8, 0.1, 0.1])
    self.assertAllClose(smooth[0], -(targets * log_p).sum())

  def testNetworkRequired(self):
    with self.assertRaisesRegex(ValueError, 'needs p.network'):
      task.ImageClassificationTask.Params().Set(name='t').Instantiate()


if __name__ == '__main__':
  tf.test.main()
