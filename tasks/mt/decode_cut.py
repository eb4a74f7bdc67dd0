"""A cut of an encoder-decoder Transformer for pipelined decoding on K devices.

Decoding runs the encoder once, forward-only, then the decoder layers and the
softmax once per token. A cut into K consecutive stages cannot balance both:
the stages that hold the encoder would hold few decoder layers. So
``DecodeCut`` cuts the flat layer list [embedding, encoders, decoders,
softmax] into 2K stages on the K devices in a loop, [d0 .. dK-1, d0 ..
dK-1]:

* stages 0..K-1 hold the embedding and the encoder layers, balanced on their
  own (by their weights: every encoder layer does the same work), so the
  encoder is a forward-only pipeline over all K devices;
* stages K..2K-1 hold the decoder layers and the softmax, balanced by the
  time of their decoding step (``MeasuredStepCosts``, or the weights a step
  reads, ``stack.DecodeStepCosts``, when not measured).

Whole layers balance a shallow decoder poorly: four decoder layers and a
softmax on two devices leave one device a layer's half heavier. With the
costs of each layer's step parts (self-attention, cross-attention,
feed-forward: ``MeasuredStepCosts(parts=True)``) the loop may split one
layer between two consecutive devices: the layer belongs to the later stage,
and the earlier device runs its first parts (the cut's ``lead_parts``), e.g.
for K=2 with the second device's first layer split after its
self-attention::

    d0 | emb  dec0  dec1  dec2.self_atten
    d1 |                  dec2.cross_atten dec2.ffn  dec3  softmax + pick

The hand-over between the devices is the same [rows, 1, D] hidden state.

``tasks.mt.pipelined_decode`` decodes any cut; on this one device k runs the
k-th share of the encoder, then in the decoding loop the k-th share of the
decoder (device 0 also embeds the tokens). The same cut trains as a looped
pipeline (``PipeliningLayer`` with ``stage_sizes`` and ``stage_devices``).
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import partition
from gpipe.runtime import background
from gpipe.measure import run_time
from lingvo import compat as tf
from tasks.mt import blocks
from tasks.mt import search
from tasks.mt import stack


class Cut(collections.namedtuple('Cut', ['stage_sizes', 'stage_devices',
                                         'lead_parts'])):
  """A network's stages for decoding.

  ``stage_sizes`` and ``stage_devices`` are ``PipeliningLayer``'s params;
  ``lead_parts`` (None: whole layers) gives per stage the number of leading
  step parts (``DecoderLayer.StepParts``) of its first layer that the
  decoding loop runs at the end of the previous stage's step, on the
  previous stage's device (``pipelined_decode.Decode``'s `lead_parts`).
  """

  __slots__ = ()


Cut.__new__.__defaults__ = (None,)


def _IsEncoderPart(p):
  return p.cls in (blocks.EmbeddingLayer, blocks.EncoderLayer)


def _CheckLayout(layer_params):
  """The number of embedding + encoder layers, checked to come first."""
  num_encoder = 0
  while (num_encoder < len(layer_params) and
         _IsEncoderPart(layer_params[num_encoder])):
    num_encoder += 1
  rest = layer_params[num_encoder:]
  if (num_encoder < 2 or not rest or
      any(_IsEncoderPart(p) for p in rest) or
      not any(p.cls is blocks.DecoderLayer for p in rest)):
    raise ValueError(
        'a decode cut needs [embedding, encoder layers, decoder layers, '
        'softmax] (stack.EncoderDecoderLayers); got %s' %
        [p.cls.__name__ for p in layer_params])
  return num_encoder


def _Parts(cost):
  """A layer's step cost as a list of its parts' costs (one if a number)."""
  return ([float(c) for c in cost] if isinstance(cost, (list, tuple))
          else [float(cost)])


def _Bottleneck(sizes, costs):
  """The dearest group's cost when `costs` are cut into groups `sizes`."""
  ends = np.cumsum([0] + list(sizes))
  return max(sum(costs[ends[g]:ends[g + 1]]) for g in range(len(sizes)))


def _PartGroups(unit_costs, ends_layer, num_groups):
  """Consecutive groups of step parts minimizing the dearest group.

  Every group must run the last part of at least one layer (so that it owns
  a layer).

  Args:
    unit_costs: the cost of each step part, in order.
    ends_layer: per part, whether it is its layer's last.
    num_groups: K.

  Returns:
    (K group sizes, the dearest group's cost), or (None, inf) if no cut fits.
  """
  n = len(unit_costs)
  prefix = np.concatenate([[0.0], np.cumsum(unit_costs)])
  # ends[j]: layers ended within the first j parts.
  ends = np.concatenate([[0], np.cumsum(ends_layer)])
  inf = float('inf')
  best = np.where(ends >= 1, prefix, inf)  # one group: the first j parts
  starts = []  # per group after the first, per j: where it starts
  for _ in range(1, num_groups):
    new, start = np.full(n + 1, inf), np.zeros(n + 1, np.int64)
    for j in range(1, n + 1):
      i = np.arange(j)
      ok = (ends[j] - ends[i] >= 1) & np.isfinite(best[:j])
      if not ok.any():
        continue
      cost = np.where(ok, np.maximum(best[:j], prefix[j] - prefix[:j]), inf)
      start[j] = int(np.argmin(cost))
      new[j] = cost[start[j]]
    best = new
    starts.append(start)
  if not np.isfinite(best[n]):
    return None, inf
  sizes, j = [], n
  for start in reversed(starts):
    sizes.append(j - start[j])
    j = start[j]
  sizes.append(j)
  return sizes[::-1], float(best[n])


