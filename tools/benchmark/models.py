"""Layer stacks for the benchmarks: one tensor in, one tensor out.

Every layer here takes and returns a single float tensor with a static shape
and has ``FPropMeta``, so the same flat list runs unchanged in three places:
our ``gpipe.pipeline.PipeliningLayer`` (``layers=`` cut into stages), Lingvo's
``lingvo.core.gpipe.PipeliningLayer`` (``cell_tpl=`` of
``FeatureExtractionLayer`` stages, see ``LingvoCells``) and a plain loop
(``ChainFProp``). Dropout is off: the comparisons are about speed and memory,
and Lingvo's GPipe has its own seeding rules.

These are stand-ins sized for a 2-core CPU, because Lingvo's GPipe splits
only single-tensor layers and the task models' layers (``tasks/mt``,
``tasks/image``) pass NestedMaps or tuples; they share the task layers' math
where it matters (the layer norm: ``tasks.mt.sublayers.Normalize``):

  * ``TransformerBlock``: a pre-layer-norm self-attention + feed-forward
    residual block on [batch, length, dim] (one Transformer layer of the
    paper's Transformer-L).
  * ``AmoebaCell``: a convolutional cell of AmoebaNet-D's kinds of
    operations (separable 3x3 convolutions, 1x1 convolutions, average
    pooling, summed branches, residual) on [batch, height, width, filters].
  * ``tasks.dense.DenseLayer`` (relu, no dropout): the cheapest layer with a
    known cost.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import gpipe as lingvo_gpipe
from lingvo.core import py_utils
from tasks import dense
from tasks.mt import sublayers


def _Weight(layer, name, shape, scale):
  layer.CreateVariable(
      name,
      py_utils.WeightParams(shape, py_utils.WeightInit.Gaussian(scale),
                            layer.params.dtype))


def _LayerNorm(x, gain):
  return sublayers.Normalize(x, 1.0 + gain, 0.0, 1e-6)


class TransformerBlock(base_layer.BaseLayer):
  """x + Attention(LN(x)), then + FeedForward(LN(.)) on [batch, length, dim]."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 256, 'Model width D.')
    p.Define('hidden_dim', 1024, 'Feed-forward hidden width.')
    p.Define('num_heads', 4, 'Attention heads (must divide model_dim).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.model_dim % p.num_heads:
      raise ValueError('%s: num_heads=%d must divide model_dim=%d' %
                       (p.name, p.num_heads, p.model_dim))
    d, h = p.model_dim, p.hidden_dim
    _Weight(self, 'ln1', [d], 0.0)
    _Weight(self, 'qkv', [d, 3 * d], d**-0.5)
    _Weight(self, 'proj', [d, d], d**-0.5)
    _Weight(self, 'ln2', [d], 0.0)
    _Weight(self, 'w1', [d, h], d**-0.5)
    _Weight(self, 'w2', [h, d], h**-0.5)

  @classmethod
  def FPropMeta(cls, p, x):
    b, t, d = x[0], x[1], p.model_dim
    dense = 2 * b * t * d * (3 * d + d + 2 * p.hidden_dim)
    attention = 2 * 2 * b * t * t * d
    return py_utils.NestedMap(flops=dense + attention, out_shapes=(x,))

  def FProp(self, theta, x):
    p = self.params
    b, t, d = x.shape.as_list()
    heads, dh = p.num_heads, p.model_dim // p.num_heads
    y = _LayerNorm(x, theta.ln1)
    qkv = tf.reshape(tf.matmul(tf.reshape(y, [b * t, d]), theta.qkv),
                     [b, t, 3, heads, dh])
    q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # [b, h, t, dh]
    logits = tf.matmul(q, k, transpose_b=True) * dh**-0.5
    ctx = tf.matmul(tf.nn.softmax(logits), v)  # [b, h, t, dh]
    ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [b * t, d])
    x = x + tf.reshape(tf.matmul(ctx, theta.proj), [b, t, d])
    y = tf.reshape(_LayerNorm(x, theta.ln2), [b * t, d])
    y = tf.matmul(tf.nn.relu(tf.matmul(y, theta.w1)), theta.w2)
    return x + tf.reshape(y, [b, t, d])


