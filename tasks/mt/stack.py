"""Flat layer lists for T(L, H, A) and Transformer-L, and their parameter counts.

`EncoderDecoderLayers` builds the paper's multilingual model T(L, H, A): L
encoder and L decoder layers with feed-forward size H and A heads.
`DecoderOnlyLayers` builds Table 1's Transformer-L language model (separate
input embedding and softmax weights). Both return the flat list of layer
params a `gpipe.pipeline.PipeliningLayer` cuts into stages.

`CountByPart` counts parameters per part (embeddings, attention, feed-forward,
layer norm, softmax) from the built graph of each layer, without allocating
weights, via `gpipe.measure.param_count`.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import partition
from gpipe.measure import param_count
from tasks.mt import blocks


def EncoderDecoderLayers(vocab_size,
                         model_dim,
                         hidden_dim,
                         num_heads,
                         num_layers,
                         dropout_prob=0.1,
                         label_smoothing=0.1,
                         logits_abs_max=0.0,
                         scale_ffn_init_by_num_layers=False,
                         shared_embedding=True):
  """The flat layer list of an encoder-decoder Transformer T(L, H, A).

  Args:
    vocab_size: vocabulary size (shared by source and target).
    model_dim: model dimension D.
    hidden_dim: feed-forward dimension H.
    num_heads: attention heads A.
    num_layers: L, the number of encoder layers (and of decoder layers).
    dropout_prob: residual, attention, ReLU and embedding dropout.
    label_smoothing: label smoothing of the loss.
    logits_abs_max: if > 0, clip the logits to this magnitude.
    scale_ffn_init_by_num_layers: divide the feed-forward init scale by L.
    shared_embedding: one embedding table for source and target.

  Returns:
    A list of 2L + 2 layer params: embedding, L encoder layers, L decoder
    layers, softmax.
  """
  block = dict(
      model_dim=model_dim, hidden_dim=hidden_dim, num_heads=num_heads,
      residual_dropout_prob=dropout_prob, atten_dropout_prob=dropout_prob,
      relu_dropout_prob=dropout_prob,
      ffn_init_scale=(1.0 / num_layers
                      if scale_ffn_init_by_num_layers else 1.0))
  result = [
      blocks.EmbeddingLayer.Params().Set(
          name='emb', vocab_size=vocab_size, model_dim=model_dim,
          shared_embedding=shared_embedding, dropout_prob=dropout_prob)
  ]
  for i in range(num_layers):
    result.append(blocks.EncoderLayer.Params().Set(
        name='enc_%03d' % i, final_layer_norm=(i == num_layers - 1), **block))
  for i in range(num_layers):
    result.append(blocks.DecoderLayer.Params().Set(
        name='dec_%03d' % i, **block))
  result.append(blocks.SoftmaxLayer.Params().Set(
      name='softmax', vocab_size=vocab_size, model_dim=model_dim,
      label_smoothing=label_smoothing, logits_abs_max=logits_abs_max))
  return result


def DecoderOnlyLayers(vocab_size,
                      model_dim,
                      hidden_dim,
                      num_heads,
                      num_layers,
                      dropout_prob=0.0,
                      label_smoothing=0.0,
                      logits_abs_max=0.0,
                      scale_ffn_init_by_num_layers=False):
  """The flat layer list of Table 1's Transformer-L language model.

  Args:
    vocab_size: vocabulary size.
    model_dim: model dimension.
    hidden_dim: feed-forward dimension.
    num_heads: attention heads.
    num_layers: L, the number of (self-attention + feed-forward) layers.
    dropout_prob: residual, attention, ReLU and embedding dropout.
    label_smoothing: label smoothing of the loss.
    logits_abs_max: if > 0, clip the logits to this magnitude.
    scale_ffn_init_by_num_layers: divide the feed-forward init scale by L.

  Returns:
    A list of L + 2 layer params: embedding, L layers, softmax.
  """
  result = [
      blocks.EmbeddingLayer.Params().Set(
          name='emb', vocab_size=vocab_size, model_dim=model_dim,
          has_source=False, dropout_prob=dropout_prob)
  ]
  for i in range(num_layers):
    result.append(blocks.DecoderLayer.Params().Set(
        name='layer_%04d' % i, model_dim=model_dim, hidden_dim=hidden_dim,
        num_heads=num_heads, has_cross_attention=False,
        residual_dropout_prob=dropout_prob, atten_dropout_prob=dropout_prob,
        relu_dropout_prob=dropout_prob,
        ffn_init_scale=(1.0 / num_layers
                        if scale_ffn_init_by_num_layers else 1.0)))
  result.append(blocks.SoftmaxLayer.Params().Set(
      name='softmax', vocab_size=vocab_size, model_dim=model_dim,
      label_smoothing=label_smoothing, logits_abs_max=logits_abs_max))
  return result


def _Part(layer_params, variable_name):
  """Which part of the model a variable of a layer belongs to."""
  if '_ln/' in variable_name:
    return 'layer_norm'
  if layer_params.cls is blocks.SoftmaxLayer:
    return 'softmax'
  if layer_params.cls is blocks.EmbeddingLayer:
    return 'embedding'
  if 'atten/' in variable_name:
    return 'attention'
  if 'ffn/' in variable_name:
    return 'feed_forward'
  return 'other'


def _Canonical(p):
  """`p` under a fixed name, so identical layers share one count-cache entry."""
  return p.Copy().Set(name='layer')


def CountByPart(layer_params):
  """Trainable parameters per part, summed over a flat layer list.

  Args:
    layer_params: a list of layer params (e.g. from `EncoderDecoderLayers`).

  Returns:
    An OrderedDict {part: count} with parts 'embedding', 'attention',
    'feed_forward', 'layer_norm', 'softmax' (and 'other' if any) plus
    'total'. Identical layers (up to their name) are built once.
  """
  parts = collections.OrderedDict(
      (k, 0) for k in ('embedding', 'attention', 'feed_forward', 'layer_norm',
                       'softmax'))
  for p in layer_params:
    shapes = param_count.VariableShapes(_Canonical(p))
    for name, (shape, trainable) in shapes.items():
      if not trainable:
        continue
      size = 1
      for d in shape:
        size *= d
      part = _Part(p, name)
      parts[part] = parts.get(part, 0) + size
  parts['total'] = sum(parts.values())
  return parts


def CountParams(layer_params):
  """Total trainable parameters of a flat layer list."""
  return sum(param_count.CountParams(_Canonical(p)) for p in layer_params)


def DecodeStepCosts(layer_params):
  """Per-layer work of one decoding step (weights read per token).

  A step of (greedy or beam) decoding reads every weight of each decoder
  layer once per token, but the cross-attention key and value projections
  (applied to the source once, before the loop), and every weight of the
  softmax; the embedding looks up one row per token and the encoder does not
  run. On a CPU the step's time follows those weights (their matmuls and
  oneDNN's per-call weight re-packing), so they are the cost.

  Args:
    layer_params: a flat layer list (e.g. from `EncoderDecoderLayers`).

  Returns:
    A list of per-layer costs (weights), 0 for the embedding and encoders.
  """
  costs = []
  for p in layer_params:
    if p.cls is blocks.DecoderLayer:
      cross = (2 * (p.model_dim * p.model_dim + p.model_dim)
               if p.has_cross_attention else 0)
      costs.append(float(CountParams([p]) - cross))
    elif p.cls is blocks.SoftmaxLayer:
      costs.append(float(CountParams([p])))
    else:
      costs.append(0.0)
  return costs


def DecodeStageSizes(layer_params, num_stages):
  """Stage sizes balancing the decoding steps (`DecodeStepCosts`).

  K consecutive stages: the encoder layers go with the first decoder
  layers, so the first device runs the whole encoder alone.
  ``decode_cut.DecodeCut`` cuts 2K stages on K devices instead, spreading
  the encoder too, and balances the decoder by measured step times.

  Args:
    layer_params: a flat layer list.
    num_stages: K.

  Returns:
    K layer counts.
  """
  return partition.PartitionByCost(DecodeStepCosts(layer_params), num_stages)
