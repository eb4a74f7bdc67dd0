"""Transformer layers that form one flat, pipelineable sequence.

An encoder-decoder Transformer T(L, H, A) is the flat list

  [EmbeddingLayer, EncoderLayer x L, DecoderLayer x L, SoftmaxLayer]

and a decoder-only language model (the paper's Table 1 "Transformer-L") is

  [EmbeddingLayer(has_source=False), DecoderLayer(has_cross_attention=False)
   x L, SoftmaxLayer].

Every layer takes and returns one `py_utils.NestedMap` whose tensors all have
the batch as dimension 0, so the pipeline can cut the list anywhere and split
the map into micro-batches. The map carries:

  * ``src`` [B, S, D] source states (after the embedding) and
    ``src_paddings`` [B, S] (1.0 = padding); absent in a decoder-only stack.
  * ``tgt`` [B, T, D] target states, ``tgt_paddings`` [B, T].
  * ``tgt_labels`` [B, T] int32 next-token labels and ``tgt_weights`` [B, T],
    carried untouched to the softmax layer, which returns per-example loss
    sums (see `SoftmaxLayer.FProp`).

The embedding layer reads ``src_ids`` / ``tgt_ids`` instead of ``src`` / ``tgt``.
Layers are pre-layer-norm residual blocks; the last encoder layer applies the
encoder's final layer norm (``final_layer_norm=True``), the softmax layer the
decoder's. Dropout goes through `gpipe.randomness.Dropout`, so recomputed
stages draw the same masks and micro-batches draw different ones.
"""

import math

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import randomness
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape

# Added to attention logits of masked positions.
_MASK_LOGIT = -1e9


def _Dim(d):
  """An int from a tshape dimension; 1 if it is symbolic (unknown)."""
  try:
    return int(d)
  except TypeError:
    return 1


def _Dense(x, w, b=None):
  """x [..., d] @ w [d, e] (+ b) -> [..., e], as one 2-D matmul.

  A reshape + matmul rather than an einsum: einsum's gradient with leading
  batch dimensions is many times slower on CPU.
  """
  shape = py_utils.GetShape(x)
  y = tf.matmul(tf.reshape(x, [-1, shape[-1]]), w)
  if b is not None:
    y += b
  return tf.reshape(y, shape[:-1] + [py_utils.GetShape(w)[-1]])


def _Shape3(shape2, dim):
  """[B, T] tshape -> [B, T, dim] tshape."""
  return tshape.Shape([shape2[0], shape2[1], dim])


def _Dropout(layer, x, dropout_prob, tag):
  """Dropout through the pipeline's randomness; identity in eval mode."""
  if layer.do_eval or dropout_prob <= 0.0:
    return x
  return randomness.Dropout(x, 1.0 - dropout_prob, key=layer.path + '/' + tag)


def SinusoidalPositions(length, dim):
  """[length, dim] sinusoidal position signal (no parameters).

  Args:
    length: a Python int, the sequence length.
    dim: a Python int, the model dimension (even).

  Returns:
    A float32 tensor of shape [length, dim].
  """
  positions = tf.cast(tf.range(length), tf.float32)[:, tf.newaxis]
  half = dim // 2
  inv_freq = tf.exp(
      tf.cast(tf.range(half), tf.float32) * (-math.log(1.0e4) / max(half - 1,
                                                                    1)))
  angles = positions * inv_freq[tf.newaxis, :]
  signal = tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)
  if dim % 2:
    signal = tf.pad(signal, [[0, 0], [0, 1]])
  return signal


def CausalBias(length):
  """[1, length, length] additive mask: position i sees positions <= i."""
  future = 1.0 - tf.linalg.band_part(tf.ones([length, length]), -1, 0)
  return (future * _MASK_LOGIT)[tf.newaxis]


def PaddingBias(paddings):
  """[B, 1, S] additive mask hiding padded keys, from [B, S] paddings."""
  return (paddings * _MASK_LOGIT)[:, tf.newaxis, :]


