"""Micro-batch batch normalization (GPipe, Section 2.2).

Training normalizes each micro-batch with its own statistics, so every
micro-batch is computed exactly as it would be alone on one device. The moving
averages used for evaluation are updated once per mini-batch, from the
statistics of *all* its micro-batches:

  * each stage call reports ``(count, sum, sum of squares)`` of the micro-batch
    it normalized, as extra (gradient-free) outputs of the stage;
  * the pipeline adds them up over micro-batches (counts add up to the batch
    size) and calls ``AccumulatedUpdates`` once, which assigns the moving mean
    and variance of the whole mini-batch through Lingvo's batch-norm update
    mechanism (``py_utils.UpdateBatchNormVars``: the ops land in the
    ``BATCH_NORM_UPDATES`` collection). Lingvo's train op runs the updates
    whose statistics the loss depends on; the pipeline's outputs depend on
    the summed statistics (a control dependency), so they qualify.

Outside a pipeline (no ``CollectStats`` scope) the layer updates its moving
averages directly from the batch it sees, like an ordinary batch norm.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import thread_stack
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

_COLLECTORS = thread_stack.ThreadLocalStack()


class StatsCollector:
  """Receives the per-micro-batch statistics reported inside one stage trace."""

  def __init__(self):
    self.reports = []  # (layer, [count, sum, sum_sq]) in report order.

  def Report(self, layer, stats):
    self.reports.append((layer, list(stats)))


def CollectStats():
  """Collects the statistics of batch-norm layers run inside the block.

  Use as ``with CollectStats() as collector:``.

  Returns:
    A context manager yielding a StatsCollector whose ``reports`` lists
    (layer, [count, sum, sum_sq]).
  """
  return _COLLECTORS.Pushed(StatsCollector())


class MicroBatchBatchNormLayer(base_layer.BaseLayer):
  """Batch norm over all axes but the last, with micro-batch statistics."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Number of channels (size of the last axis).')
    p.Define('decay', 0.99,
             'Moving-average decay, applied once per mini-batch.')
    p.Define('epsilon', 1e-3, 'Added to the variance before the square root.')
    p.Define('gamma_init', 1.0,
             'Initial scale; 0 makes a residual branch start as identity.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.dim <= 0:
      raise ValueError('MicroBatchBatchNormLayer %s needs dim > 0, got %d' %
                       (p.name, p.dim))
    collections = [self.__class__.__name__ + '_vars']
    self.CreateVariable(
        'beta',
        py_utils.WeightParams([p.dim], py_utils.WeightInit.Constant(0.0),
                              p.dtype, collections=collections))
    self.CreateVariable(
        'gamma',
        py_utils.WeightParams([p.dim],
                              py_utils.WeightInit.Constant(p.gamma_init),
                              p.dtype, collections=collections))
    for name, init in (('moving_mean', 0.0), ('moving_variance', 1.0)):
      self.CreateVariable(
          name,
          py_utils.WeightParams([p.dim], py_utils.WeightInit.Constant(init),
                                p.dtype, collections=collections),
          trainable=False)

  @classmethod
  def FPropMeta(cls, p, inputs):
    num = inputs.num_elements()
    return py_utils.NestedMap(flops=num * 10, out_shapes=(inputs,))

  def FProp(self, theta, inputs):
    """Normalizes `inputs` [..., dim].

    Args:
      theta: this layer's variables.
      inputs: a float tensor whose last axis has size p.dim.

    Returns:
      The normalized tensor, same shape.
    """
    p = self.params
    axes = list(range(inputs.shape.rank - 1))
    if self.do_eval:
      mean, variance = theta.moving_mean, theta.moving_variance
    else:
      # Statistics in the variables' dtype (float32 under bfloat16 compute).
      x = tf.cast(inputs, p.dtype)
      if x.shape[:-1].is_fully_defined():
        # A constant: counted from tf.shape, the count is an int32 a GPU
        # keeps in host memory and copies to the device in every call.
        count = tf.constant(x.shape[:-1].num_elements(), p.dtype)
      else:
        count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), p.dtype)
      total = tf.reduce_sum(x, axes)
      total_sq = tf.reduce_sum(tf.square(x), axes)
      mean = total / count
      variance = tf.nn.relu(total_sq / count - tf.square(mean))
      stats = [tf.stop_gradient(s) for s in (count, total, total_sq)]
      collector = _COLLECTORS.Top()
      if collector is not None:
        collector.Report(self, stats)
      else:
        # Alone, the statistics that normalize are the ones to average.
        self._UpdateMovingAverages(mean, variance)
    mean, variance = (tf.cast(t, inputs.dtype) for t in (mean, variance))
    return tf.nn.batch_normalization(inputs, mean, variance, theta.beta,
                                     theta.gamma, p.epsilon)

  def AccumulatedUpdates(self, count, total, total_sq):
    """Updates the moving averages from statistics summed over micro-batches.

    Args:
      count: the number of normalized positions (batch x spatial), summed.
      total: per-channel sum, summed over micro-batches.
      total_sq: per-channel sum of squares, summed over micro-batches.

    Returns:
      [mean, variance] of the mini-batch: the statistics the two updates
      (added to the BATCH_NORM_UPDATES collection) assign from.
    """
    mean = total / count
    variance = tf.nn.relu(total_sq / count - tf.square(mean))
    self._UpdateMovingAverages(mean, variance)
    return [mean, variance]

  def _UpdateMovingAverages(self, mean, variance):
    p = self.params
    py_utils.UpdateBatchNormVars(self.vars.moving_mean, mean, p.decay)
    py_utils.UpdateBatchNormVars(self.vars.moving_variance, variance, p.decay)
