"""A tiny registered model for the trainer's tests: a pipelined MLP on digits.

``toy.PipelinedDigitsMlp``: scikit-learn's 8x8 digits flattened to 64
features, four dense+dropout layers cut into 2 pipeline stages x 4
micro-batches, softmax classifier. It trains in seconds on a CPU, so the
trainer's checkpoint/resume, summaries, errors and worker-process tests run
quickly without depending on the bigger image and translation models.
In float64 (for tests that compare runs to 1e-10): ``FLOAT64_OVERRIDE``.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
import numpy as np
from lingvo import compat as tf
from lingvo import model_registry
from lingvo.core import base_model
from lingvo.core import base_model_params
from lingvo.core import metrics as metrics_lib
from lingvo.core import optimizer
from lingvo.core import py_utils
from lingvo.core import schedule
from tasks import dataset_input
from tasks import dense
from tasks.image import task as image_task


# --model_params_override text of the model in float64: weights, features,
# activations and the loss.
FLOAT64_OVERRIDE = 'task.dtype=float64; input.feature_dtype=float64'


class FlatDigitsInput(dataset_input.DatasetInput):
  """scikit-learn digits as 64 features in [0, 1] and an int label."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('split', 'train', "'train' or 'test'.")
    p.Define('num_test', 360, 'Digits held out for the test split (of 1,797).')
    p.Define('feature_dtype', 'float32', "The features' numpy dtype name.")
    return p

  def Examples(self):
    """The digits of `p.split` (a fixed permutation holds out the test set)."""
    p = self.params
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    if p.split not in ('train', 'test'):
      raise ValueError("%s: split must be 'train' or 'test', got %r" %
                       (p.name, p.split))
    digits = datasets.load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    chosen = order[:p.num_test] if p.split == 'test' else order[p.num_test:]
    features = (digits.data[chosen] / 16.0).astype(p.feature_dtype)
    labels = digits.target[chosen].astype(np.int32)
    return tf.data.Dataset.from_tensor_slices({
        'features': features,
        'label': labels
    })

  def ExampleSpecs(self):
    """One example as Examples() yields it (for p.stand_in)."""
    return {'features': tf.TensorSpec([64], tf.as_dtype(
        self.params.feature_dtype)),
            'label': tf.TensorSpec([], tf.int32)}


class ToyClassificationTask(base_model.BaseTask):
  """Softmax classification of `features` into `label` by `p.network`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('network', None, 'features -> logits (a PipeliningLayer).')
    p.Define('num_classes', 10, 'Classes.')
    return p

  def __init__(self, params):
    super().__init__(params)
    network = self.params.network.Copy()
    # Each micro-batch's loss in the last stage: every schedule can run.
    network.loss_tpl = image_task.ImageLossLayer.Params().Set(
        num_classes=self.params.num_classes, label_smoothing=0.0)
    self.CreateChild('network', network)

  def ComputePredictions(self, theta, input_batch):
    """NestedMap(logits=[batch, num_classes], xent=[batch], ...)."""
    # int64 labels: int32 ones would enter the last stage in host memory on
    # a GPU (see tasks.image.task.ImageClassificationTask).
    return self.network.FProp(
        theta.network, input_batch.features,
        targets=py_utils.NestedMap(
            label=tf.cast(input_batch.label, tf.int64)))

  def ComputeLoss(self, theta, predictions, input_batch):
    """Mean cross entropy and accuracy, as Lingvo (value, weight) pairs."""
    labels = tf.cast(input_batch.label, tf.int32)
    xent = predictions.per_example_loss
    correct = tf.cast(
        tf.equal(tf.argmax(predictions.logits, -1, output_type=tf.int32),
                 labels), tf.float32)
    batch = tf.cast(tf.shape(labels)[0], tf.float32)
    return {
        'loss': (tf.reduce_mean(xent), batch),
        'accuracy': (tf.reduce_mean(correct), batch),
    }, {'correct': correct}

  def Decode(self, input_batch):
    """Predicted and true classes."""
    logits = self.ComputePredictions(self.theta, input_batch).logits
    return {
        'predicted': tf.argmax(logits, -1, output_type=tf.int32),
        'label': tf.cast(input_batch.label, tf.int32),
    }

  def CreateDecoderMetrics(self):
    return {
        'accuracy': metrics_lib.AverageMetric(),
        'num_samples_in_batch': metrics_lib.AverageMetric(),
    }

  def PostProcessDecodeOut(self, decode_out_dict, decode_metrics_dict):
    """Adds one decoded batch to the metrics; returns (key, text) pairs."""
    predicted, labels = decode_out_dict['predicted'], decode_out_dict['label']
    n = len(labels)
    decode_metrics_dict['accuracy'].Update(float(np.mean(predicted == labels)),
                                           n)
    decode_metrics_dict['num_samples_in_batch'].Update(n)
    return [('example', 'predicted %d label %d' % (p, l))
            for p, l in zip(predicted, labels)]


@model_registry.RegisterSingleTaskModel
class PipelinedDigitsMlp(base_model_params.SingleTaskModelParams):
  """64-64-64-64-10 MLP with dropout, 2 stages x 4 micro-batches, Adam."""
  BATCH_SIZE = 32
  HIDDEN = 64
  NUM_LAYERS = 4
  KEEP_PROB = 0.9

  def Train(self):
    return FlatDigitsInput.Params().Set(
        split='train', batch_size=self.BATCH_SIZE, shuffle_buffer=2000)

  def Test(self):
    return FlatDigitsInput.Params().Set(
        split='test', batch_size=40, shuffle_buffer=0, repeat=False)

  def Task(self):
    layers = []
    for i in range(self.NUM_LAYERS):
      last = i == self.NUM_LAYERS - 1
      layers.append(dense.DenseLayer.Params().Set(
          name='dense%d' % i, input_dim=64 if i == 0 else self.HIDDEN,
          output_dim=10 if last else self.HIDDEN,
          activation='NONE' if last else 'RELU',
          params_init=py_utils.WeightInit.Xavier(1.0),
          keep_prob=1.0 if last else self.KEEP_PROB))
    net = pipeline.PipeliningLayer.Params().Set(
        name='network', layers=layers, num_stages=2, num_micro_batches=4,
        partition_cost='uniform')
    p = ToyClassificationTask.Params().Set(name='toy', network=net)
    tp = p.train
    tp.optimizer = optimizer.Adam.Params()
    tp.learning_rate = 0.01
    tp.lr_schedule = schedule.CosineSchedule.Params().Set(
        initial_value=1.0, final_value=0.1, total_steps=200)
    tp.max_steps = 200
    return p