def _DecoderCut(step_costs, num_devices):
  """(layers per device, lead parts per device) of the decoding loop.

  Whole layers are cut by their total cost. When some layers give a cost
  per step part, the parts of all layers are also cut into consecutive
  groups, each running the last part of at least one layer; a layer split
  between two groups belongs to the later one (its device runs the layer's
  last parts), and the earlier device runs the first ones (the later
  group's lead parts). That cut is taken when its dearest group is cheaper.

  Args:
    step_costs: per layer, a cost or a list of its step parts' costs.
    num_devices: K.

  Returns:
    (K layer counts, K lead part counts, the first 0).
  """
  parts = [_Parts(c) for c in step_costs]
  totals = [sum(p) for p in parts]
  whole = partition.PartitionByCost(totals, num_devices)
  no_split = whole, [0] * num_devices
  if all(len(p) == 1 for p in parts):
    return no_split
  units = [(i, j) for i, p in enumerate(parts) for j in range(len(p))]
  sizes, bottleneck = _PartGroups(
      [c for p in parts for c in p],
      [j == len(parts[i]) - 1 for i, j in units], num_devices)
  # Only a cut cheaper beyond float rounding splits a layer.
  if sizes is None or bottleneck >= _Bottleneck(whole, totals) * (1 - 1e-9):
    return no_split
  layers, lead, start = [], [], 0
  for size in sizes:
    group = units[start:start + size]
    layers.append(sum(1 for i, j in group if j == len(parts[i]) - 1))
    lead.append(group[0][1])
    start += size
  return layers, lead


def DecodeCut(layer_params, devices, step_costs=None):
  """The 2K-stage decode cut on K devices (one stage for one device).

  Args:
    layer_params: a flat encoder-decoder layer list
      (``stack.EncoderDecoderLayers``).
    devices: the K devices.
    step_costs: per layer after the encoder (decoder layers and softmax),
      the cost of its decoding step, e.g. ``MeasuredStepCosts``; a list of
      costs for a decoder layer gives its step parts' (``DecoderLayer.
      StepParts``: ``MeasuredStepCosts(parts=True)``), and the loop may then
      split that layer between two devices. None: the weights a step reads
      (``stack.DecodeStepCosts``), whole layers.

  Returns:
    A Cut: 2K stage sizes, devices ``devices + devices`` and the lead parts
    of each stage (K=1: one stage).

  Raises:
    ValueError: a layer list of another layout, fewer than K encoder or
      decoder layers, or step_costs of the wrong length.
  """
  devices = list(devices)
  if len(devices) == 1:
    return Cut([len(layer_params)], devices)
  num_encoder = _CheckLayout(layer_params)
  encoder, decoder = layer_params[:num_encoder], layer_params[num_encoder:]
  if len(decoder) < len(devices):
    raise ValueError('a decode cut on %d devices needs at least %d decoder '
                     'layers and softmax; got %d' % (len(devices),
                                                     len(devices),
                                                     len(decoder)))
  if step_costs is None:
    step_costs = stack.DecodeStepCosts(decoder)
  if len(step_costs) != len(decoder):
    raise ValueError('step_costs: one per layer after the encoder (%d), got '
                     '%d' % (len(decoder), len(step_costs)))
  for p, cost in zip(decoder, step_costs):
    if not isinstance(cost, (list, tuple)):
      continue
    parts = (blocks.DecoderLayer.StepPartsOf(p)
             if p.cls is blocks.DecoderLayer else [p.cls.__name__])
    if len(cost) != len(parts):
      raise ValueError(
          'step_costs of %s: a list gives one cost per step part %s; got %d '
          '(give a number for a layer that is not cut into parts)' %
          (p.name, parts, len(cost)))
  # The embedding's lookup is next to nothing beside an encoder layer.
  encoder_costs = [0.0 if p.cls is blocks.EmbeddingLayer else
                   float(stack.CountParams([p])) for p in encoder]
  if num_encoder - 1 < len(devices):
    raise ValueError('a decode cut on %d devices needs at least %d encoder '
                     'layers; got %d' % (len(devices), len(devices),
                                         num_encoder - 1))
  decoder_sizes, lead = _DecoderCut(step_costs, len(devices))
  sizes = (partition.PartitionByCost(encoder_costs, len(devices)) +
           decoder_sizes)
  return Cut(sizes, devices + devices, [0] * len(devices) + lead)


