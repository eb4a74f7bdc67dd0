"""Small layers for the pipeline tests: dense + dropout, NestedMap passing."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from tasks import dense


class DenseDropout(dense.DenseLayer):
  """tanh(x W + b) then dropout: ``tasks.dense.DenseLayer`` with test defaults.

  Small (8 wide), a large Gaussian init and a nonzero bias, so that every
  gradient is far from zero, and dropout on (keep 0.8).
  """

  @classmethod
  def Params(cls):
    p = super().Params().Set(
        input_dim=8, output_dim=8, activation='TANH', bias_init=0.1,
        keep_prob=0.8, bn_decay=0.5,
        params_init=py_utils.WeightInit.Gaussian(0.5))
    return p


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


class SquaredErrorLoss(base_layer.BaseLayer):
  """A per-example loss layer for pipelines: scale * |h - target|^2 + sum h.

  FProp(theta, h, targets) returns NestedMap(per_example=[batch] losses,
  h=h): a pipeline's ``loss_tpl``. The learned `scale` makes the loss layer
  a parameter of the last stage; `h` passes through (the caller may read it,
  its gradient is not needed).
  """

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable(
        'scale', py_utils.WeightParams([], py_utils.WeightInit.Constant(1.5),
                                       self.params.dtype))

  def FProp(self, theta, h, targets):
    err = tf.reduce_sum(tf.square(h - targets), axis=-1)
    per_example = theta.scale * err + tf.reduce_sum(h, axis=-1)
    return py_utils.NestedMap(per_example=per_example, h=h)


class NestedLoss(SquaredErrorLoss):
  """``SquaredErrorLoss`` of field `h` of a NestedMap (NestedDense's output)."""

  def FProp(self, theta, inputs, targets):
    return super().FProp(theta, inputs.h, targets)


class Embedding(base_layer.BaseLayer):
  """Looks up int ids in a table: a weight whose gradient is IndexedSlices."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 10, 'Rows of the table.')
    p.Define('dim', 8, 'Columns of the table.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable(
        'table', py_utils.WeightParams([p.vocab_size, p.dim],
                                       py_utils.WeightInit.Gaussian(0.5),
                                       p.dtype))

  def FProp(self, theta, ids):
    return tf.nn.embedding_lookup(theta.table, ids)
