"""AmoebaNet normal and reduction cells, driven by genotype data.

A cell takes ``(current, previous, *extras)``: its input, the input of the cell
before it, and tensors it only carries along (the auxiliary head's logits once
they exist). It returns ``(output, current, *extras)``, so a flat sequence of
cells passes its two states from layer to layer and can be cut anywhere into
pipeline stages.

Inside, both inputs are first brought to ``filters`` channels at the cell's
input resolution (state 0 by a ReLU-1x1-BN; state 1 by a factorized reduction
when it has twice the resolution, or a ReLU-1x1-BN when its channels differ).
The genotype then adds five combinations of two operations each; a reduction
cell applies stride 2 to the operations that read state 0 or 1. The output
concatenates the states the genotype marks as unused.

Drop path drops whole operation outputs per example (noise shape
``[batch, 1, 1, 1]``) with the cell's keep probability; the network builder
lowers it with depth, and ``drop_path_decay_steps`` optionally ramps it from 1
to that value over training.
"""

from gpipe import batch_norm
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape
from tasks.image import genotypes
from tasks.image import ops


def DropPath(x, keep_prob, key):
  """Drops each example of `x` [batch, ...] with probability 1 - keep_prob.

  Uses the micro-batch seed of gpipe.randomness, so the recomputed forward
  pass of a pipeline stage drops the same examples.

  Args:
    x: a float tensor with a static batch size.
    keep_prob: a Python float or a scalar float tensor.
    key: a string naming the caller (e.g. the layer path plus an index).

  Returns:
    A tensor like `x`, kept examples scaled by 1 / keep_prob.
  """
  noise_shape = [x.shape[0]] + [1] * (x.shape.rank - 1)
  if not isinstance(keep_prob, tf.Tensor):
    return randomness.Dropout(x, float(keep_prob), key, noise_shape=noise_shape)
  # A keep probability that depends on the step is a tensor, which
  # randomness.Dropout (Python floats only) does not take; use its seed.
  keep_prob = tf.cast(keep_prob, x.dtype)
  seed = randomness.SeedPair(key)
  if seed is None:
    uniform = tf.random.uniform(noise_shape, dtype=x.dtype)
  else:
    uniform = randomness.StatelessUniform(noise_shape, seed, x.dtype)
  keep = tf.cast(uniform < keep_prob, x.dtype)
  return x * keep / keep_prob