class LayerNorm(base_layer.BaseLayer):
  """Layer normalization over the last dimension, with scale and bias."""

  @classmethod
  def Params(cls):
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
    """Normalizes `x` [..., dim]."""
    p = self.params
    centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    # The scale joins the inverse deviation before it meets `centered`: the
    # textbook op order is rewritten by TF 2.15's oneDNN remapper into a fused
    # layer norm that aborts the process ("key not found: value") whenever
    # the input is a placeholder or a function argument.
    return centered * (tf.math.rsqrt(variance + p.epsilon) * theta.scale) + (
        theta.bias)


class MultiHeadAttention(base_layer.BaseLayer):
  """Multi-head dot-product attention with input and output projections."""

  @classmethod
  def Params(cls):
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
    """Per-head keys and values [B, N, S, D/N] of `memory` [B, S, D]."""
    return (self._Heads(_Dense(memory, theta.w_key, theta.b_key)),
            self._Heads(_Dense(memory, theta.w_value, theta.b_value)))

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
    q = self._Heads(_Dense(query, theta.w_query, theta.b_query))
    q *= (p.model_dim // p.num_heads)**-0.5
    logits = tf.matmul(q, keys, transpose_b=True) + bias[:, tf.newaxis]
    probs = tf.nn.softmax(logits)
    probs = _Dropout(self, probs, p.atten_dropout_prob, 'atten')
    context = tf.matmul(probs, values)  # [B, N, T, D/N]
    b, _, t, _ = py_utils.GetShape(context, 4)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                         [b, t, p.model_dim])
    return _Dense(context, theta.w_post, theta.b_post)

  @classmethod
  def Flops(cls, p, batch, query_len, memory_len):
    """Multiply-adds x2 of one FProp."""
    d = p.model_dim
    projections = 2 * batch * d * d * (2 * query_len + 2 * memory_len)
    attention = 2 * 2 * batch * query_len * memory_len * d
    return projections + attention


class FeedForward(base_layer.BaseLayer):
  """Two dense layers with a ReLU between (model_dim -> hidden -> model_dim)."""

  @classmethod
  def Params(cls):
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
    """[..., model_dim] -> [..., model_dim]."""
    p = self.params
    h = tf.nn.relu(_Dense(x, theta.w_in, theta.b_in))
    h = _Dropout(self, h, p.relu_dropout_prob, 'relu')
    return _Dense(h, theta.w_out, theta.b_out)

  @classmethod
  def Flops(cls, p, tokens):
    return 2 * 2 * tokens * p.model_dim * p.hidden_dim


def _FfnParams(model_dim, hidden_dim, relu_dropout_prob, init_scale):
  """FeedForward params whose weights' Xavier init is scaled by init_scale."""
  return FeedForward.Params().Set(
      name='ffn', model_dim=model_dim, hidden_dim=hidden_dim,
      relu_dropout_prob=relu_dropout_prob,
      params_init=py_utils.WeightInit.Xavier(init_scale))


class _BlockParams:
  """Shared hyperparameters of encoder and decoder layers."""

  @staticmethod
  def Define(p):
    p.Define('model_dim', 1024, 'Model dimension D.')
    p.Define('hidden_dim', 8192, 'Feed-forward dimension H.')
    p.Define('num_heads', 16, 'Attention heads A.')
    p.Define('residual_dropout_prob', 0.0,
             'Dropout on each sub-block output before the residual add.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probabilities.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout inside the feed-forward.')
    p.Define('ffn_init_scale', 1.0,
             'Scale of the feed-forward weights\' Xavier init. The paper '
             'scales it down by the number of layers for deep models '
             '(`stack.py` sets 1/num_layers when asked).')
    p.Define('final_layer_norm', False,
             'Apply a layer norm to the output (the last encoder layer of a '
             'pre-layer-norm stack does, so the decoder attends to '
             'normalized states).')


