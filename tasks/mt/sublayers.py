"""The Transformer's building pieces, below the unit the pipeline cuts at.

Attention, feed-forward and layer norm layers, the position signal, the
additive attention masks, and the dense / dropout helpers they share. None of
them reads or writes the pipeline's NestedMap: `blocks.py` composes them into
the layers of the flat, pipelineable list.
"""

import math

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
import numpy as np

# Added to attention logits of masked positions.
_MASK_LOGIT = -1e9


def Dense(x, w, b=None):
  """x [..., d] @ w [d, e] (+ b) -> [..., e], as one 2-D matmul.

  A reshape + matmul rather than an einsum: einsum's gradient with leading
  batch dimensions is many times slower on CPU.

  Args:
    x: [..., d] inputs.
    w: [d, e] weights.
    b: optional [e] bias.

  Returns:
    A [..., e] tensor.
  """
  shape = py_utils.GetShape(x)
  y = tf.matmul(tf.reshape(x, [-1, shape[-1]]), w)
  if b is not None:
    y += b
  return tf.reshape(y, shape[:-1] + [py_utils.GetShape(w)[-1]])


def Dropout(layer, x, dropout_prob, tag):
  """Dropout through the pipeline's randomness; identity in eval mode.

  The mask is keyed by the layer's path and `tag`, so a recomputed stage
  draws the same mask as its forward pass.

  Args:
    layer: the calling layer (its `do_eval` and `path` are read).
    x: a float tensor.
    dropout_prob: a Python float, the probability of dropping an element.
    tag: names the dropout site within the layer.

  Returns:
    A tensor like `x`.
  """
  if layer.do_eval or dropout_prob <= 0.0:
    return x
  return randomness.Dropout(x, 1.0 - dropout_prob, key=layer.path + '/' + tag)


def _FloatRange(n):
  """[n] float32 0, 1, ..., n - 1: a constant for a Python int `n`."""
  if isinstance(n, int):
    return tf.constant(np.arange(n, dtype=np.float32))
  return tf.cast(tf.range(n), tf.float32)


def SinusoidalPositions(length, dim):
  """[length, dim] sinusoidal position signal (no parameters).

  Args:
    length: a Python int, the sequence length.
    dim: a Python int, the model dimension (even).

  Returns:
    A float32 tensor of shape [length, dim].
  """
  # The ranges as float constants (the values of cast tf.range's): on a GPU
  # an int32 range is made in host memory and copied to the device for the
  # cast, and a float range reads its bounds from host memory.
  positions = _FloatRange(length)[:, tf.newaxis]
  half = dim // 2
  inv_freq = tf.exp(_FloatRange(half) * (-math.log(1.0e4) / max(half - 1, 1)))
  angles = positions * inv_freq[tf.newaxis, :]
  signal = tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)
  if dim % 2:
    signal = tf.pad(signal, [[0, 0], [0, 1]])
  return signal


def CausalBias(length):
  """[1, length, length] additive mask: position i sees positions <= i.

  Args:
    length: the sequence length.

  Returns:
    A float32 tensor, 0 where visible and a large negative value elsewhere.
  """
  future = 1.0 - tf.linalg.band_part(tf.ones([length, length]), -1, 0)
  return (future * _MASK_LOGIT)[tf.newaxis]


def RowAt(table, t):
  """Row `t` of constant `table` [L, ...], as [1, ...], sliced at `t`.

  Decoding steps index by the position `t`, an int32 scalar that a GPU keeps
  in host memory: read as a slice's begin (a host-memory argument) it stays
  there, where tf.gather(table, t) or tf.one_hot(t) would copy it to the
  device in every step (gpipe.measure.gpu_audit).

  Args:
    table: a tensor [L, ...].
    t: a scalar int32 tensor in [0, L).

  Returns:
    A tensor [1, ...].
  """
  rank = table.shape.rank
  return tf.slice(table, tf.stack([t] + [0] * (rank - 1)),
                  [1] + [-1] * (rank - 1))


def OneHotAt(t, length, dtype):
  """[length] of `dtype`: 1 at position `t`, 0 elsewhere (tf.one_hot's).

  Args:
    t: a scalar int32 tensor in [0, length).
    length: a Python int.
    dtype: the result's dtype.

  Returns:
    Row t of the identity matrix (see RowAt).
  """
  return RowAt(tf.constant(np.eye(length), dtype), t)[0]