class AmoebaCell(base_layer.BaseLayer):
  """A normal cell with AmoebaNet-D's operation kinds, same shape in and out.

  Branches on relu(x): sep3x3(sep3x3), conv1x1, avgpool3x3 + conv1x1;
  their sum is added to x.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filters', 64, 'Channels D (in and out).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    f = p.filters
    for i in range(2):
      _Weight(self, 'dw%d' % i, [3, 3, f, 1], 1.0 / 3)
      _Weight(self, 'pw%d' % i, [1, 1, f, f], f**-0.5)
    _Weight(self, 'conv', [1, 1, f, f], f**-0.5)
    _Weight(self, 'pool_conv', [1, 1, f, f], f**-0.5)

  @classmethod
  def FPropMeta(cls, p, x):
    pixels = x[0] * x[1] * x[2]
    f = p.filters
    flops = pixels * (2 * (2 * 9 * f + 2 * f * f) + 2 * 2 * f * f + 9 * f)
    return py_utils.NestedMap(flops=flops, out_shapes=(x,))

  def FProp(self, theta, x):
    y = tf.nn.relu(x)
    sep = y
    for i in range(2):
      sep = tf.nn.separable_conv2d(sep, theta['dw%d' % i], theta['pw%d' % i],
                                   [1, 1, 1, 1], 'SAME')
      if i == 0:
        sep = tf.nn.relu(sep)
    conv = tf.nn.conv2d(y, theta.conv, 1, 'SAME')
    pool = tf.nn.conv2d(
        tf.nn.avg_pool2d(y, 3, 1, 'SAME'), theta.pool_conv, 1, 'SAME')
    return x + sep + conv + pool


class MeanSquareLoss(base_layer.BaseLayer):
  """The benchmarks' loss per example, as a pipeline's loss layer.

  FProp(theta, out, targets) returns mean(out^2) over all but the batch
  axis, [batch]: its mean is the loss the benchmark steps train on
  (mean(out^2)); `targets` only carries the batch size.
  """

  def FProp(self, theta, out, targets):
    del targets
    return tf.reduce_mean(tf.square(out), axis=list(range(1, out.shape.rank)))


def ModelLayers(model, num_layers, width=None, dtype=tf.float32):
  """A flat list of `num_layers` benchmark layer params.

  Args:
    model: 'dense', 'transformer' or 'amoeba'.
    num_layers: L.
    width: dense/transformer model_dim or amoeba filters (default per model).
    dtype: parameter dtype.

  Returns:
    A list of layer params named layer<i>.
  """
  if model == 'dense':
    width = width or 1024
    tpl = dense.DenseLayer.Params().Set(
        input_dim=width, output_dim=width,
        params_init=py_utils.WeightInit.Gaussian(width**-0.5))
  elif model == 'transformer':
    width = width or 256
    tpl = TransformerBlock.Params().Set(
        model_dim=width, hidden_dim=4 * width, num_heads=max(1, width // 64))
  elif model == 'amoeba':
    tpl = AmoebaCell.Params().Set(filters=width or 64)
  else:
    raise ValueError("unknown benchmark model %r; use 'dense', 'transformer' "
                     "or 'amoeba'" % model)
  return [tpl.Copy().Set(name='layer%d' % i, dtype=dtype)
          for i in range(num_layers)]


def InputShape(model, batch, width=None, length=None, image=None):
  """The full-batch input shape of a benchmark model."""
  if model == 'dense':
    return [batch, width or 1024]
  if model == 'transformer':
    return [batch, length or 64, width or 256]
  if model == 'amoeba':
    return [batch, image or 16, image or 16, width or 64]
  raise ValueError('unknown benchmark model %r' % model)


def LingvoCells(layers, stage_sizes):
  """Lingvo GPipe stages: one FeatureExtractionLayer per run of layers.

  Args:
    layers: the flat layer params.
    stage_sizes: layers per stage.

  Returns:
    A list of FeatureExtractionLayer params (Lingvo's ``cell_tpl``).
  """
  cells, start = [], 0
  for k, size in enumerate(stage_sizes):
    cells.append(lingvo_gpipe.FeatureExtractionLayer.Params().Set(
        name='cell_%d' % k,
        sub=[lp.Copy() for lp in layers[start:start + size]]))
    start += size
  return cells


def ChainFProp(layers, thetas, x):
  """Runs built layers in sequence on one tensor."""
  for layer, theta in zip(layers, thetas):
    x = layer.FProp(theta, x)
  return x