class EncoderLayer(base_layer.BaseLayer):
  """Self-attention + feed-forward over ``src``; the rest passes through."""

  @classmethod
  def Params(cls):
    p = super().Params()
    _BlockParams.Define(p)
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('atten_ln', LayerNorm.Params().Set(dim=p.model_dim))
    self.CreateChild(
        'atten',
        MultiHeadAttention.Params().Set(
            model_dim=p.model_dim, num_heads=p.num_heads,
            atten_dropout_prob=p.atten_dropout_prob))
    self.CreateChild('ffn_ln', LayerNorm.Params().Set(dim=p.model_dim))
    self.CreateChild(
        'ffn', _FfnParams(p.model_dim, p.hidden_dim, p.relu_dropout_prob,
                          p.ffn_init_scale))
    if p.final_layer_norm:
      self.CreateChild('final_ln', LayerNorm.Params().Set(dim=p.model_dim))

  def FProp(self, theta, inputs):
    """Updates ``inputs.src`` [B, S, D]; returns a new NestedMap."""
    p = self.params
    out = inputs.copy()
    x = inputs.src
    h = self.atten_ln.FProp(theta.atten_ln, x)
    h = self.atten.FProp(theta.atten, h, h, PaddingBias(inputs.src_paddings))
    x += _Dropout(self, h, p.residual_dropout_prob, 'atten_residual')
    h = self.ffn.FProp(theta.ffn, self.ffn_ln.FProp(theta.ffn_ln, x))
    x += _Dropout(self, h, p.residual_dropout_prob, 'ffn_residual')
    if p.final_layer_norm:
      x = self.final_ln.FProp(theta.final_ln, x)
    out.src = x
    return out

  @classmethod
  def FPropMeta(cls, p, inputs):
    b, s = _Dim(inputs.src[0]), _Dim(inputs.src[1])
    atten = MultiHeadAttention.Params().Set(model_dim=p.model_dim)
    ffn = FeedForward.Params().Set(model_dim=p.model_dim,
                                   hidden_dim=p.hidden_dim)
    flops = (MultiHeadAttention.Flops(atten, b, s, s) +
             FeedForward.Flops(ffn, b * s))
    return py_utils.NestedMap(flops=flops, out_shapes=(inputs,))


