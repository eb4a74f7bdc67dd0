"""Image classification task: a (pipelined) network, label-smoothed loss.

The network child (usually a gpipe PipeliningLayer over
`tasks.image.network.LayerParams`) maps images to logits, or to
``(logits, aux_logits)`` when the network has an auxiliary head. The loss is
the label-smoothed softmax cross entropy of the logits plus
``aux_loss_weight`` times that of the auxiliary logits.

When the network is a PipeliningLayer, the task ends it with
``ImageLossLayer`` (its ``loss_tpl``): each micro-batch's per-example loss is
computed in the last stage, from the labels the pipeline carries there, so
every schedule (1F1B, interleaved, zero bubble) can start a micro-batch's
backward right after its forward. The task averages the merged per-example
losses. The loss layer has no variables: checkpoints are unchanged.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import metrics as metrics_lib
from lingvo.core import py_utils


def SmoothedCrossEntropy(logits, labels, num_classes, label_smoothing):
  """Per-example softmax cross entropy against label-smoothed targets.

  Args:
    logits: [batch, num_classes].
    labels: [batch] integer class ids.
    num_classes: number of classes.
    label_smoothing: mass spread uniformly over all classes (0: one-hot).

  Returns:
    [batch] float losses.
  """
  targets = tf.one_hot(labels, num_classes, dtype=logits.dtype)
  if label_smoothing:
    targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return tf.nn.softmax_cross_entropy_with_logits(
      labels=tf.stop_gradient(targets), logits=logits)


class ImageLossLayer(base_layer.BaseLayer):
  """Per-example classification losses at the end of a pipeline.

  FProp(theta, logits[, aux_logits], targets) with targets a NestedMap with
  'label' [batch] returns NestedMap(logits, per_example_loss, xent) (and
  aux_logits, aux_xent with an auxiliary head): per_example_loss is xent +
  aux_loss_weight * aux_xent, so its mean is the task's loss.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_classes', 1000, 'Classes.')
    p.Define('label_smoothing', 0.1, 'Label smoothing of the loss.')
    p.Define('aux_loss_weight', 0.4, 'Weight of the auxiliary head loss.')
    return p

  def FProp(self, theta, *args):
    p = self.params
    *logits, targets = args
    # int64: int32 labels would sit in host memory on a GPU (see
    # ImageClassificationTask.ComputePredictions).
    labels = tf.cast(targets.label, tf.int64)
    out = py_utils.NestedMap(logits=logits[0])
    out.xent = SmoothedCrossEntropy(logits[0], labels, p.num_classes,
                                    p.label_smoothing)
    out.per_example_loss = out.xent
    if len(logits) == 2:
      out.aux_logits = logits[1]
      out.aux_xent = SmoothedCrossEntropy(logits[1], labels, p.num_classes,
                                          p.label_smoothing)
      out.per_example_loss = out.xent + p.aux_loss_weight * out.aux_xent
    elif len(logits) != 1:
      raise ValueError('The network must return logits or (logits, '
                       'aux_logits); got %d outputs' % len(logits))
    return out


