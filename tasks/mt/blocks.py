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
  * ``tgt_labels`` [B, T] int next-token labels (int64 from the task: see
    `NetworkInput`) and ``tgt_weights`` [B, T],
    carried untouched to the softmax layer, which returns per-example loss
    sums (see `SoftmaxLayer.FProp`).

The embedding layer reads ``src_ids`` / ``tgt_ids`` in place of ``src`` /
``tgt``. Encoder and decoder layers are pre-layer-norm residual blocks sharing
one base, `_TransformerBlock`; the last encoder layer applies the encoder's
final layer norm (``final_layer_norm=True``), the softmax layer the decoder's.
The pieces inside the layers (attention, feed-forward, layer norm, masks,
dropout) are in `sublayers.py`.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import tshape
from tasks.mt import sublayers


def _Dim(d):
  """An int from a tshape dimension; 1 if it is symbolic (unknown)."""
  try:
    return int(d)
  except TypeError:
    return 1


def _Shape3(shape2, dim):
  """[B, T] tshape -> [B, T, dim] tshape."""
  return tshape.Shape([shape2[0], shape2[1], dim])


class _TransformerBlock(base_layer.BaseLayer):
  """The base of `EncoderLayer` and `DecoderLayer`.

  A pre-layer-norm residual block: one or more attention sub-blocks, then a
  feed-forward sub-block, then optionally a final layer norm. This class
  defines the hyperparameters both layers share and creates their children:
  for each name in `_AttentionNames`, a `LayerNorm` ``<name>_ln`` and a
  `MultiHeadAttention` ``<name>``; then ``ffn_ln`` and ``ffn``; then
  ``final_ln`` if ``final_layer_norm``. Child names are the variables' scopes
  in checkpoints, which is why subclasses name their attentions rather than
  this class.
  """

  @classmethod
  def Params(cls):
    """Dimensions, dropout and initialization shared by all blocks."""
    p = super().Params()
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
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    layer_norm = sublayers.LayerNorm.Params().Set(dim=p.model_dim)
    for name in self._AttentionNames():
      self.CreateChild(name + '_ln', layer_norm.Copy())
      self.CreateChild(
          name,
          sublayers.MultiHeadAttention.Params().Set(
              model_dim=p.model_dim, num_heads=p.num_heads,
              atten_dropout_prob=p.atten_dropout_prob))
    self.CreateChild('ffn_ln', layer_norm.Copy())
    self.CreateChild(
        'ffn',
        sublayers.FeedForward.Params().Set(
            model_dim=p.model_dim, hidden_dim=p.hidden_dim,
            relu_dropout_prob=p.relu_dropout_prob,
            params_init=py_utils.WeightInit.Xavier(p.ffn_init_scale)))
    if p.final_layer_norm:
      self.CreateChild('final_ln', layer_norm.Copy())

  def _AttentionNames(self):
    """Names of the attention children, in the order they run.

    Called from `__init__`, once the params are set.
    """
    raise NotImplementedError('%s must name its attentions' %
                              type(self).__name__)

  def _Residual(self, x, h, name):
    """`x` plus the output `h` of sub-block `name`, after residual dropout."""
    return x + sublayers.Dropout(self, h, self.params.residual_dropout_prob,
                                 name + '_residual')

  def _FeedForwardAndFinalNorm(self, theta, x):
    """The feed-forward sub-block on `x` [B, T, D], then the final norm."""
    h = self.ffn.FProp(theta.ffn, self.ffn_ln.FProp(theta.ffn_ln, x))
    x = self._Residual(x, h, 'ffn')
    if self.params.final_layer_norm:
      x = self.final_ln.FProp(theta.final_ln, x)
    return x

  @classmethod
  def _Flops(cls, p, batch, length, source_length=None):
    """Multiply-adds x2 of one FProp over [batch, length] positions.

    Args:
      p: the block's params.
      batch: the batch size B.
      length: the positions the block updates.
      source_length: with cross-attention, the positions it attends to.

    Returns:
      A Python int: self-attention, feed-forward and any cross-attention.
    """
    atten = sublayers.MultiHeadAttention.Params().Set(model_dim=p.model_dim)
    ffn = sublayers.FeedForward.Params().Set(model_dim=p.model_dim,
                                             hidden_dim=p.hidden_dim)
    flops = (sublayers.MultiHeadAttention.Flops(atten, batch, length, length) +
             sublayers.FeedForward.Flops(ffn, batch * length))
    if source_length is not None:
      flops += sublayers.MultiHeadAttention.Flops(atten, batch, length,
                                                  source_length)
    return flops