class DecoderLayer(base_layer.BaseLayer):
  """Causal self-attention, cross-attention to ``src`` and feed-forward.

  Updates ``tgt``; a decoder-only stack sets ``has_cross_attention=False``.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    _BlockParams.Define(p)
    p.Define('has_cross_attention', True,
             'Attend to the encoder output ``src`` (False: a language model '
             'layer).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    atten = MultiHeadAttention.Params().Set(
        model_dim=p.model_dim, num_heads=p.num_heads,
        atten_dropout_prob=p.atten_dropout_prob)
    self.CreateChild('self_atten_ln', LayerNorm.Params().Set(dim=p.model_dim))
    self.CreateChild('self_atten', atten.Copy())
    if p.has_cross_attention:
      self.CreateChild('cross_atten_ln',
                       LayerNorm.Params().Set(dim=p.model_dim))
      self.CreateChild('cross_atten', atten.Copy())
    self.CreateChild('ffn_ln', LayerNorm.Params().Set(dim=p.model_dim))
    self.CreateChild(
        'ffn', _FfnParams(p.model_dim, p.hidden_dim, p.relu_dropout_prob,
                          p.ffn_init_scale))
    if p.final_layer_norm:
      self.CreateChild('final_ln', LayerNorm.Params().Set(dim=p.model_dim))

  def FProp(self, theta, inputs):
    """Updates ``inputs.tgt`` [B, T, D]; returns a new NestedMap."""
    p = self.params
    out = inputs.copy()
    x = inputs.tgt
    length = py_utils.GetShape(x, 3)[1]
    # Padded target positions come after the real ones, so the causal mask
    # alone keeps real positions from seeing them.
    h = self.self_atten_ln.FProp(theta.self_atten_ln, x)
    h = self.self_atten.FProp(theta.self_atten, h, h, CausalBias(length))
    x += _Dropout(self, h, p.residual_dropout_prob, 'self_atten_residual')
    source = (self._Source(theta, inputs.src, inputs.src_paddings)
              if p.has_cross_attention else None)
    out.tgt = self._AfterSelfAttention(theta, x, source)
    return out

  def _Source(self, theta, src, src_paddings):
    """Cross-attention keys, values and padding bias of the encoder output."""
    source = py_utils.NestedMap(bias=PaddingBias(src_paddings))
    source.key, source.value = self.cross_atten.KeysAndValues(
        theta.cross_atten, src)
    return source

  def _AfterSelfAttention(self, theta, x, source):
    """Cross-attention to `source` (if any), feed-forward, final norm."""
    p = self.params
    if p.has_cross_attention:
      h = self.cross_atten_ln.FProp(theta.cross_atten_ln, x)
      h = self.cross_atten.Attend(theta.cross_atten, h, source.key,
                                  source.value, source.bias)
      x += _Dropout(self, h, p.residual_dropout_prob, 'cross_atten_residual')
    h = self.ffn.FProp(theta.ffn, self.ffn_ln.FProp(theta.ffn_ln, x))
    x += _Dropout(self, h, p.residual_dropout_prob, 'ffn_residual')
    if p.final_layer_norm:
      x = self.final_ln.FProp(theta.final_ln, x)
    return x

  # --- Incremental decoding ---------------------------------------------
  #
  # Decoding one position at a time with FProp would recompute every earlier
  # position at every step (quadratic in the target length). These two methods
  # keep each position's self-attention keys and values in a cache instead,
  # and the source's cross-attention keys and values are computed once; the
  # outputs equal FProp's at every position (tested).

  def InitDecodeState(self, theta, batch, max_len, src=None,
                      src_paddings=None):
    """The state `ExtendStep` needs, before position 0.

    Args:
      theta: the layer's variables.
      batch: rows decoded together (an int or a scalar tensor).
      max_len: positions to decode (a Python int).
      src: [B, S, D] encoder output (with cross-attention).
      src_paddings: [B, S] its paddings.

    Returns:
      (cache, source): `cache` is a (keys, values) tuple of zeros
      [B, N, max_len, D/N] that `ExtendStep` fills position by position (a
      loop variable); `source` is a NestedMap of the cross-attention keys,
      values and padding bias (loop-invariant; None without cross-attention).
    """
    p = self.params
    shape = [batch, p.num_heads, max_len, p.model_dim // p.num_heads]
    cache = (tf.zeros(shape), tf.zeros(shape))
    if not p.has_cross_attention:
      return cache, None
    if src is None or src_paddings is None:
      raise ValueError('%s: decoding with cross-attention needs the encoder '
                       'output src and src_paddings' % p.name)
    return cache, self._Source(theta, src, src_paddings)

  def ExtendStep(self, theta, x, t, cache, source):
    """FProp of one target position `t`, attending to positions <= t.

    Args:
      theta: the layer's variables.
      x: [B, 1, D] the layer's input at position t.
      t: a scalar int32 tensor, the position.
      cache: (keys, values) of positions < t, from `InitDecodeState` or the
        previous `ExtendStep`.
      source: from `InitDecodeState`.

    Returns:
      ([B, 1, D] the layer's output at position t, the cache with position t
      added).
    """
    p = self.params
    keys, values = cache
    max_len = py_utils.GetShape(keys, 4)[2]
    h = self.self_atten_ln.FProp(theta.self_atten_ln, x)
    new_keys, new_values = self.self_atten.KeysAndValues(theta.self_atten, h)
    # Write position t: x * 1 + y * 0 leaves the other positions bit-exact.
    at_t = tf.one_hot(t, max_len, dtype=keys.dtype)[:, tf.newaxis]  # [L, 1]
    keys = keys * (1.0 - at_t) + new_keys * at_t
    values = values * (1.0 - at_t) + new_values * at_t
    hidden = tf.cast(tf.range(max_len) > t, x.dtype)
    bias = (hidden * _MASK_LOGIT)[tf.newaxis, tf.newaxis]  # [1, 1, L]
    h = self.self_atten.Attend(theta.self_atten, h, keys, values, bias)
    x += _Dropout(self, h, p.residual_dropout_prob, 'self_atten_residual')
    return self._AfterSelfAttention(theta, x, source), (keys, values)

  @classmethod
  def FPropMeta(cls, p, inputs):
    b, t = _Dim(inputs.tgt[0]), _Dim(inputs.tgt[1])
    atten = MultiHeadAttention.Params().Set(model_dim=p.model_dim)
    ffn = FeedForward.Params().Set(model_dim=p.model_dim,
                                   hidden_dim=p.hidden_dim)
    flops = (MultiHeadAttention.Flops(atten, b, t, t) +
             FeedForward.Flops(ffn, b * t))
    if p.has_cross_attention:
      flops += MultiHeadAttention.Flops(atten, b, t, _Dim(inputs.src[1]))
    return py_utils.NestedMap(flops=flops, out_shapes=(inputs,))


class EmbeddingLayer(base_layer.BaseLayer):
  """Token embeddings (x sqrt(D)) plus sinusoidal positions, for src and tgt.

  Reads ``src_ids`` [B, S] and ``tgt_ids`` [B, T] (int32) and replaces them by
  ``src`` [B, S, D] and ``tgt`` [B, T, D]; other fields pass through.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 64000, 'Vocabulary size.')
    p.Define('model_dim', 1024, 'Embedding (model) dimension.')
    p.Define('has_source', True,
             'Embed a source (encoder-decoder); False: a decoder-only stack.')
    p.Define('shared_embedding', True,
             'One table for source and target tokens (a shared multilingual '
             'vocabulary); False: separate source and target tables.')
    p.Define('dropout_prob', 0.0, 'Dropout on the embedded inputs.')
    return p

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    init = py_utils.WeightInit.Gaussian(p.model_dim**-0.5)
    names = ['emb'] if (p.shared_embedding or not p.has_source) else [
        'src_emb', 'tgt_emb'
    ]
    for name in names:
      self.CreateVariable(
          name, py_utils.WeightParams([p.vocab_size, p.model_dim], init,
                                      p.dtype))

  def _Embed(self, table, ids, tag):
    p = self.params
    length = py_utils.GetShape(ids, 2)[1]
    x = tf.nn.embedding_lookup(table, ids) * (p.model_dim**0.5)
    x += SinusoidalPositions(length, p.model_dim)[tf.newaxis]
    return _Dropout(self, x, p.dropout_prob, tag)

  def FProp(self, theta, inputs):
    """Embeds ``inputs.src_ids`` / ``inputs.tgt_ids``; returns a NestedMap."""
    p = self.params
    out = inputs.copy()
    shared = p.shared_embedding or not p.has_source
    if p.has_source:
      out.src = self._Embed(theta.emb if shared else theta.src_emb,
                            out.pop('src_ids'), 'src')
    out.tgt = self._Embed(theta.emb if shared else theta.tgt_emb,
                          out.pop('tgt_ids'), 'tgt')
    return out

  def EmbedTargetStep(self, theta, ids, t, max_len):
    """[B] target ids at position `t` -> [B, 1, D], as FProp embeds them.

    Args:
      theta: the layer's variables.
      ids: [B] int32 token ids.
      t: a scalar int32 tensor, their position.
      max_len: a Python int >= t + 1 (the position table's length).
    """
    p = self.params
    shared = p.shared_embedding or not p.has_source
    table = theta.emb if shared else theta.tgt_emb
    x = tf.nn.embedding_lookup(table, ids[:, tf.newaxis]) * (p.model_dim**0.5)
    x += tf.gather(SinusoidalPositions(max_len, p.model_dim), t)[tf.newaxis,
                                                                 tf.newaxis]
    return _Dropout(self, x, p.dropout_prob, 'tgt')

  @classmethod
  def FPropMeta(cls, p, inputs):
    out = inputs.copy()
    flops = 0
    for name in (['src', 'tgt'] if p.has_source else ['tgt']):
      shape = out.pop(name + '_ids')
      out[name] = _Shape3(shape, p.model_dim)
      flops += 2 * _Dim(shape[0]) * _Dim(shape[1]) * p.model_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(out,))


