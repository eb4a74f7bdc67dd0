"""A fully connected layer for pipelines: act(x W + b), then dropout.

The one dense layer of the project: the toy registered model
(``params/toy.py``), the pipeline tests (``tests/toy_layers.py``) and the
benchmark stacks (``tools/benchmark/models.py``) configure it instead of each
writing its own. It has ``FPropMeta`` (so ``partition_cost='flops'`` can cut
a stack of them), uses ``gpipe.randomness.Dropout`` (a different mask per
micro-batch, the same one in the recomputed forward pass) and can normalize
its input with the core's micro-batch batch norm.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import batch_norm
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

_ACTIVATIONS = {
    'RELU': tf.nn.relu,
    'TANH': tf.tanh,
    'NONE': lambda x: x,
}


class DenseLayer(base_layer.BaseLayer):
  """act(BN?(x) W + b) on [..., input_dim], then pipeline-safe dropout.

  The weight is initialized by ``params_init`` (Lingvo's usual param), the
  bias by the constant ``bias_init``. Dropout runs only in training.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 64, 'Input features.')
    p.Define('output_dim', 64, 'Output features.')
    p.Define('activation', 'RELU',
             'One of %s.' % ', '.join(sorted(_ACTIVATIONS)))
    p.Define('bias_init', 0.0, 'Initial value of every bias.')
    p.Define('keep_prob', 1.0, 'Dropout keep probability (1: no dropout).')
    p.Define('use_bn', False,
             'Normalize the input with a micro-batch batch norm first.')
    p.Define('bn_decay', 0.999, 'Moving-average decay of that batch norm.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.activation not in _ACTIVATIONS:
      raise ValueError('%s: unknown activation %r; use one of %s' %
                       (p.name, p.activation, ', '.join(sorted(_ACTIVATIONS))))
    if not 0.0 < p.keep_prob <= 1.0:
      raise ValueError('%s: keep_prob must be in (0, 1], got %r' %
                       (p.name, p.keep_prob))
    self.CreateVariable(
        'w',
        py_utils.WeightParams([p.input_dim, p.output_dim], p.params_init,
                              p.dtype))
    self.CreateVariable(
        'b',
        py_utils.WeightParams([p.output_dim],
                              py_utils.WeightInit.Constant(p.bias_init),
                              p.dtype))
    if p.use_bn:
      self.CreateChild(
          'bn', batch_norm.MicroBatchBatchNormLayer.Params().Set(
              dim=p.input_dim, decay=p.bn_decay))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(
        flops=2 * x.num_elements() * p.output_dim,
        out_shapes=(x[:-1] + [p.output_dim],))

  def FProp(self, theta, x):
    p = self.params
    if p.use_bn:
      x = self.bn.FProp(theta.bn, x)
    y = _ACTIVATIONS[p.activation](tf.matmul(x, theta.w) + theta.b)
    if self.do_eval:
      return y
    return randomness.Dropout(y, p.keep_prob, key=self.path)