def CausalBiasAt(t, length):
  """[1, 1, length] additive mask of one query position `t`: keys <= t.

  Row `t` of `CausalBias(length)`; used when decoding one position at a
  time.

  Args:
    t: a scalar int32 tensor, the query position.
    length: the number of key positions (a Python int).

  Returns:
    A float32 tensor, 0 where visible and a large negative value elsewhere.
  """
  keys = np.arange(length)
  future = (keys[np.newaxis, :] > keys[:, np.newaxis]).astype(np.float32)
  bias = tf.constant(future * np.float32(_MASK_LOGIT))
  return RowAt(bias, t)[tf.newaxis]


def PaddingBias(paddings):
  """[B, 1, S] additive mask hiding padded keys, from [B, S] paddings.

  Args:
    paddings: [B, S] float paddings (1.0 = padding).

  Returns:
    A tensor like `paddings` with a middle dimension of 1.
  """
  return (paddings * _MASK_LOGIT)[:, tf.newaxis, :]


def Normalize(x, scale, bias, epsilon):
  """(x - mean) / sqrt(variance + epsilon) * scale + bias over the last dim.

  Statistics in float32 also when `x` is bfloat16. The scale joins the
  inverse deviation before it meets the centered input: the textbook op
  order is rewritten by TF 2.15's oneDNN remapper into a fused layer norm
  that aborts the process ("key not found: value") whenever the input is a
  placeholder or a function argument (every stage function's is).

  Args:
    x: [..., dim] inputs.
    scale: [dim] (or a scalar).
    bias: [dim] (or a scalar).
    epsilon: added to the variance.

  Returns:
    The normalized `x`, in its dtype.
  """
  dtype = x.dtype
  x = tf.cast(x, tf.float32)
  centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
  variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
  scale, bias = (tf.cast(t, tf.float32) for t in (scale, bias))
  return tf.cast(centered * (tf.math.rsqrt(variance + epsilon) * scale) + bias,
                 dtype)


class LayerNorm(base_layer.BaseLayer):
  """Layer normalization over the last dimension, with scale and bias."""

  @classmethod
  def Params(cls):
    """The layer's params: `dim` and `epsilon`."""
    p = super().Params()
    p.Define('dim', 0, 'Dimension normalized.')
    p.Define('epsilon', 1e-6, 'Added to the variance.')
    return p

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable(
        'scale', py_utils.WeightParams([p.dim], py_utils.WeightInit.Constant(
            1.0), p.dtype))
    self.CreateVariable(
        'bias', py_utils.WeightParams([p.dim], py_utils.WeightInit.Constant(
            0.0), p.dtype))

  def FProp(self, theta, x):
    """Normalizes `x` over its last dimension.

    Args:
      theta: the layer's variables (``scale`` and ``bias``).
      x: [..., dim] inputs.

    Returns:
      (x - mean) / sqrt(variance + epsilon) * scale + bias, shaped like `x`.
    """
    return Normalize(x, theta.scale, theta.bias, self.params.epsilon)


