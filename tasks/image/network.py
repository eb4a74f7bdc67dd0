"""AmoebaNet as one flat list of layer params: stem, cells, heads.

The list is what gpipe's PipeliningLayer cuts into stages::

  stem conv          image -> x
  [stem cells]       2 reduction cells at D/4 and D/2 filters (ImageNet stem)
  stack 1            L/3 normal cells, D filters
  reduction cell     2D filters
  stack 2            L/3 normal cells, 2D filters
  [aux head]         (x, prev) -> (x, prev, aux_logits)
  reduction cell     4D filters
  stack 3            L/3 normal cells, 4D filters
  classifier         (x, prev[, aux_logits]) -> logits or (logits, aux_logits)

Each cell passes ``(current, previous, *extras)`` on, so the auxiliary logits
computed after stack 2 travel through the later stages to the network output.
Drop path keeps ``1 - (i + 1) / n * (1 - drop_path_keep_prob)`` in the i-th of
the n cells after the stem: deeper cells drop more.
"""

from gpipe import batch_norm
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.measure import param_count
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
from lingvo.core import py_utils
from lingvo.core import tshape
from tasks.image import cells
from tasks.image import genotypes
from tasks.image import ops


class StemLayer(base_layer.BaseLayer):
  """The first convolution: 3x3 conv (stride 2 for ImageNet, 1 for CIFAR) + BN."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 3, 'Image channels.')
    p.Define('out_dim', 32, 'Filters of the stem convolution.')
    p.Define('stride', 2, 'Stride of the stem convolution.')
    p.Define('bn_tpl', batch_norm.MicroBatchBatchNormLayer.Params(),
             'Batch norm template.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('conv', ops.Conv2DLayer.Params().Set(
        in_dim=p.in_dim, out_dim=p.out_dim, kernel=(3, 3),
        stride=(p.stride, p.stride)))
    self.CreateChild('bn', p.bn_tpl.Copy().Set(dim=p.out_dim))

  @classmethod
  def FPropMeta(cls, p, images):
    conv_p = ops.Conv2DLayer.Params().Set(
        in_dim=p.in_dim, out_dim=p.out_dim, kernel=(3, 3),
        stride=(p.stride, p.stride))
    meta = ops.Conv2DLayer.FPropMeta(conv_p, images)
    out = meta.out_shapes[0]
    return py_utils.NestedMap(flops=meta.flops + 10 * out.num_elements(),
                              out_shapes=(out,))

  def FProp(self, theta, images):
    """Returns the stem features of `images` [batch, height, width, in_dim]."""
    x = self.conv.FProp(theta.conv, images)
    return self.bn.FProp(theta.bn, x)


def _ValidPoolSize(size, window, stride):
  return (size - window) // stride + 1


class AuxHeadLayer(base_layer.BaseLayer):
  """Auxiliary classifier after stack 2; appends its logits to the states.

  ReLU, 5x5 average pool (stride 3, 'VALID'), ReLU-1x1 conv(128)-BN, a conv
  over the whole remaining map to 768 channels + BN, ReLU, fully connected.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 0, 'Channels of the cell output it reads.')
    p.Define('height', 0, 'Rows of the cell output it reads.')
    p.Define('width', 0, 'Columns of the cell output it reads.')
    p.Define('num_classes', 1000, 'Classes.')
    p.Define('pool_size', 5, 'Average-pool window (capped at the map size).')
    p.Define('pool_stride', 3, 'Average-pool stride.')
    p.Define('hidden_dim', 128, 'Channels of the 1x1 convolution.')
    p.Define('features_dim', 768, 'Channels of the full-map convolution.')
    p.Define('bn_tpl', batch_norm.MicroBatchBatchNormLayer.Params(),
             'Batch norm template.')
    return p

  @classmethod
  def _PooledSize(cls, p):
    window = [min(p.pool_size, p.height), min(p.pool_size, p.width)]
    return window, [
        _ValidPoolSize(p.height, window[0], p.pool_stride),
        _ValidPoolSize(p.width, window[1], p.pool_stride)
    ]

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if min(p.in_dim, p.height, p.width) <= 0:
      raise ValueError('AuxHeadLayer %s needs in_dim, height and width > 0' %
                       p.name)
    _, pooled = self._PooledSize(p)
    self.CreateChild('conv_hidden', ops.Conv2DLayer.Params().Set(
        in_dim=p.in_dim, out_dim=p.hidden_dim))
    self.CreateChild('bn_hidden', p.bn_tpl.Copy().Set(dim=p.hidden_dim))
    self.CreateChild('conv_features', ops.Conv2DLayer.Params().Set(
        in_dim=p.hidden_dim, out_dim=p.features_dim, kernel=tuple(pooled)))
    self.CreateChild('bn_features', p.bn_tpl.Copy().Set(dim=p.features_dim))
    self.CreateChild('fc', FullyConnectedLayer.Params().Set(
        in_dim=p.features_dim, out_dim=p.num_classes))

  @classmethod
  def FPropMeta(cls, p, current, previous, *extras):
    b = ops.ShapeList(current)[0]
    _, pooled = cls._PooledSize(p)
    positions = b * pooled[0] * pooled[1]
    flops = (2 * positions * p.in_dim * p.hidden_dim +
             2 * positions * p.hidden_dim * p.features_dim +
             2 * b * p.features_dim * p.num_classes)
    logits = tshape.Shape([b, p.num_classes])
    return py_utils.NestedMap(
        flops=flops, out_shapes=(current, previous) + tuple(extras) + (logits,))

  def FProp(self, theta, current, previous, *extras):
    """Computes auxiliary logits from `current`.

    Args:
      theta: this layer's variables.
      current: [batch, height, width, in_dim], the last cell's output.
      previous: the last cell's input (passed through).
      *extras: passed through.

    Returns:
      (current, previous, *extras, aux_logits [batch, num_classes]).
    """
    p = self.params
    window, _ = self._PooledSize(p)
    x = tf.nn.relu(current)
    x = tf.nn.avg_pool2d(x, window, p.pool_stride, 'VALID')
    x = self.conv_hidden.FProp(theta.conv_hidden, x)
    x = tf.nn.relu(self.bn_hidden.FProp(theta.bn_hidden, x))
    # The kernel covers the whole pooled map: one output position, i.e. a
    # matmul of the flattened map with the flattened kernel.
    w = tf.reshape(theta.conv_features.w, [-1, p.features_dim])
    x = tf.matmul(tf.reshape(x, [x.shape[0], -1]), w)
    x = tf.nn.relu(self.bn_features.FProp(theta.bn_features, x))
    logits = self.fc.FProp(theta.fc, x)
    return (current, previous) + tuple(extras) + (logits,)


