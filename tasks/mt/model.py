"""The multilingual translation task: pipelined training, decoding and BLEU.

Training runs the flat layer list (`stack.EncoderDecoderLayers`) through a
`gpipe.pipeline.PipeliningLayer` child ``network``; its last layer returns
per-example loss sums, which `ComputeLoss` turns into Lingvo metrics.

Decoding (greedy or beam search) runs the same layers in a `tf.while_loop`:
the encoder once, then one position per step. Each decoder layer keeps the
self-attention keys and values of the positions decoded so far in a cache
(reordered with the beams) and the source's cross-attention keys and values
from the start, so a step costs one position, not the whole prefix
(`StepLogits`; `DecoderLogits` is the full-prefix computation it equals).
`Decode` runs it pipelined by default: the layers on the stages and devices
they trained on, the batch in lanes (`pipelined_decode`, p.pipelined_decode,
p.decode_micro_batches); `GreedyDecode` and `BeamSearchDecode` are the
unpipelined decoder. Both pick tokens with `search`, and give the same ones.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import partition
from lingvo import compat as tf
from lingvo.core import base_model
from lingvo.core import metrics
from lingvo.core import py_utils
from tasks.mt import bleu
from tasks.mt import blocks
from tasks.mt import pipelined_decode
from tasks.mt import search
from tasks.mt import vocab as vocab_lib

# Fields of an input batch that enter the network.
NETWORK_FIELDS = ('src_ids', 'src_paddings', 'tgt_ids', 'tgt_paddings',
                  'tgt_labels', 'tgt_weights')


class TransformerMTTask(base_model.BaseTask):
  """An encoder-decoder Transformer trained through a GPipe pipeline."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('network', None,
             'gpipe.pipeline.PipeliningLayer params whose `layers` is the flat '
             'list of stack.EncoderDecoderLayers.')
    p.Define('pipelined', True,
             'Train through the pipeline; False runs the network\'s '
             'FPropUnpipelined (the single-device reference).')
    p.Define('vocab_path', vocab_lib.NUMBERS_VOCAB,
             'sentencepiece model that turns decoded ids into text.')
    p.Define('max_decode_len', 16, 'Output tokens decoded (incl. </s>).')
    p.Define('beam_size', 4, 'Beam width of Decode; 1 decodes greedily.')
    p.Define('length_alpha', 0.6,
             'Length normalization ((5 + len) / 6)^alpha of beam scores.')
    p.Define(
        'pipelined_decode', True,
        'Decode through the network\'s pipeline stages, on their devices, '
        'the batch in decode_micro_batches lanes (tasks/mt/'
        'pipelined_decode.py; the same tokens). False: the unpipelined '
        'decoder (GreedyDecode / BeamSearchDecode), for comparison.')
    p.Define(
        'decode_micro_batches', None,
        'M, the lanes of pipelined decoding; must divide the batch (a lane '
        'holds whole examples with their beams). None: K for the K stages of '
        'the decoding loop (at most one lane per example), 1 for K = 1 '
        '(gpipe.schedules.decode_lanes.DefaultNumLanes).')
    p.Define(
        'decode_lead_parts', None,
        'Per pipeline stage, the leading step parts of its first decoder '
        'layer that pipelined decoding runs on the previous stage\'s device '
        '(tasks/mt/decode_cut.py: a network cut by DecodeCut takes the '
        'Cut\'s lead_parts here); None: whole layers.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.network is None or not p.network.layers:
      raise ValueError('%s: set p.network to PipeliningLayer params with '
                       '`layers` = stack.EncoderDecoderLayers(...)' % p.name)
    self.CreateChild('network', p.network)

  # --- Training -------------------------------------------------------------

  def ComputePredictions(self, theta, input_batch):
    """Per-example loss sums from the last layer (see SoftmaxLayer.FProp)."""
    # A decoder-only stack (Transformer-L) has no source to carry.
    fields = (NETWORK_FIELDS if self.params.network.layers[0].has_source else
              NETWORK_FIELDS[2:])
    inputs = py_utils.NestedMap({k: blocks.NetworkInput(input_batch[k])
                                 for k in fields})
    if self.params.pipelined:
      return self.network.FProp(theta.network, inputs)
    return self.network.FPropUnpipelined(theta.network, inputs)

  def ComputeLoss(self, theta, predictions, input_batch):
    """Token-averaged label-smoothed loss, log-perplexity and accuracy."""
    # The token count comes from the input, not from the pipeline's output:
    # so the gradient of micro-batch m's loss needs only micro-batch m's
    # forward, and every schedule (1F1B, zero bubble) can run it.
    weight = tf.reduce_sum(tf.cast(input_batch.tgt_weights,
                                   predictions.xent.dtype))
    safe = tf.maximum(weight, 1.0)
    metric = {
        'loss': (tf.reduce_sum(predictions.xent) / safe, weight),
        'log_pplx': (tf.reduce_sum(predictions.nll) / safe, weight),
        'accuracy': (tf.reduce_sum(predictions.correct) / safe, weight),
        'num_tokens': (weight, tf.constant(1.0)),
    }
    per_example = {'xent': predictions.xent, 'weight': predictions.weight}
    return metric, per_example

  # --- Decoding -------------------------------------------------------------

  def _Layers(self, theta):
    """(embedding, encoders, decoders, softmax) as (layer, theta) pairs."""
    net = self.network
    keys = [partition.LayerKey(i) for i in range(len(net.params.layers))]
    pairs = [(net.children[k], theta.network[k]) for k in keys]
    encoders = [x for x in pairs if isinstance(x[0], blocks.EncoderLayer)]
    decoders = [x for x in pairs if isinstance(x[0], blocks.DecoderLayer)]
    return pairs[0], encoders, decoders, pairs[-1]

  def Encode(self, theta, src_ids, src_paddings):
    """Encoder output NestedMap(src [B, S, D], src_paddings)."""
    (emb, emb_theta), encoders, _, _ = self._Layers(theta)
    batch = py_utils.GetShape(src_ids, 2)[0]
    x = py_utils.NestedMap(
        src_ids=src_ids, src_paddings=src_paddings,
        tgt_ids=tf.zeros([batch, 1], tf.int32),
        tgt_paddings=tf.zeros([batch, 1]))
    x = emb.FProp(emb_theta, x)
    for layer, layer_theta in encoders:
      x = layer.FProp(layer_theta, x)
    return py_utils.NestedMap(src=x.src, src_paddings=x.src_paddings)

  def DecoderLogits(self, theta, encoded, tgt_ids):
    """[B, T, V] next-token logits of target prefixes `tgt_ids` [B, T]."""
    (emb, emb_theta), _, decoders, (softmax, softmax_theta) = self._Layers(
        theta)
    batch, length = py_utils.GetShape(tgt_ids, 2)
    # The embedding layer also embeds a (dummy, length-1) source; the real
    # source states come from `encoded`.
    x = emb.FProp(emb_theta, py_utils.NestedMap(
        src_ids=tf.zeros([batch, 1], tf.int32),
        src_paddings=tf.zeros([batch, 1]), tgt_ids=tgt_ids,
        tgt_paddings=tf.zeros([batch, length])))
    x.src = encoded.src
    x.src_paddings = encoded.src_paddings
    for layer, layer_theta in decoders:
      x = layer.FProp(layer_theta, x)
    return tf.cast(softmax.Logits(softmax_theta, x), tf.float32)

  def InitDecodeState(self, theta, encoded, batch):
    """Per-decoder-layer state for `StepLogits`, before position 0.

    Args:
      theta: the task's theta.
      encoded: `Encode`'s output for `batch` rows.
      batch: rows decoded together.

    Returns:
      (caches, sources): the loop-carried per-layer key/value caches (a list
      of tuples) and the loop-invariant per-layer source keys and values.
    """
    _, _, decoders, _ = self._Layers(theta)
    states = [
        layer.InitDecodeState(layer_theta, batch, self.params.max_decode_len,
                              encoded.src, encoded.src_paddings)
        for layer, layer_theta in decoders
    ]
    return [c for c, _ in states], [s for _, s in states]

  def StepLogits(self, theta, prev_ids, t, caches, sources):
    """Next-token logits at position `t` from the cached decoder state.

    Equals `DecoderLogits(...)[:, t]` for the same prefix, at one position's
    cost instead of t + 1 positions'.

    Args:
      theta: the task's theta.
      prev_ids: [B] int ids, the token at position t - 1 (<s> at t = 0).
      t: a scalar int32 tensor.
      caches: from `InitDecodeState` or the previous `StepLogits`.
      sources: from `InitDecodeState`.

    Returns:
      ([B, V] logits, the caches with position t added).
    """
    (emb, emb_theta), _, decoders, (softmax, softmax_theta) = self._Layers(
        theta)
    x = emb.EmbedTargetStep(emb_theta, prev_ids, t, self.params.max_decode_len)
    new_caches = []
    for (layer, layer_theta), cache, source in zip(decoders, caches, sources):
      x, cache = layer.ExtendStep(layer_theta, x, t, cache, source)
      new_caches.append(cache)
    return search.StepOutputLogits(softmax, softmax_theta, x), new_caches

  @staticmethod
  def _PreviousTokens(outputs, t):
    """The tokens at position t - 1 of `outputs` [..., T]; <s> at t = 0."""
    prev = tf.gather(outputs, tf.maximum(t - 1, 0), axis=-1)
    return tf.where(t > 0, prev, tf.fill(tf.shape(prev),
                                         tf.constant(vocab_lib.BOS_ID,
                                                     prev.dtype)))

  def GreedyDecode(self, theta, src_ids, src_paddings):
    """Greedy decoding.

    Args:
      theta: the task's theta.
      src_ids: [B, S] int32 source ids (with the target-language tag).
      src_paddings: [B, S] source paddings.

    Returns:
      (ids [B, T] int32, log-probability [B] of the decoded sequence up to and
      including </s>).
    """
    length = self.params.max_decode_len
    encoded = self.Encode(theta, src_ids, src_paddings)
    batch = py_utils.GetShape(src_ids, 2)[0]

    caches, sources = self.InitDecodeState(theta, encoded, batch)

    def _Step(t, result, caches):
      logits, caches = self.StepLogits(
          theta, self._PreviousTokens(result.outputs, t), t, caches, sources)
      result, _ = search.GreedyPick(logits, t, result)
      return t + 1, result, caches

    _, result, _ = tf.while_loop(
        lambda t, *_: t < length, _Step,
        (tf.constant(0), search.GreedyStart(batch, length), caches))
    return tf.cast(result.outputs, tf.int32), result.score

  def BeamSearchDecode(self, theta, src_ids, src_paddings, beam_size=None):
    """Beam search with length normalization of the final scores.

    Args:
      theta: the task's theta.
      src_ids: [B, S] int32 source ids.
      src_paddings: [B, S] source paddings.
      beam_size: beams per example (default p.beam_size).

    Returns:
      (ids [B, T] of the best hypothesis, its log-probability [B],
       all hypotheses [B, K, T], their log-probabilities [B, K]).
    """
    p = self.params
    k = beam_size or p.beam_size
    length = p.max_decode_len
    batch = py_utils.GetShape(src_ids, 2)[0]
    encoded = self.Encode(theta, src_ids, src_paddings)
    # Beam b of example i is row i * k + b.
    encoded = encoded.Transform(lambda x: tf.repeat(x, k, axis=0))
    caches, sources = self.InitDecodeState(theta, encoded, batch * k)

    def _Step(t, result, caches):
      prev = tf.reshape(self._PreviousTokens(result.outputs, t), [batch * k])
      logits, caches = self.StepLogits(theta, prev, t, caches, sources)
      result, beam = search.BeamPick(logits, t, result)
      caches = tf.nest.map_structure(
          lambda x: search.ReorderBeams(x, beam), caches)
      return t + 1, result, caches

    _, result, _ = tf.while_loop(
        lambda t, *_: t < length, _Step,
        (tf.constant(0), search.BeamStart(batch, k, length), caches))
    ids, scores, all_ids, all_scores = search.BestBeams(result, p.length_alpha)
    return (tf.cast(ids, tf.int32), scores, tf.cast(all_ids, tf.int32),
            all_scores)

  def DecodeWithTheta(self, theta, input_batch):
    """Decodes a batch: hypothesis ids plus what BLEU needs."""
    p = self.params
    if p.pipelined_decode:
      ids, scores = pipelined_decode.Decode(
          self, theta, input_batch.src_ids, input_batch.src_paddings,
          beam_size=p.beam_size, num_lanes=p.decode_micro_batches,
          lead_parts=p.decode_lead_parts)
    elif p.beam_size > 1:
      ids, scores, _, _ = self.BeamSearchDecode(theta, input_batch.src_ids,
                                                input_batch.src_paddings)
    else:
      ids, scores = self.GreedyDecode(theta, input_batch.src_ids,
                                      input_batch.src_paddings)
    out = {'hyp_ids': ids, 'scores': scores}
    for key in ('tgt_text', 'pair'):
      if key in input_batch:
        out[key] = input_batch[key]
    return out

  def _Vocab(self):
    if not hasattr(self, '_vocab'):
      self._vocab = vocab_lib.Vocab(self.params.vocab_path)
    return self._vocab

  def CreateDecoderMetrics(self):
    """'bleu' overall; 'bleu/<pair>' entries are added as pairs appear."""
    return {
        'num_samples_in_batch': metrics.AverageMetric(),
        'bleu': bleu.SacreBleuMetric(),
    }

  def PostProcessDecodeOut(self, decode_out_dict, decode_metrics_dict):
    """Turns hypothesis ids into text and updates BLEU (overall, per pair)."""
    hyps, refs, pairs = DecodedText(decode_out_dict, self._Vocab())
    decode_metrics_dict['num_samples_in_batch'].Update(len(hyps))
    key_values = []
    for i, (hyp, ref, pair) in enumerate(zip(hyps, refs, pairs)):
      decode_metrics_dict['bleu'].Update(ref, hyp)
      name = 'bleu/%s' % pair
      if name not in decode_metrics_dict:
        decode_metrics_dict[name] = bleu.SacreBleuMetric()
      decode_metrics_dict[name].Update(ref, hyp)
      key_values.append(('%s:%d' % (pair, i), '%s\t%s' % (hyp, ref)))
    return key_values


def DecodedText(decode_out, vocab):
  """(hypotheses, references, pairs) as Python strings from fetched Decode.

  Args:
    decode_out: a dict with numpy 'hyp_ids' [B, T] and, if present, byte
      strings 'tgt_text' and 'pair' [B].
    vocab: a `vocab.Vocab`.

  Returns:
    Three lists of str of length B ('' for missing references/pairs).
  """
  ids = decode_out['hyp_ids']
  hyps = [vocab.Decode(row) for row in ids]

  def _Text(key):
    if key not in decode_out:
      return [''] * len(hyps)
    return [x.decode('utf-8') if isinstance(x, bytes) else str(x)
            for x in decode_out[key]]

  return hyps, _Text('tgt_text'), _Text('pair')
