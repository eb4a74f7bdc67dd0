"""Small layers for the pipeline tests: dense + dropout, NestedMap passing."""

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import batch_norm
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils


class DenseDropout(base_layer.BaseLayer):
  """tanh(x W + b) followed by pipeline-safe dropout."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 8, 'Input features.')
    p.Define('output_dim', 8, 'Output features.')
    p.Define('keep_prob', 0.8, 'Dropout keep probability (1: no dropout).')
    p.Define('use_bn', False, 'Apply a micro-batch batch norm first.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable(
        'w',
        py_utils.WeightParams([p.input_dim, p.output_dim],
                              py_utils.WeightInit.Gaussian(0.5), p.dtype))
    self.CreateVariable(
        'b',
        py_utils.WeightParams([p.output_dim],
                              py_utils.WeightInit.Constant(0.1), p.dtype))
    if p.use_bn:
      self.CreateChild(
          'bn', batch_norm.MicroBatchBatchNormLayer.Params().Set(
              dim=p.input_dim, decay=0.5))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(
        flops=2 * x.num_elements() * p.output_dim,
        out_shapes=(x[:-1] + [p.output_dim],))

  def FProp(self, theta, x):
    p = self.params
    if p.use_bn:
      x = self.bn.FProp(theta.bn, x)
    y = tf.tanh(tf.matmul(x, theta.w) + theta.b)
    if self.do_eval:
      return y
    return randomness.Dropout(y, p.keep_prob, key=self.path)


class NestedDense(base_layer.BaseLayer):
  """Updates field `h` of a NestedMap; passes the other fields through.

  `h` is mixed with `context` (never changed, like an encoder output carried
  to the decoder) and `ids` (an integer field that has no gradient).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 8, 'Features of h and context.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable(
        'w', py_utils.WeightParams([p.dim, p.dim],
                                   py_utils.WeightInit.Gaussian(0.5), p.dtype))

  def FProp(self, theta, inputs):
    out = inputs.copy()
    scale = tf.cast(inputs.ids, inputs.h.dtype)[:, None] + 1.0
    h = tf.tanh(tf.matmul(inputs.h, theta.w) * inputs.context * scale)
    out.h = randomness.Dropout(h, 0.9, key=self.path)
    return out


class NoMeta(base_layer.BaseLayer):
  """A layer without FPropMeta (cannot be partitioned by flops)."""

  def FProp(self, theta, x):
    return x