class MultiHeadAttention(base_layer.BaseLayer):
  """Multi-head dot-product attention with input and output projections."""

  @classmethod
  def Params(cls):
    """The layer's params: dimensions, heads and attention dropout."""
    p = super().Params()
    p.Define('model_dim', 0, 'Model (and attention) dimension.')
    p.Define('num_heads', 1, 'Number of heads; must divide model_dim.')
    p.Define('atten_dropout_prob', 0.0,
             'Dropout on the attention probabilities.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.model_dim % p.num_heads:
      raise ValueError('%s: model_dim %d is not divisible by num_heads %d; '
                       'choose a head count that divides the model dimension' %
                       (p.name, p.model_dim, p.num_heads))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    init = p.params_init
    for name in ('query', 'key', 'value', 'post'):
      self.CreateVariable(
          'w_' + name,
          py_utils.WeightParams([p.model_dim, p.model_dim], init, p.dtype))
      self.CreateVariable(
          'b_' + name,
          py_utils.WeightParams([p.model_dim],
                                py_utils.WeightInit.Constant(0.0), p.dtype))

  def _Heads(self, x):
    """[B, T, D] -> [B, N, T, D/N]."""
    p = self.params
    b, t = py_utils.GetShape(x, 2)
    x = tf.reshape(x, [b, t, p.num_heads, p.model_dim // p.num_heads])
    return tf.transpose(x, [0, 2, 1, 3])

  def FProp(self, theta, query, memory, bias):
    """Attends from `query` [B, T, D] to `memory` [B, S, D].

    Args:
      theta: the layer's variables.
      query: [B, T, D] queries.
      memory: [B, S, D] keys and values.
      bias: additive logits mask broadcastable to [B, T, S] (0 = visible,
        a large negative value = hidden).

    Returns:
      [B, T, D] attention outputs.
    """
    keys, values = self.KeysAndValues(theta, memory)
    return self.Attend(theta, query, keys, values, bias)

  def KeysAndValues(self, theta, memory):
    """Per-head keys and values of `memory`.

    Args:
      theta: the layer's variables.
      memory: [B, S, D] the attended states.

    Returns:
      (keys, values), each [B, N, S, D/N].
    """
    return (self._Heads(Dense(memory, theta.w_key, theta.b_key)),
            self._Heads(Dense(memory, theta.w_value, theta.b_value)))

  def Attend(self, theta, query, keys, values, bias):
    """Attends from `query` [B, T, D] to per-head `keys` / `values`.

    Args:
      theta: the layer's variables.
      query: [B, T, D] queries.
      keys: [B, N, S, D/N] from `KeysAndValues` (or a decoding cache).
      values: [B, N, S, D/N], likewise.
      bias: additive logits mask broadcastable to [B, T, S].

    Returns:
      [B, T, D] attention outputs.
    """
    p = self.params
    q = self._Heads(Dense(query, theta.w_query, theta.b_query))
    q *= (p.model_dim // p.num_heads)**-0.5
    logits = tf.matmul(q, keys, transpose_b=True)
    logits += tf.cast(bias, logits.dtype)[:, tf.newaxis]
    probs = tf.nn.softmax(logits)
    probs = Dropout(self, probs, p.atten_dropout_prob, 'atten')
    context = tf.matmul(probs, values)  # [B, N, T, D/N]
    b, _, t, _ = py_utils.GetShape(context, 4)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                         [b, t, p.model_dim])
    return Dense(context, theta.w_post, theta.b_post)

  @classmethod
  def Flops(cls, p, batch, query_len, memory_len):
    """Multiply-adds x2 of one FProp.

    Args:
      p: the layer's params (only `model_dim` is read).
      batch: the batch size B.
      query_len: query positions T.
      memory_len: memory positions S.

    Returns:
      A Python int.
    """
    d = p.model_dim
    projections = 2 * batch * d * d * (2 * query_len + 2 * memory_len)
    attention = 2 * 2 * batch * query_len * memory_len * d
    return projections + attention


class FeedForward(base_layer.BaseLayer):
  """Two dense layers with a ReLU between (model_dim -> hidden -> model_dim)."""

  @classmethod
  def Params(cls):
    """The layer's params: dimensions and the dropout after the ReLU."""
    p = super().Params()
    p.Define('model_dim', 0, 'Input and output dimension.')
    p.Define('hidden_dim', 0, 'Hidden (feed-forward) dimension H.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout after the ReLU.')
    return p

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    zeros = py_utils.WeightInit.Constant(0.0)
    self.CreateVariable(
        'w_in',
        py_utils.WeightParams([p.model_dim, p.hidden_dim], p.params_init,
                              p.dtype))
    self.CreateVariable('b_in',
                        py_utils.WeightParams([p.hidden_dim], zeros, p.dtype))
    self.CreateVariable(
        'w_out',
        py_utils.WeightParams([p.hidden_dim, p.model_dim], p.params_init,
                              p.dtype))
    self.CreateVariable('b_out',
                        py_utils.WeightParams([p.model_dim], zeros, p.dtype))

  def FProp(self, theta, x):
    """[..., model_dim] -> [..., model_dim].

    Args:
      theta: the layer's variables.
      x: [..., model_dim] inputs.

    Returns:
      A tensor like `x`.
    """
    p = self.params
    h = tf.nn.relu(Dense(x, theta.w_in, theta.b_in))
    h = Dropout(self, h, p.relu_dropout_prob, 'relu')
    return Dense(h, theta.w_out, theta.b_out)

  @classmethod
  def Flops(cls, p, tokens):
    """Multiply-adds x2 of one FProp over `tokens` positions.

    Args:
      p: the layer's params.
      tokens: the number of positions (batch x length).

    Returns:
      A Python int.
    """
    return 2 * 2 * tokens * p.model_dim * p.hidden_dim
