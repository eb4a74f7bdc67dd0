"""The AmoebaNet operations, as Lingvo layers built from an operation name.

An operation name maps to a short list of steps (`OpSteps`), each either

  * ``conv``: ReLU, a (separable) convolution, micro-batch batch norm; or
  * ``pool``: max or average pooling (no weights),

so a new operation with the same building blocks is a new name, parsed here,
not a new layer. Names understood:

  ============================  ==============================================
  ``none``                      identity; ReLU-1x1 conv-BN if the stride or
                                the channels change
  ``1x1``                       ReLU-1x1 conv-BN
  ``KxK`` (e.g. ``3x3``)        bottleneck ReLU-1x1(out/4)-BN, ReLU-KxK-BN,
                                ReLU-1x1(out)-BN
  ``1xK_Kx1`` (``1x7_7x1``)     the same bottleneck with a 1xK then a Kx1 conv
  ``separable_KxK_N``           N times ReLU-separable KxK conv-BN, stride on
                                the first
  ``dil_R_separable_KxK_N``     the same with dilation rate R
  ``max_pool_KxK``              max pooling (then ReLU-1x1-BN if the channels
  ``avg_pool_KxK``              change; avg pooling excludes the padding)
  ============================  ==============================================

All convolutions and pools use 'SAME' padding, so an output has
``ceil(size / stride)`` rows and columns. Convolutions have no bias: a batch
norm follows each of them.
"""

import math
import re

from gpipe import batch_norm
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape


def ShapeList(shape):
  """The dimensions of a tshape.Shape (or TensorShape) as a list of ints."""
  if isinstance(shape, tshape.Shape):
    shape = shape.ToTensorShape()
  dims = tf.TensorShape(shape).as_list()
  if any(d is None for d in dims):
    raise ValueError('AmoebaNet layers need static shapes, got %s' % dims)
  return dims


def StridedSize(size, stride):
  """Rows (or columns) of a 'SAME'-padded output for an input of `size`."""
  return int(math.ceil(size / stride))


def _HeInit(fan_in):
  return py_utils.WeightInit.Gaussian(scale=math.sqrt(2.0 / fan_in))