class EncoderLayer(_TransformerBlock):
  """Self-attention + feed-forward over ``src``; the rest passes through."""

  def _AttentionNames(self):
    return ['atten']

  def FProp(self, theta, inputs):
    """Updates ``inputs.src``.

    Args:
      theta: the layer's variables.
      inputs: the pipeline's NestedMap, with ``src`` [B, S, D] and
        ``src_paddings`` [B, S].

    Returns:
      A new NestedMap like `inputs`, with ``src`` updated.
    """
    out = inputs.copy()
    x = inputs.src
    h = self.atten_ln.FProp(theta.atten_ln, x)
    h = self.atten.FProp(theta.atten, h, h,
                         sublayers.PaddingBias(inputs.src_paddings))
    x = self._Residual(x, h, 'atten')
    out.src = self._FeedForwardAndFinalNorm(theta, x)
    return out

  @classmethod
  def FPropMeta(cls, p, inputs):
    """FLOPs and output shapes of FProp on tshape `inputs`."""
    b, s = _Dim(inputs.src[0]), _Dim(inputs.src[1])
    return py_utils.NestedMap(flops=cls._Flops(p, b, s), out_shapes=(inputs,))


class DecoderLayer(_TransformerBlock):
  """Causal self-attention, cross-attention to ``src`` and feed-forward.

  Updates ``tgt``; a decoder-only stack sets ``has_cross_attention=False``.
  """

  @classmethod
  def Params(cls):
    """The block's params plus ``has_cross_attention``."""
    p = super().Params()
    p.Define('has_cross_attention', True,
             'Attend to the encoder output ``src`` (False: a language model '
             'layer).')
    return p

  def _AttentionNames(self):
    if self.params.has_cross_attention:
      return ['self_atten', 'cross_atten']
    return ['self_atten']

  def FProp(self, theta, inputs):
    """Updates ``inputs.tgt``.

    Args:
      theta: the layer's variables.
      inputs: the pipeline's NestedMap, with ``tgt`` [B, T, D] and, with
        cross-attention, ``src`` [B, S, D] and ``src_paddings`` [B, S].

    Returns:
      A new NestedMap like `inputs`, with ``tgt`` updated.
    """
    p = self.params
    out = inputs.copy()
    x = inputs.tgt
    length = py_utils.GetShape(x, 3)[1]
    # Padded target positions come after the real ones, so the causal mask
    # alone keeps real positions from seeing them.
    h = self.self_atten_ln.FProp(theta.self_atten_ln, x)
    h = self.self_atten.FProp(theta.self_atten, h, h,
                              sublayers.CausalBias(length))
    x = self._Residual(x, h, 'self_atten')
    source = (self.InitSource(theta, inputs.src, inputs.src_paddings)
              if p.has_cross_attention else None)
    out.tgt = self._AfterSelfAttention(theta, x, source)
    return out

  def _CrossAttention(self, theta, x, source):
    """The cross-attention sub-block on `x`, attending to `source`."""
    h = self.cross_atten_ln.FProp(theta.cross_atten_ln, x)
    h = self.cross_atten.Attend(theta.cross_atten, h, source.key,
                                source.value, source.bias)
    return self._Residual(x, h, 'cross_atten')

  def _AfterSelfAttention(self, theta, x, source):
    """Cross-attention to `source` (if any), feed-forward, final norm."""
    if self.params.has_cross_attention:
      x = self._CrossAttention(theta, x, source)
    return self._FeedForwardAndFinalNorm(theta, x)

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

    Raises:
      ValueError: if the layer has cross-attention but `src` or
        `src_paddings` is missing.
    """
    if not self.params.has_cross_attention:
      return self.InitCache(batch, max_len), None
    if src is None or src_paddings is None:
      raise ValueError('%s: decoding with cross-attention needs the encoder '
                       'output src and src_paddings' % self.params.name)
    return (self.InitCache(batch, max_len),
            self.InitSource(theta, src, src_paddings))

  def InitCache(self, batch, max_len):
    """The empty self-attention cache: `InitDecodeState`'s `cache` only."""
    p = self.params
    shape = [batch, p.num_heads, max_len, p.model_dim // p.num_heads]
    dtype = py_utils.FPropDtype(p)  # what KeysAndValues computes in
    return (tf.zeros(shape, dtype), tf.zeros(shape, dtype))

  def InitSource(self, theta, src, src_paddings):
    """The cross-attention's keys and values: `InitDecodeState`'s `source`.

    Args:
      theta: the layer's variables (or those of its 'cross_atten' part).
      src: [B, S, D] encoder output.
      src_paddings: [B, S] its paddings.

    Returns:
      A NestedMap of the keys and values [B, N, S, D/N] and the padding bias.
    """
    source = py_utils.NestedMap(bias=sublayers.PaddingBias(src_paddings))
    source.key, source.value = self.cross_atten.KeysAndValues(
        theta.cross_atten, src)
    return source

  def ExtendStep(self, theta, x, t, cache, source):
    """FProp of one target position `t`, attending to positions <= t.

    The step's parts (``StepParts``) one after another.

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
    for part in self.StepParts():
      x, cache = self.ExtendStepPart(theta, part, x, t, cache, source)
    return x, cache

  # A decoding step in parts. A pipelined decoder may run a layer's first
  # parts on one device and the rest on the next, to balance the devices
  # more finely than whole layers (``decode_cut.DecodeCut``); the parts run
  # the very ops `ExtendStep` runs, so the outputs are the same.

  @classmethod
  def StepPartsOf(cls, p):
    """The parts of a decoding step of a layer of params `p`, in order.

    Args:
      p: DecoderLayer params.

    Returns:
      ['self_atten', 'cross_atten', 'ffn'] ('cross_atten' only with
      cross-attention). Only 'self_atten' reads and extends the cache, only
      'cross_atten' reads the source; 'ffn' includes the final norm.
    """
    parts = ['self_atten', 'ffn']
    if p.has_cross_attention:
      parts.insert(1, 'cross_atten')
    return parts

  def StepParts(self):
    """This layer's ``StepPartsOf``."""
    return self.StepPartsOf(self.params)

  def _PartChildren(self, part):
    """The names of the children that step part `part` reads."""
    if part not in self.StepParts():
      raise ValueError('%s: no step part %r; the parts are %s' %
                       (self.params.name, part, self.StepParts()))
    if part == 'ffn':
      return ['ffn_ln', 'ffn'] + (['final_ln'] if self.params.final_layer_norm
                                  else [])
    return [part + '_ln', part]

  def PartTheta(self, theta, parts):
    """The variables of step parts `parts` only (a NestedMap of `theta`).

    A device that runs some parts of the layer reads only their weights.
    """
    return py_utils.NestedMap(
        {name: theta[name] for part in parts
         for name in self._PartChildren(part)})

  def ExtendStepPart(self, theta, part, x, t, cache, source):
    """One part of `ExtendStep` (see ``StepParts``).

    Args:
      theta: the layer's variables (or those of the part: ``PartTheta``).
      part: a name from ``StepParts``.
      x: [B, 1, D] the part's input at position t.
      t: a scalar int32 tensor, the position.
      cache: as `ExtendStep`'s, read and returned extended by 'self_atten'
        only (others return it as given: it may be anything there).
      source: as `ExtendStep`'s, read by 'cross_atten' only.

    Returns:
      ([B, 1, D] the part's output, the cache).
    """
    self._PartChildren(part)  # Checks the name.
    if part == 'ffn':
      return self._FeedForwardAndFinalNorm(theta, x), cache
    if part == 'cross_atten':
      return self._CrossAttention(theta, x, source), cache
    keys, values = cache
    max_len = py_utils.GetShape(keys, 4)[2]
    h = self.self_atten_ln.FProp(theta.self_atten_ln, x)
    new_keys, new_values = self.self_atten.KeysAndValues(theta.self_atten, h)
    # Write position t: x * 1 + y * 0 leaves the other positions bit-exact.
    at_t = sublayers.OneHotAt(t, max_len, keys.dtype)[:, tf.newaxis]  # [L, 1]
    keys = keys * (1.0 - at_t) + new_keys * at_t
    values = values * (1.0 - at_t) + new_values * at_t
    h = self.self_atten.Attend(theta.self_atten, h, keys, values,
                               sublayers.CausalBiasAt(t, max_len))
    return self._Residual(x, h, 'self_atten'), (keys, values)

  @classmethod
  def FPropMeta(cls, p, inputs):
    """FLOPs and output shapes of FProp on tshape `inputs`."""
    b, t = _Dim(inputs.tgt[0]), _Dim(inputs.tgt[1])
    source_length = (_Dim(inputs.src[1]) if p.has_cross_attention else None)
    return py_utils.NestedMap(
        flops=cls._Flops(p, b, t, source_length), out_shapes=(inputs,))


def NetworkInput(tensor):
  """A field of the network's input as its stages take it: int32 as int64.

  On a GPU, TensorFlow keeps int32 tensors that enter a function (a stage
  call) in host memory, so ids handed to the stages as int32 would be copied
  to the GPU by every stage call that reads them (the embedding lookup, the
  loss's one-hot labels; gpipe.measure.gpu_audit). As int64 they are split
  on the first stage's device and stay in device memory.

  Args:
    tensor: a field of the input batch.

  Returns:
    The tensor, int32 cast to int64.
  """
  return tf.cast(tensor, tf.int64) if tensor.dtype == tf.int32 else tensor


def EmbeddingLookup(table, ids):
  """tf.nn.embedding_lookup(table, ids), its gradient's shapes constants.

  TensorFlow's gradient of a gather reads the table's shape on the table's
  device, casts it to int32 there and slices it in host memory: on a GPU a
  device-to-host copy (a sync) in every backward call, and the int32 shape
  leaves the function from device memory (gpipe.measure.gpu_audit). With
  static shapes the same IndexedSlices come from Python constants.

  Args:
    table: [V, D] embeddings.
    ids: int ids of any shape.

  Returns:
    [..., D] embeddings of `ids`.
  """
  if not (table.shape.is_fully_defined() and ids.shape.is_fully_defined()):
    return tf.nn.embedding_lookup(table, ids)
  table_shape = table.shape.as_list()
  num_ids = ids.shape.num_elements()

  @tf.custom_gradient
  def Lookup(table):

    def Grad(d_embedded):
      return tf.IndexedSlices(
          tf.reshape(d_embedded, [num_ids] + table_shape[1:]),
          tf.reshape(ids, [num_ids]), tf.constant(table_shape, tf.int32))

    return tf.gather(table, ids), Grad

  return Lookup(table)


class EmbeddingLayer(base_layer.BaseLayer):
  """Token embeddings (x sqrt(D)) plus sinusoidal positions, for src and tgt.

  Reads ``src_ids`` [B, S] and ``tgt_ids`` [B, T] (int) and replaces them by
  ``src`` [B, S, D] and ``tgt`` [B, T, D]; other fields pass through.
  """

  @classmethod
  def Params(cls):
    """Vocabulary, dimension, source and table sharing, dropout."""
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
    """[B, L] ids -> [B, L, D] scaled embeddings plus positions, dropped."""
    p = self.params
    length = py_utils.GetShape(ids, 2)[1]
    x = EmbeddingLookup(table, ids) * (p.model_dim**0.5)
    x += tf.cast(sublayers.SinusoidalPositions(length, p.model_dim),
                 x.dtype)[tf.newaxis]
    return sublayers.Dropout(self, x, p.dropout_prob, tag)

  def FProp(self, theta, inputs):
    """Embeds ``inputs.src_ids`` / ``inputs.tgt_ids``.

    Args:
      theta: the layer's variables.
      inputs: the pipeline's NestedMap, with ``tgt_ids`` and (with a source)
        ``src_ids``.

    Returns:
      A new NestedMap with ``src`` / ``tgt`` in place of the ids.
    """
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

    Returns:
      A [B, 1, D] tensor.
    """
    p = self.params
    shared = p.shared_embedding or not p.has_source
    table = theta.emb if shared else theta.tgt_emb
    x = tf.nn.embedding_lookup(table, ids[:, tf.newaxis]) * (p.model_dim**0.5)
    positions = tf.cast(sublayers.SinusoidalPositions(max_len, p.model_dim),
                        x.dtype)
    x += sublayers.RowAt(positions, t)[tf.newaxis]
    return sublayers.Dropout(self, x, p.dropout_prob, 'tgt')

  @classmethod
  def FPropMeta(cls, p, inputs):
    """FLOPs and output shapes of FProp on tshape `inputs`."""
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
    """Vocabulary, dimension, label smoothing and logit clipping."""
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
    self.CreateChild('final_ln',
                     sublayers.LayerNorm.Params().Set(dim=p.model_dim))

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
    """Logits of ``inputs.tgt``.

    Args:
      theta: the layer's variables.
      inputs: a NestedMap with ``tgt`` [B, T, D].

    Returns:
      [B, T, V] logits, clipped if ``logits_abs_max`` > 0.
    """
    p = self.params
    x = self.final_ln.FProp(theta.final_ln, inputs.tgt)
    logits = sublayers.Dense(x, theta.weight, theta.bias)
    if p.logits_abs_max > 0:
      logits = tf.clip_by_value(logits, -p.logits_abs_max, p.logits_abs_max)
    return logits

  def FProp(self, theta, inputs):
    """Per-example loss sums; see the class docstring.

    Args:
      theta: the layer's variables.
      inputs: the pipeline's NestedMap, with ``tgt``, ``tgt_labels`` and
        ``tgt_weights``.

    Returns:
      A NestedMap of [B] tensors ``xent``, ``nll``, ``correct``, ``weight``.
    """
    p = self.params
    # The loss in float32, also when the layers compute in bfloat16.
    logits = tf.cast(self.Logits(theta, inputs), tf.float32)
    log_probs = tf.nn.log_softmax(logits)
    one_hot = tf.one_hot(inputs.tgt_labels, p.vocab_size, dtype=logits.dtype)
    nll = -tf.reduce_sum(one_hot * log_probs, axis=-1)
    smooth = -tf.reduce_mean(log_probs, axis=-1)
    xent = (1.0 - p.label_smoothing) * nll + p.label_smoothing * smooth
    weights = tf.cast(inputs.tgt_weights, logits.dtype)
    # The argmax in the labels' dtype: int64 stays in device memory on a
    # GPU, where an int32 argmax would be compared in host memory.
    correct = tf.cast(
        tf.equal(tf.argmax(logits, axis=-1,
                           output_type=inputs.tgt_labels.dtype),
                 inputs.tgt_labels), logits.dtype)
    return py_utils.NestedMap(
        xent=tf.reduce_sum(xent * weights, axis=1),
        nll=tf.reduce_sum(nll * weights, axis=1),
        correct=tf.reduce_sum(correct * weights, axis=1),
        weight=tf.reduce_sum(weights, axis=1))

  @classmethod
  def FPropMeta(cls, p, inputs):
    """FLOPs and output shapes of FProp on tshape `inputs`."""
    b, t = _Dim(inputs.tgt[0]), _Dim(inputs.tgt[1])
    flops = 2 * b * t * p.model_dim * p.vocab_size + 8 * b * t * p.vocab_size
    per_example = tshape.Shape([inputs.tgt[0]])
    return py_utils.NestedMap(
        flops=flops,
        out_shapes=(py_utils.NestedMap(
            xent=per_example, nll=per_example, correct=per_example,
            weight=per_example),))