class CellLayer(base_layer.BaseLayer):
  """One AmoebaNet cell (normal or reduction), see the module docstring."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('ops', [], 'Genotype operation names (10).')
    p.Define('inputs', [], 'Genotype state index read by each operation.')
    p.Define('used', [], 'Genotype used flags; states with 0 are the output.')
    p.Define('reduction', False,
             'Reduction cell: stride 2 on operations reading state 0 or 1.')
    p.Define('in_dim', 0, 'Channels of the current input (state 0).')
    p.Define('prev_dim', 0, 'Channels of the previous input (state 1).')
    p.Define('prev_stride', 1,
             '2 if the previous input has twice the resolution of the '
             'current one (the cell before was a reduction cell).')
    p.Define('filters', 0, 'Channels of every state inside the cell.')
    p.Define('drop_path_keep_prob', 1.0,
             'Keep probability of drop path in this cell (1: off).')
    p.Define('drop_path_decay_steps', 0,
             'If > 0, the drop path keep probability goes linearly from 1 at '
             'step 0 to drop_path_keep_prob at this global step.')
    p.Define('bn_tpl', batch_norm.MicroBatchBatchNormLayer.Params(),
             'Batch norm template.')
    return p

  @classmethod
  def SetGenotype(cls, p, genotype):
    """Copies the genotypes.Genotype `genotype` into params `p`; returns p."""
    genotypes.Validate(genotype)
    p.ops = list(genotype.ops)
    p.inputs = list(genotype.inputs)
    p.used = list(genotype.used)
    return p

  @classmethod
  def NumOutputStates(cls, p):
    """How many states the cell concatenates."""
    return len(genotypes.OutputStates(cls._Genotype(p)))

  @classmethod
  def OutDim(cls, p):
    """Channels of the cell output."""
    return p.filters * cls.NumOutputStates(p)

  @classmethod
  def _Genotype(cls, p):
    return genotypes.Genotype(tuple(p.ops), tuple(p.inputs), tuple(p.used))

  @classmethod
  def _OpStride(cls, p, i):
    return 2 if p.reduction and p.inputs[i] < 2 else 1

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    genotype = self._Genotype(p)
    genotypes.Validate(genotype)
    if p.in_dim <= 0 or p.prev_dim <= 0 or p.filters <= 0:
      raise ValueError('CellLayer %s needs in_dim, prev_dim and filters > 0, '
                       'got %d, %d, %d' % (p.name, p.in_dim, p.prev_dim,
                                           p.filters))
    if p.prev_stride not in (1, 2):
      raise ValueError('CellLayer %s: prev_stride must be 1 or 2, got %r' %
                       (p.name, p.prev_stride))
    if p.reduction and min(genotypes.OutputStates(genotype)) < 2:
      raise ValueError('Reduction cell %s concatenates an unreduced input '
                       'state; its genotype is not a reduction genotype.' %
                       p.name)
    adjust = ops.OperationLayer.Params().Set(bn_tpl=p.bn_tpl)
    self.CreateChild('adjust_current', adjust.Copy().Set(
        op='1x1', in_dim=p.in_dim, out_dim=p.filters))
    if p.prev_stride == 2:
      self.CreateChild('adjust_previous',
                       ops.FactorizedReduceLayer.Params().Set(
                           in_dim=p.prev_dim, out_dim=p.filters,
                           bn_tpl=p.bn_tpl))
    else:
      # 'none' is the identity when the channels already match.
      self.CreateChild('adjust_previous', adjust.Copy().Set(
          op='none', in_dim=p.prev_dim, out_dim=p.filters))
    self.CreateChildren('op', [
        adjust.Copy().Set(op=name, in_dim=p.filters, out_dim=p.filters,
                          stride=self._OpStride(p, i))
        for i, name in enumerate(p.ops)
    ])

  @classmethod
  def FPropMeta(cls, p, current, previous=None, *extras):
    if previous is None:
      previous = current
    b, h, w, _ = ops.ShapeList(current)
    state_shape = tshape.Shape([b, h, w, p.filters])
    flops = ops.OperationLayer.FPropMeta(
        ops.OperationLayer.Params().Set(op='1x1', in_dim=p.in_dim,
                                        out_dim=p.filters), current).flops
    if p.prev_stride == 2:
      prev_p = ops.FactorizedReduceLayer.Params().Set(in_dim=p.prev_dim,
                                                      out_dim=p.filters)
      flops += ops.FactorizedReduceLayer.FPropMeta(prev_p, previous).flops
    else:
      prev_p = ops.OperationLayer.Params().Set(op='none', in_dim=p.prev_dim,
                                               out_dim=p.filters)
      flops += ops.OperationLayer.FPropMeta(prev_p, previous).flops
    out_h, out_w = h, w
    for i, name in enumerate(p.ops):
      stride = cls._OpStride(p, i)
      op_p = ops.OperationLayer.Params().Set(op=name, in_dim=p.filters,
                                             out_dim=p.filters, stride=stride)
      meta = ops.OperationLayer.FPropMeta(op_p, state_shape)
      flops += meta.flops
      if stride == 2:
        out_h, out_w = ops.ShapeList(meta.out_shapes[0])[1:3]
    # The adds of the 5 combinations.
    flops += len(p.ops) // 2 * b * out_h * out_w * p.filters
    out = tshape.Shape([b, out_h, out_w, cls.OutDim(p)])
    return py_utils.NestedMap(
        flops=flops, out_shapes=(out, current) + tuple(extras))

  def _DropPathKeepProb(self):
    p = self.params
    if self.do_eval or p.drop_path_keep_prob >= 1.0:
      return 1.0
    if p.drop_path_decay_steps <= 0:
      return p.drop_path_keep_prob
    step = tf.cast(py_utils.GetGlobalStep(), tf.float32)
    progress = tf.minimum(step / float(p.drop_path_decay_steps), 1.0)
    return 1.0 - progress * (1.0 - p.drop_path_keep_prob)

  def FProp(self, theta, current, previous=None, *extras):
    """Runs the cell.

    Args:
      theta: this layer's variables.
      current: [batch, height, width, in_dim], the previous layer's output.
      previous: the input of the previous cell, [batch, height * prev_stride,
        width * prev_stride, prev_dim]; None (first cell) uses `current`.
      *extras: tensors passed through unchanged (e.g. auxiliary logits).

    Returns:
      (output, current, *extras); output is [batch, height', width',
      filters * number of output states], height' = height / 2 in a reduction
      cell.
    """
    p = self.params
    if previous is None:
      previous = current
    states = [
        self.adjust_current.FProp(theta.adjust_current, current),
        self.adjust_previous.FProp(theta.adjust_previous, previous),
    ]
    keep_prob = self._DropPathKeepProb()
    for i in range(0, len(p.ops), 2):
      combination = []
      for j in (i, i + 1):
        h = self.op[j].FProp(theta.op[j], states[p.inputs[j]])
        if p.ops[j] != 'none' and (
            not isinstance(keep_prob, float) or keep_prob < 1.0):
          # Like the reference, drop path skips the 'none' operations.
          h = DropPath(h, keep_prob, '%s/op_%d' % (self.path, j))
        combination.append(h)
      states.append(combination[0] + combination[1])
    output = tf.concat(
        [states[i] for i in genotypes.OutputStates(self._Genotype(p))],
        axis=-1)
    return (output, current) + tuple(extras)