class SoftmaxLayer(base_layer.BaseLayer):
  """Final layer norm, projection to the vocabulary and the loss.

  `FProp` returns per-example sums (so the pipeline can concatenate
  micro-batches): ``xent`` (label-smoothed cross entropy), ``nll`` (plain
  negative log-likelihood), ``correct`` (argmax hits) and ``weight`` (number
  of target tokens), each of shape [B]. `Logits` gives the logits for decoding.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 64000, 'Vocabulary size.')
    p.Define('model_dim', 1024, 'Input dimension.')
    p.Define('label_smoothing', 0.1,
             'Probability mass spread uniformly over the vocabulary.')
    p.Define('logits_abs_max', 0.0,
             'If > 0, clip logits to [-logits_abs_max, logits_abs_max] (the '
             'paper\'s trainability fix for deep models).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('final_ln', LayerNorm.Params().Set(dim=p.model_dim))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable(
        'weight', py_utils.WeightParams([p.model_dim, p.vocab_size],
                                        py_utils.WeightInit.Xavier(1.0),
                                        p.dtype))
    self.CreateVariable(
        'bias', py_utils.WeightParams([p.vocab_size],
                                      py_utils.WeightInit.Constant(0.0),
                                      p.dtype))

  def Logits(self, theta, inputs):
    """[B, T, V] logits of ``inputs.tgt``, clipped if logits_abs_max > 0."""
    p = self.params
    x = self.final_ln.FProp(theta.final_ln, inputs.tgt)
    logits = _Dense(x, theta.weight, theta.bias)
    if p.logits_abs_max > 0:
      logits = tf.clip_by_value(logits, -p.logits_abs_max, p.logits_abs_max)
    return logits

  def FProp(self, theta, inputs):
    """Per-example loss sums; see the class docstring."""
    p = self.params
    logits = self.Logits(theta, inputs)
    log_probs = tf.nn.log_softmax(logits)
    one_hot = tf.one_hot(inputs.tgt_labels, p.vocab_size, dtype=logits.dtype)
    nll = -tf.reduce_sum(one_hot * log_probs, axis=-1)
    smooth = -tf.reduce_mean(log_probs, axis=-1)
    xent = (1.0 - p.label_smoothing) * nll + p.label_smoothing * smooth
    weights = inputs.tgt_weights
    correct = tf.cast(
        tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                 inputs.tgt_labels), logits.dtype)
    return py_utils.NestedMap(
        xent=tf.reduce_sum(xent * weights, axis=1),
        nll=tf.reduce_sum(nll * weights, axis=1),
        correct=tf.reduce_sum(correct * weights, axis=1),
        weight=tf.reduce_sum(weights, axis=1))

  @classmethod
  def FPropMeta(cls, p, inputs):
    b, t = _Dim(inputs.tgt[0]), _Dim(inputs.tgt[1])
    flops = 2 * b * t * p.model_dim * p.vocab_size + 8 * b * t * p.vocab_size
    per_example = tshape.Shape([inputs.tgt[0]])
    return py_utils.NestedMap(
        flops=flops,
        out_shapes=(py_utils.NestedMap(
            xent=per_example, nll=per_example, correct=per_example,
            weight=per_example),))