class FullyConnectedLayer(base_layer.BaseLayer):
  """x W + b, for classifier heads."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 0, 'Input features.')
    p.Define('out_dim', 0, 'Output features.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable(
        'w',
        py_utils.WeightParams([p.in_dim, p.out_dim],
                              py_utils.WeightInit.Gaussian(p.in_dim**-0.5),
                              p.dtype))
    self.CreateVariable(
        'b',
        py_utils.WeightParams([p.out_dim], py_utils.WeightInit.Constant(0.0),
                              p.dtype))

  def FProp(self, theta, inputs):
    """Returns inputs [batch, in_dim] @ w + b: [batch, out_dim]."""
    return tf.matmul(inputs, theta.w) + theta.b


class ClassifierLayer(base_layer.BaseLayer):
  """ReLU, global average pool, dropout, fully connected; passes extras on."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 0, 'Channels of the last cell output.')
    p.Define('num_classes', 1000, 'Classes.')
    p.Define('dropout_keep_prob', 0.5,
             'Keep probability of the dropout before the classifier.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('fc', FullyConnectedLayer.Params().Set(
        in_dim=p.in_dim, out_dim=p.num_classes))

  @classmethod
  def FPropMeta(cls, p, current, previous=None, *extras):
    b = ops.ShapeList(current)[0]
    flops = 2 * current.num_elements() + 2 * b * p.in_dim * p.num_classes
    logits = tshape.Shape([b, p.num_classes])
    return py_utils.NestedMap(flops=flops,
                              out_shapes=(logits,) + tuple(extras))

  def FProp(self, theta, current, previous=None, *extras):
    """Classifies the last cell's output.

    Args:
      theta: this layer's variables.
      current: [batch, height, width, in_dim].
      previous: ignored (the last cell's input).
      *extras: passed through (the auxiliary logits).

    Returns:
      logits [batch, num_classes], or (logits, *extras) if extras were given.
    """
    del previous
    p = self.params
    x = tf.reduce_mean(tf.nn.relu(current), axis=[1, 2])
    if not self.do_eval:
      x = randomness.Dropout(x, p.dropout_keep_prob, self.path)
    logits = self.fc.FProp(theta.fc, x)
    if extras:
      return (logits,) + tuple(extras)
    return logits


def AmoebaNetParams():
  """Hyperparameters of an AmoebaNet (L, D); `LayerParams` builds it.

  Returns:
    A hyperparams.Params.
  """
  p = hyperparams.Params()
  p.Define('genotype', 'D', 'Genotype name in tasks.image.genotypes.')
  p.Define('num_cells', 18,
           'L: normal cells in total over the three stacks (multiple of 3).')
  p.Define('filters', 256, 'D: filters of the cells of stack 1.')
  p.Define('num_classes', 1000, 'Classes.')
  p.Define('image_size', 224, 'Input height and width.')
  p.Define('in_channels', 3, 'Input channels.')
  p.Define('stem', 'imagenet',
           "'imagenet': stride-2 conv + 2 reduction cells (D/4, D/2); "
           "'cifar': one stride-1 conv, for small images.")
  p.Define('stem_filters', 32, 'Filters of the stem convolution.')
  p.Define('aux_head', True, 'Add the auxiliary head after stack 2.')
  p.Define('aux_hidden_dim', 128, 'Channels of the aux head 1x1 conv.')
  p.Define('aux_features_dim', 768, 'Channels of the aux head full-map conv.')
  p.Define('drop_path_keep_prob', 0.7,
           'Drop path keep probability of the last cell (1: off).')
  p.Define('drop_path_decay_steps', 0,
           'If > 0, ramp drop path in over this many steps.')
  p.Define('dropout_keep_prob', 0.5, 'Dropout keep prob before the classifier.')
  p.Define('bn_decay', 0.99, 'Batch norm moving-average decay.')
  p.Define('bn_epsilon', 1e-3, 'Batch norm epsilon.')
  return p


