"""Mixed precision in a pipeline: bfloat16 compute, float32 master state.

Lingvo's way: a layer whose ``fprop_dtype`` (bfloat16) differs from its
``dtype`` (float32) keeps float32 variables, and its ``theta`` casts them to
``fprop_dtype`` (``BaseLayer._InternalGetTheta``), so the layer computes in
bfloat16 while the optimizer and its slots see float32 variables and
gradients. ``SetFPropDtype`` sets it on every layer of a params tree
(``py_utils.UpdateFpropDtype``).

A pipeline needs three things more, which this module provides:

* Gradient accumulation in float32. Lingvo's cast happens when the pipeline
  reads theta, outside the stage calls: the M micro-batch gradients of a
  bfloat16 theta would be summed in bfloat16. ``MasterTheta`` takes the cast
  off again (the float32 reads and the dtype each was cast to), and
  ``AttachLowPrecision`` gives each micro-batch a bfloat16 view whose gradient
  enters the float32 running sum (``accumulation.AccumulationViews``): the weights
  are cast once per stage and step, each micro-batch's bfloat16 weight
  gradient is cast to float32 and added in float32.
* Stage hand-overs in bfloat16: the pipeline casts its floating inputs to
  its ``fprop_dtype`` before splitting them (``CastFloats``), so every stage
  computes in bfloat16 and hands bfloat16 tensors (and gradients) on.
* The loss in float32: the pipeline's loss layer (``loss_tpl``) runs with
  ``fprop_dtype`` float32 on float32 copies of its inputs, and the merged
  output of a pipeline without one is cast back to float32.

float16 is refused: its 5-bit exponent underflows small gradients to zero
without loss scaling, which this project does not implement. bfloat16 has
float32's exponent range and needs none.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import hyperparams
from lingvo.core import py_utils

# The --fprop_dtype values (float32: no mixed precision).
FPROP_DTYPES = ('float32', 'bfloat16')


def ParseFPropDtype(name):
  """The tf.DType of an --fprop_dtype value, or a clear error.

  Args:
    name: 'float32' or 'bfloat16' (a tf.DType is accepted too).

  Returns:
    tf.float32 or tf.bfloat16.

  Raises:
    ValueError: float16 (needs loss scaling) or any other value.
  """
  text = name.name if isinstance(name, tf.DType) else str(name)
  if text in ('float16', 'half'):
    raise ValueError(
        'fprop_dtype=float16 is not supported: float16 gradients underflow '
        'to zero without loss scaling, which is not implemented here; use '
        'bfloat16 (float32\'s exponent range, no loss scaling needed)')
  if text not in FPROP_DTYPES:
    raise ValueError('fprop_dtype=%s is unknown; use one of %s' %
                     (text, ', '.join(FPROP_DTYPES)))
  return tf.as_dtype(text)


def SetFPropDtype(params, name):
  """Sets `fprop_dtype` on every layer params in `params` (in place).

  float32 leaves the params alone (float32 compute). Variables
  keep their dtype (float32): only the compute dtype changes.

  Args:
    params: a hyperparams.Params tree (a model, task or layer params).
    name: an --fprop_dtype value.

  Returns:
    The tf.DType.
  """
  dtype = ParseFPropDtype(name)
  if dtype != tf.float32 and isinstance(params, hyperparams.Params):
    py_utils.UpdateFpropDtype(params, dtype)
  return dtype


def IsMixed(params):
  """Whether a layer's params compute in another dtype than its variables."""
  return (params.fprop_dtype is not None and
          tf.as_dtype(params.fprop_dtype) != tf.as_dtype(params.dtype))


def ComputeDtype(params):
  """A pipeline's compute dtype: its fprop_dtype if mixed, else None."""
  return params.fprop_dtype if IsMixed(params) else None


def KeepLossInMasterDtype(pipeline_params, loss_params):
  """A mixed-precision pipeline's loss layer computes in its master dtype.

  Whatever fprop_dtype it was given (SetFPropDtype, or Lingvo's
  CopyBaseParams from the pipeline): the loss is float32 under mixed
  precision. Without mixed precision the params are left alone (the loss
  layer then inherits the pipeline's dtype, e.g. float64).

  Args:
    pipeline_params: the pipeline's params.
    loss_params: the loss layer's params (changed in place).
  """
  if IsMixed(pipeline_params):
    loss_params.fprop_dtype = pipeline_params.dtype


def ToMasterDtype(params, outputs):
  """A mixed-precision pipeline's merged outputs, cast to params.dtype."""
  if not IsMixed(params):
    return outputs
  return CastFloats(outputs, params.dtype)


def CastFloats(nest, dtype):
  """`nest` with its floating tensors cast to `dtype` (others unchanged)."""
  if dtype is None:
    return nest
  dtype = tf.as_dtype(dtype)

  def Cast(t):
    if ((isinstance(t, tf.Tensor) or hasattr(t, 'handle')) and
        t.dtype.base_dtype.is_floating and t.dtype.base_dtype != dtype):
      return tf.cast(t, dtype)  # A tensor or a variable.
    return t

  return tf.nest.map_structure(Cast, nest)


def MasterTheta(theta):
  """Takes Lingvo's fprop_dtype casts off a theta NestedMap.

  Args:
    theta: a NestedMap of tensors/variables, as a layer's ``theta`` gives.

  Returns:
    (master, dtypes): master has each float32 -> low-precision cast
    replaced by its float32 input; dtypes has the same structure, the dtype
    each leaf was cast to, or None for leaves that were not cast.
  """
  def Master(t):
    if (isinstance(t, tf.Tensor) and t.op.type == 'Cast' and
        t.dtype in (tf.bfloat16, tf.float16) and
        t.op.inputs[0].dtype == tf.float32):
      return t.op.inputs[0]
    return t

  def Dtype(t):
    return t.dtype if Master(t) is not t else None

  return theta.Transform(Master), theta.Transform(Dtype)


def AttachLowPrecision(masters, lows):
  """`lows` (casts of `masters`), whose gradients flow into `masters`.

  The forward is an identity of `lows`; the gradient of each output is cast
  to its master's dtype and becomes the master's gradient (the lows get none:
  they are cast once and shared by all micro-batches).

  Args:
    masters: float32 tensors (one chain element per micro-batch).
    lows: their low-precision casts, same length.

  Returns:
    A list of tensors equal to `lows`.
  """
  if not masters:
    return []
  n = len(masters)

  @tf.custom_gradient
  def Attach(*xs):
    outs = tf.identity_n(list(xs[n:]))

    def Grad(*dys):
      return [None if dy is None else tf.cast(dy, m.dtype)
              for dy, m in zip(dys, masters)] + [None] * n

    return outs, Grad

  return list(Attach(*(list(masters) + list(lows))))