class Conv2DLayer(base_layer.BaseLayer):
  """A bias-free 2-D convolution (NHWC, 'SAME'), plain or depthwise-separable.

  A separable convolution is a depthwise KxK convolution (one filter per
  input channel) followed by a 1x1 convolution to `out_dim` channels.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 0, 'Input channels.')
    p.Define('out_dim', 0, 'Output channels.')
    p.Define('kernel', (1, 1), 'Kernel (height, width).')
    p.Define('stride', (1, 1), 'Stride (rows, columns).')
    p.Define('dilation', 1, 'Dilation rate (both axes).')
    p.Define('separable', False, 'Depthwise-separable convolution.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.in_dim <= 0 or p.out_dim <= 0:
      raise ValueError('Conv2DLayer %s needs in_dim and out_dim > 0, got %d '
                       'and %d' % (p.name, p.in_dim, p.out_dim))
    kh, kw = p.kernel
    if p.separable:
      self.CreateVariable(
          'depthwise',
          py_utils.WeightParams([kh, kw, p.in_dim, 1], _HeInit(kh * kw),
                                p.dtype))
      self.CreateVariable(
          'pointwise',
          py_utils.WeightParams([1, 1, p.in_dim, p.out_dim], _HeInit(p.in_dim),
                                p.dtype))
    else:
      self.CreateVariable(
          'w',
          py_utils.WeightParams([kh, kw, p.in_dim, p.out_dim],
                                _HeInit(kh * kw * p.in_dim), p.dtype))

  @classmethod
  def OutShape(cls, p, in_shape):
    """Output [batch, height, width, out_dim] for input `in_shape`."""
    b, h, w, _ = ShapeList(in_shape)
    return [b, StridedSize(h, p.stride[0]), StridedSize(w, p.stride[1]),
            p.out_dim]

  @classmethod
  def FPropMeta(cls, p, inputs):
    out = cls.OutShape(p, inputs)
    positions = out[0] * out[1] * out[2]
    kh, kw = p.kernel
    if p.separable:
      flops = 2 * positions * p.in_dim * (kh * kw + p.out_dim)
    else:
      flops = 2 * positions * kh * kw * p.in_dim * p.out_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape(out),))

  def FProp(self, theta, inputs):
    """Convolves `inputs` [batch, height, width, in_dim].

    Args:
      theta: this layer's variables.
      inputs: the input images.

    Returns:
      [batch, ceil(height / stride), ceil(width / stride), out_dim].
    """
    p = self.params
    strides = [1, p.stride[0], p.stride[1], 1]
    subsample = None
    if p.dilation > 1 and tuple(p.stride) != (1, 1):
      # TF's dilated convolutions need stride 1: convolve, then subsample.
      # With 'SAME' padding this keeps exactly the strided output positions.
      subsample, strides = p.stride, [1, 1, 1, 1]
    dilations = [p.dilation, p.dilation]
    if p.separable:
      out = tf.nn.depthwise_conv2d(
          inputs, theta.depthwise, strides, 'SAME', dilations=dilations)
      out = tf.nn.conv2d(out, theta.pointwise, [1, 1, 1, 1], 'SAME')
    else:
      out = tf.nn.conv2d(inputs, theta.w, strides, 'SAME', dilations=dilations)
    if subsample is not None:
      out = out[:, ::subsample[0], ::subsample[1], :]
    return out


def _ConvStep(out_dim, kernel=(1, 1), stride=(1, 1), dilation=1,
              separable=False):
  return py_utils.NestedMap(
      kind='conv', out_dim=out_dim, kernel=tuple(kernel), stride=tuple(stride),
      dilation=dilation, separable=separable)


def _PoolStep(pool, size, stride):
  return py_utils.NestedMap(kind='pool', pool=pool, size=size, stride=stride)


_KXK = re.compile(r'^(\d+)x(\d+)$')
_BOTTLENECK_1XK = re.compile(r'^1x(\d+)_(\d+)x1$')
_SEPARABLE = re.compile(r'^(?:dil_(\d+)_)?separable_(\d+)x(\d+)_(\d+)$')
_POOL = re.compile(r'^(max|avg)_pool_(\d+)x(\d+)$')


def OpSteps(name, in_dim, out_dim, stride):
  """The steps of operation `name` (see the module docstring).

  Args:
    name: an operation name, e.g. 'separable_3x3_2'.
    in_dim: input channels.
    out_dim: output channels.
    stride: 1, or 2 in a reduction cell's ops that read the cell inputs.

  Returns:
    A list of NestedMaps: ``kind='conv'`` (out_dim, kernel, stride, dilation,
    separable) or ``kind='pool'`` (pool 'max'|'avg', size, stride).

  Raises:
    ValueError: for a name that is none of the forms above.
  """
  s = (stride, stride)
  if name == 'none':
    if stride == 1 and in_dim == out_dim:
      return []
    return [_ConvStep(out_dim, stride=s)]
  if name == '1x1':
    return [_ConvStep(out_dim, stride=s)]
  match = _KXK.match(name)
  if match:
    kernel = (int(match.group(1)), int(match.group(2)))
    mid = max(out_dim // 4, 1)
    return [_ConvStep(mid), _ConvStep(mid, kernel, s), _ConvStep(out_dim)]
  match = _BOTTLENECK_1XK.match(name)
  if match and match.group(1) == match.group(2):
    k = int(match.group(1))
    mid = max(out_dim // 4, 1)
    return [_ConvStep(mid), _ConvStep(mid, (1, k), (1, stride)),
            _ConvStep(mid, (k, 1), (stride, 1)), _ConvStep(out_dim)]
  match = _SEPARABLE.match(name)
  if match:
    dilation = int(match.group(1) or 1)
    kernel = (int(match.group(2)), int(match.group(3)))
    repeats = int(match.group(4))
    return [
        _ConvStep(out_dim, kernel, s if i == 0 else (1, 1), dilation, True)
        for i in range(repeats)
    ]
  match = _POOL.match(name)
  if match and match.group(2) == match.group(3):
    steps = [_PoolStep(match.group(1), int(match.group(2)), stride)]
    if in_dim != out_dim:
      steps.append(_ConvStep(out_dim))
    return steps
  raise ValueError(
      'Unknown AmoebaNet operation %r. Known forms: none, 1x1, KxK, 1xK_Kx1, '
      'separable_KxK_N, dil_R_separable_KxK_N, max_pool_KxK, avg_pool_KxK.' %
      name)


class OperationLayer(base_layer.BaseLayer):
  """One AmoebaNet operation (see the module docstring for the names)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('op', 'none', 'Operation name, e.g. separable_3x3_2.')
    p.Define('in_dim', 0, 'Input channels.')
    p.Define('out_dim', 0, 'Output channels.')
    p.Define('stride', 1, 'Stride of the operation (1 or 2).')
    p.Define('bn_tpl', batch_norm.MicroBatchBatchNormLayer.Params(),
             'Batch norm after each convolution.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self._steps = OpSteps(p.op, p.in_dim, p.out_dim, p.stride)
    convs, bns = [], []
    dim = p.in_dim
    for step in self._steps:
      if step.kind == 'conv':
        convs.append(Conv2DLayer.Params().Set(
            in_dim=dim, out_dim=step.out_dim, kernel=step.kernel,
            stride=step.stride, dilation=step.dilation,
            separable=step.separable))
        bns.append(p.bn_tpl.Copy().Set(dim=step.out_dim))
        dim = step.out_dim
    self.CreateChildren('conv', convs)
    self.CreateChildren('bn', bns)

  @classmethod
  def FPropMeta(cls, p, inputs):
    steps = OpSteps(p.op, p.in_dim, p.out_dim, p.stride)
    shape = ShapeList(inputs)
    flops = 0
    for step in steps:
      if step.kind == 'conv':
        conv_p = Conv2DLayer.Params().Set(
            in_dim=shape[3], out_dim=step.out_dim, kernel=step.kernel,
            stride=step.stride, dilation=step.dilation,
            separable=step.separable)
        meta = Conv2DLayer.FPropMeta(conv_p, tshape.Shape(shape))
        shape = ShapeList(meta.out_shapes[0])
        # ReLU before, batch norm after.
        flops += meta.flops + 11 * int(math.prod(shape))
      else:
        shape = [shape[0], StridedSize(shape[1], step.stride),
                 StridedSize(shape[2], step.stride), shape[3]]
        flops += step.size * step.size * int(math.prod(shape))
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape(shape),))

  def FProp(self, theta, inputs):
    """Applies the operation to `inputs` [batch, height, width, in_dim].

    Args:
      theta: this layer's variables.
      inputs: the input feature map.

    Returns:
      [batch, ceil(height / stride), ceil(width / stride), out_dim].
    """
    x = inputs
    conv_index = 0
    for step in self._steps:
      if step.kind == 'conv':
        x = tf.nn.relu(x)
        x = self.conv[conv_index].FProp(theta.conv[conv_index], x)
        x = self.bn[conv_index].FProp(theta.bn[conv_index], x)
        conv_index += 1
      else:
        pool = tf.nn.max_pool2d if step.pool == 'max' else tf.nn.avg_pool2d
        x = pool(x, step.size, step.stride, 'SAME')
    return x