def LayerParams(net):
  """The flat list of layer params of the AmoebaNet `net` (AmoebaNetParams).

  Args:
    net: AmoebaNetParams() with the fields set.

  Returns:
    A list of layer params with unique names, from stem to classifier.

  Raises:
    ValueError: for an unknown stem or genotype, or L not a multiple of 3.
  """
  if net.num_cells <= 0 or net.num_cells % 3:
    raise ValueError('AmoebaNet L (num_cells) must be a positive multiple of '
                     '3 (three stacks), got %d' % net.num_cells)
  if net.stem not in ('imagenet', 'cifar'):
    raise ValueError("AmoebaNet stem must be 'imagenet' or 'cifar', got %r" %
                     net.stem)
  genotype = genotypes.Get(net.genotype)
  bn_tpl = batch_norm.MicroBatchBatchNormLayer.Params().Set(
      decay=net.bn_decay, epsilon=net.bn_epsilon)
  layers = []
  stem_stride = 2 if net.stem == 'imagenet' else 1
  layers.append(StemLayer.Params().Set(
      name='stem', in_dim=net.in_channels, out_dim=net.stem_filters,
      stride=stem_stride, bn_tpl=bn_tpl))
  size = ops.StridedSize(net.image_size, stem_stride)
  # Channels and resolution of the (current, previous) states.
  cur_dim = prev_dim = net.stem_filters
  prev_stride = 1

  def AddCell(name, filters, reduction, keep_prob):
    nonlocal cur_dim, prev_dim, prev_stride, size
    cell = cells.CellLayer.Params().Set(
        name=name, reduction=reduction, in_dim=cur_dim, prev_dim=prev_dim,
        prev_stride=prev_stride, filters=filters,
        drop_path_keep_prob=keep_prob,
        drop_path_decay_steps=net.drop_path_decay_steps, bn_tpl=bn_tpl)
    cells.CellLayer.SetGenotype(
        cell, genotype.reduction if reduction else genotype.normal)
    layers.append(cell)
    prev_dim, cur_dim = cur_dim, cells.CellLayer.OutDim(cell)
    prev_stride = 2 if reduction else 1
    if reduction:
      size = ops.StridedSize(size, 2)

  if net.stem == 'imagenet':
    AddCell('stem_cell_0', net.filters // 4, True, 1.0)
    AddCell('stem_cell_1', net.filters // 2, True, 1.0)
  per_stack = net.num_cells // 3
  num_cells = net.num_cells + 2  # Drop path depth counts the reductions.
  index = 0
  for stack in range(3):
    filters = net.filters * 2**stack
    if stack > 0:
      index += 1
      keep = 1.0 - index / num_cells * (1.0 - net.drop_path_keep_prob)
      AddCell('reduction_%d' % stack, filters, True, keep)
    for i in range(per_stack):
      index += 1
      keep = 1.0 - index / num_cells * (1.0 - net.drop_path_keep_prob)
      AddCell('stack_%d_cell_%d' % (stack, i), filters, False, keep)
    if stack == 1 and net.aux_head:
      layers.append(AuxHeadLayer.Params().Set(
          name='aux_head', in_dim=cur_dim, height=size, width=size,
          num_classes=net.num_classes, hidden_dim=net.aux_hidden_dim,
          features_dim=net.aux_features_dim, bn_tpl=bn_tpl))
  layers.append(ClassifierLayer.Params().Set(
      name='classifier', in_dim=cur_dim, num_classes=net.num_classes,
      dropout_keep_prob=net.dropout_keep_prob))
  return layers


def InputShapes(net, batch_size):
  """The network input shapes (for flops partitioning): a tuple of one Shape."""
  return (tshape.Shape(
      [batch_size, net.image_size, net.image_size, net.in_channels]),)


def CountParams(layers):
  """Trainable parameters of the flat layer list `layers`, without weights.

  Counts with gpipe.measure.param_count.CountParams; cells differing only in name
  and drop path rate are counted once, so deep stacks count fast.

  Args:
    layers: a list of layer params (e.g. from LayerParams).

  Returns:
    The total number of trainable parameters.
  """
  total = 0
  for layer in layers:
    layer = layer.Copy()
    layer.name = 'layer'
    if hasattr(layer, 'drop_path_keep_prob'):
      layer.drop_path_keep_prob = 1.0
    total += param_count.CountParams(layer)
  return total