def MeasuredStepCosts(layer_params, rows, src_len, max_len, repeats=5,
                      parts=False, beam_size=1):
  """Seconds of one decoding step of each decoder layer and the softmax.

  Each distinct layer (up to its name) is built once in a graph of its own
  and its step (``DecoderLayer.ExtendStep``, or each of its
  ``ExtendStepPart``; the softmax's logits and the search's pick) timed on
  `rows` rows at the middle position, in a session with one thread, as a
  one-core worker runs it, its state in variables as in the decoder's loop.
  The median of `repeats` runs after a warm-up. Each timed run also pays a
  session run's fixed cost, so a layer's parts sum to more than its whole
  step; the embedding of the tokens (a lookup, next to nothing) is not
  timed.
  With beam search the pick is ``search.BeamPick`` and a decoder layer's
  step (its 'self_atten' part) includes reordering its cache by the beams
  the last step kept, as the pipelined decoder does.

  Args:
    layer_params: the decoder layers and the softmax (the layers after the
      encoder in ``stack.EncoderDecoderLayers``).
    rows: rows decoded together in one lane (examples x beams).
    src_len: source length.
    max_len: decoding steps.
    repeats: timed runs per layer.
    parts: time a decoder layer's step parts (``StepParts``) one by one.
    beam_size: beams per example (1: greedy); must divide `rows`.

  Returns:
    A list, one entry per layer: seconds, or with `parts` a list of seconds
    per step part for a decoder layer (``DecodeCut``'s `step_costs`).

  Raises:
    ValueError: `beam_size` does not divide `rows`.
  """
  if beam_size < 1 or rows % beam_size:
    raise ValueError('rows (%d) are examples x beams: beam_size %d must '
                     'divide them' % (rows, beam_size))
  return background.RunIsolated(
      lambda: _MeasureSteps(layer_params, rows, src_len, max_len, repeats,
                            parts, beam_size))


def _StepFetch(sess, layer, rows, src_len, max_len, part, beam_size):
  """(fetch, feeds) of one decoding step of `layer` at the middle position.

  `part`: one of the layer's step parts, or None for the whole step. The
  state a step reads (the cache, the source's keys and values) is held in
  variables, as a decoder holds it in its loop: neither fed nor fetched
  (which would copy it each run), and not folded into constants. Only the
  token's hidden state (and the beams) are fed, and only the part's output
  is fetched.
  """
  p = layer.params
  rng = np.random.RandomState(0)
  t = max_len // 2
  k = beam_size
  x = tf.compat.v1.placeholder(tf.float32, [rows, 1, p.model_dim])
  feeds = {x: rng.normal(size=[rows, 1, p.model_dim]).astype(np.float32)}
  if p.cls is blocks.SoftmaxLayer:
    logits = search.StepOutputLogits(layer, layer.theta, x)
    if k > 1:
      return search.BeamPick(logits, t, search.BeamStart(rows // k, k,
                                                         max_len)), feeds
    return search.GreedyPick(logits, t, search.GreedyStart(rows, max_len)), (
        feeds)
  src = tf.constant(rng.normal(size=[rows, src_len, p.model_dim]),
                    tf.float32)
  values = sess.run(layer.InitDecodeState(layer.theta, rows, max_len, src,
                                          tf.zeros([rows, src_len])))
  held = []
  for value in tf.nest.flatten(values):
    init = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
    v = tf.compat.v1.Variable(init, trainable=False)
    sess.run(v.initializer, {init: value})
    held.append(v.read_value())
  cache, source = tf.nest.pack_sequence_as(values, held)
  if k > 1 and part in (None, 'self_atten'):
    beam = tf.compat.v1.placeholder(tf.int32, [rows // k, k])
    feeds[beam] = rng.randint(0, k, size=[rows // k, k]).astype(np.int32)
    cache = tf.nest.map_structure(lambda c: search.ReorderBeams(c, beam),
                                  cache)
  if part is None:
    return layer.ExtendStep(layer.theta, x, t, cache, source)[0], feeds
  return layer.ExtendStepPart(layer.theta, part, x, t, cache, source)[0], (
      feeds)


def _MeasureSteps(layer_params, rows, src_len, max_len, repeats, parts,
                  beam_size):
  """MeasuredStepCosts' body, in its own thread."""
  config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                    inter_op_parallelism_threads=1)
  measured = {}
  costs = []
  for p in layer_params:
    key = p.Copy().Set(name='layer').ToText()
    if key not in measured:
      with tf.Graph().as_default():
        layer = p.Copy().Set(name='layer').Instantiate()
        with tf.compat.v1.Session(config=config) as sess:
          sess.run(tf.compat.v1.global_variables_initializer())

          def Seconds(part):
            fetch, feeds = _StepFetch(sess, layer, rows, src_len, max_len,
                                      part, beam_size)
            return run_time.RunSeconds(sess, fetch, feeds, repeats=repeats)

          if parts and p.cls is blocks.DecoderLayer:
            measured[key] = [Seconds(part) for part in layer.StepParts()]
          else:
            measured[key] = Seconds(None)
    costs.append(measured[key])
  return costs