class FactorizedReduceLayer(base_layer.BaseLayer):
  """Halves the resolution without dropping pixels: ReLU, two 1x1 paths, BN.

  One stride-2 1x1 convolution reads the even pixels, the other the odd ones
  (shifted by one row and column); their outputs are concatenated. It adapts
  the previous cell's state when the current cell input is already reduced.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('in_dim', 0, 'Input channels.')
    p.Define('out_dim', 0, 'Output channels (at least 2).')
    p.Define('bn_tpl', batch_norm.MicroBatchBatchNormLayer.Params(),
             'Batch norm after the concatenation.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.out_dim < 2:
      raise ValueError('FactorizedReduceLayer %s needs out_dim >= 2, got %d' %
                       (p.name, p.out_dim))
    half = p.out_dim // 2
    self.CreateChild('conv_even', Conv2DLayer.Params().Set(
        in_dim=p.in_dim, out_dim=half, stride=(2, 2)))
    self.CreateChild('conv_odd', Conv2DLayer.Params().Set(
        in_dim=p.in_dim, out_dim=p.out_dim - half, stride=(2, 2)))
    self.CreateChild('bn', p.bn_tpl.Copy().Set(dim=p.out_dim))

  @classmethod
  def FPropMeta(cls, p, inputs):
    b, h, w, c = ShapeList(inputs)
    out = [b, StridedSize(h, 2), StridedSize(w, 2), p.out_dim]
    positions = out[0] * out[1] * out[2]
    flops = 2 * positions * c * p.out_dim + 11 * positions * p.out_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape(out),))

  def FProp(self, theta, inputs):
    """Reduces `inputs` [batch, height, width, in_dim] by 2 in each axis.

    Args:
      theta: this layer's variables.
      inputs: the input feature map.

    Returns:
      [batch, ceil(height / 2), ceil(width / 2), out_dim].
    """
    x = tf.nn.relu(inputs)
    even = self.conv_even.FProp(theta.conv_even, x)
    # Shift by one pixel (zero-padding the far edge) for the odd positions.
    shifted = tf.pad(x[:, 1:, 1:, :], [[0, 0], [0, 1], [0, 1], [0, 0]])
    odd = self.conv_odd.FProp(theta.conv_odd, shifted)
    return self.bn.FProp(theta.bn, tf.concat([even, odd], axis=-1))