class ImageClassificationTask(base_model.BaseTask):
  """Classifies `input_batch.image` into `input_batch.label`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('network', None,
             'Params of the network layer: images -> logits or '
             '(logits, aux_logits), e.g. a gpipe PipeliningLayer.')
    p.Define('num_classes', 1000, 'Classes.')
    p.Define('label_smoothing', 0.1, 'Label smoothing of the loss.')
    p.Define('aux_loss_weight', 0.4,
             'Weight of the auxiliary head loss (if the network has one).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.network is None:
      raise ValueError('ImageClassificationTask %s needs p.network (e.g. a '
                       'PipeliningLayer over tasks.image.network.LayerParams)'
                       % p.name)
    network = p.network.Copy()
    if (isinstance(network.cls, type) and
        issubclass(network.cls, pipeline.PipeliningLayer) and
        network.loss_tpl is None):
      network.loss_tpl = ImageLossLayer.Params().Set(
          num_classes=p.num_classes, label_smoothing=p.label_smoothing,
          aux_loss_weight=p.aux_loss_weight)
    self.CreateChild('network', network)

  def ComputePredictions(self, theta, input_batch):
    """Runs the network on `input_batch.image`.

    Args:
      theta: this task's variables.
      input_batch: NestedMap with 'image' [batch, height, width, channels].

    Returns:
      NestedMap(logits=[batch, num_classes]) with 'aux_logits' as well when
      the network has an auxiliary head.
    """
    if isinstance(self.network, pipeline.PipeliningLayer) and (
        self.network.params.loss_tpl is not None):
      # The labels enter the last stage as int64: on a GPU TensorFlow keeps
      # int32 tensors that enter a function (a stage call) in host memory,
      # and every call would copy them to the device for the one-hot
      # targets (gpipe.measure.gpu_audit).
      return self.network.FProp(
          theta.network, input_batch.image,
          targets=py_utils.NestedMap(
              label=tf.cast(input_batch.label, tf.int64)))
    out = self.network.FProp(theta.network, input_batch.image)
    if isinstance(out, (tuple, list)):
      if len(out) != 2:
        raise ValueError('The network must return logits or (logits, '
                         'aux_logits); got %d outputs' % len(out))
      return py_utils.NestedMap(logits=out[0], aux_logits=out[1])
    return py_utils.NestedMap(logits=out)

  def ComputeLoss(self, theta, predictions, input_batch):
    """Loss, accuracy and top-5 accuracy.

    Args:
      theta: this task's variables.
      predictions: from ComputePredictions.
      input_batch: NestedMap with 'label' [batch] int.

    Returns:
      (metrics, per_example) as Lingvo expects; metrics hold (value, weight).
    """
    p = self.params
    labels = tf.cast(input_batch.label, tf.int32)
    batch = tf.cast(tf.shape(labels)[0], tf.float32)
    if 'per_example_loss' in predictions:
      # Computed per micro-batch inside the pipeline (ImageLossLayer).
      loss = tf.reduce_mean(predictions.per_example_loss)
      metrics = {'classifier_loss': (tf.reduce_mean(predictions.xent), batch)}
      if 'aux_xent' in predictions:
        metrics['aux_loss'] = (tf.reduce_mean(predictions.aux_xent), batch)
    else:
      xent = SmoothedCrossEntropy(predictions.logits, labels, p.num_classes,
                                  p.label_smoothing)
      loss = tf.reduce_mean(xent)
      metrics = {'classifier_loss': (loss, batch)}
      if 'aux_logits' in predictions:
        aux = tf.reduce_mean(
            SmoothedCrossEntropy(predictions.aux_logits, labels,
                                 p.num_classes, p.label_smoothing))
        metrics['aux_loss'] = (aux, batch)
        loss += p.aux_loss_weight * aux
    correct = tf.cast(
        tf.equal(tf.argmax(predictions.logits, -1, output_type=tf.int32),
                 labels), tf.float32)
    top5 = tf.cast(
        tf.nn.in_top_k(
            targets=labels,
            # in_top_k takes float32 only (float64 runs compare losses).
            predictions=tf.cast(predictions.logits, tf.float32),
            k=min(5, p.num_classes)), tf.float32)
    metrics.update({
        'loss': (loss, batch),
        'accuracy': (tf.reduce_mean(correct), batch),
        'top5_accuracy': (tf.reduce_mean(top5), batch),
    })
    return metrics, {'correct': correct}

  def Decode(self, input_batch):
    """Predicted classes for decode/eval mode.

    Args:
      input_batch: NestedMap with 'image' and 'label'.

    Returns:
      A dict with 'predicted' and 'label' [batch] ints.
    """
    predictions = self.ComputePredictions(self.theta, input_batch)
    return {
        'predicted': tf.argmax(predictions.logits, -1, output_type=tf.int32),
        'label': tf.cast(input_batch.label, tf.int32),
    }

  def CreateDecoderMetrics(self):
    """Accuracy over all decoded examples."""
    return {
        'accuracy': metrics_lib.AverageMetric(),
        'num_samples_in_batch': metrics_lib.AverageMetric(),
    }

  def PostProcessDecodeOut(self, decode_out_dict, decode_metrics_dict):
    """Adds one decoded batch to the accuracy metric.

    Args:
      decode_out_dict: fetched Decode() output (numpy arrays).
      decode_metrics_dict: from CreateDecoderMetrics.

    Returns:
      An empty list (nothing to write out).
    """
    predicted = decode_out_dict['predicted']
    labels = decode_out_dict['label']
    n = len(labels)
    if n:
      decode_metrics_dict['accuracy'].Update(
          float((predicted == labels).mean()), n)
    decode_metrics_dict['num_samples_in_batch'].Update(n)
    return []
