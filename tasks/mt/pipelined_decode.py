"""Pipelined decoding of the Transformer: its training stages, M lanes.

The network's flat layer list [embedding, encoders, decoders, softmax] was cut
into stages for training, each on its device. Decoding keeps that cut; the
cut that suits it is ``decode_cut.DecodeCut``, 2K stages on K devices in a
loop (the encoder's share of each device, then its share of the decoder):

1. The encoder runs forward-only through the stages that hold the
   embedding and the encoder layers (``gpipe.lanes.Encode``), in
   micro-batches of whole examples, at least one per lane; each of the M
   lanes of the batch takes its micro-batches' output.
2. Every stage holding decoder layers takes each lane's encoder output and
   computes, on its own device, the cross-attention keys and values of its
   layers and their empty self-attention key/value caches (with beam search
   the lane's rows are repeated per beam first).
3. The decoding loop (``gpipe.lanes.Decode``): per step and lane, the first
   stage embeds the previous tokens, each stage with decoder layers extends
   its caches by one position (reordering them by the beams the last step
   kept, with beam search), and the stage holding the softmax picks the
   tokens (``search.GreedyPick`` / ``BeamPick``: the unpipelined decoder's
   code) and sends them back to the first stage. Stages that hold none of
   these (encoder layers only) are left out of the loop, and consecutive
   stages on one device are one stage of the loop. A cut may also split one
   decoder layer's step between two consecutive stages (`lead_parts`: the
   earlier runs its first parts, ``DecoderLayer.ExtendStepPart``), each
   keeping the state of its own parts. A lane whose sequences have all
   finished stops costing compute; the others go on.

The caches of each stage live on its device as loop variables, never sent
anywhere; only a lane's [rows, 1, D] hidden state, its beam indices and its
tokens cross devices each step. The tokens equal the unpipelined decoder's:
the same layers compute the same rows (tested token for token).

Only the Transformer's step is written here; the stages come from the
pipeline's public view of its cut (``PipeliningLayer.Stages()``), and the
loop, the lanes and the encoder's forward pass from ``gpipe.lanes``.
"""

import numbers

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import lanes
from gpipe import micro_batch
from lingvo import compat as tf
from lingvo.core import py_utils
import numpy as np
from tasks.mt import blocks
from tasks.mt import search
from tasks.mt import vocab as vocab_lib


def _IsEncoderLayer(layer):
  """Whether `layer` runs once per batch, before the loop (the encoder)."""
  return isinstance(layer, (blocks.EmbeddingLayer, blocks.EncoderLayer))


class _Stage:
  """One pipeline stage's layers, sorted by what decoding does with them.

  ``decoders`` lists (theta key, DecoderLayer, step parts): the stage's
  decoding step runs these parts of these layers (``DecoderLayer.
  ExtendStepPart``), whole layers unless the cut moved some parts between
  stages (``_MoveLeadParts``).
  """

  def __init__(self, index, device, pairs):
    """Constructor.

    Args:
      index: k.
      device: the stage's device.
      pairs: its (theta key, layer) pairs in order.
    """
    self.index = index
    self.device = device
    self.pairs = list(pairs)
    self.embedding = [x for x in pairs
                      if isinstance(x[1], blocks.EmbeddingLayer)]
    self.decoders = [(key, layer, layer.StepParts()) for key, layer in pairs
                     if isinstance(layer, blocks.DecoderLayer)]
    self.softmax = [x for x in pairs if isinstance(x[1], blocks.SoftmaxLayer)]

  @property
  def decodes(self):
    """Whether the stage has work in each decoding step."""
    return bool(self.embedding or self.decoders or self.softmax)

  def Joined(self, other):
    """This stage and the next one, `other`, as one stage (on this device)."""
    joined = _Stage(self.index, self.device, self.pairs + other.pairs)
    joined.decoders = self.decoders + other.decoders
    return joined


def _Stages(task):
  """The network's stages as _Stage objects, first stage first."""
  return [_Stage(s.index, s.device, s.Items())
          for s in task.network.Stages()]


def _MoveLeadParts(task, stages, lead_parts):
  """Moves each stage's lead parts to the end of the previous stage's step.

  Args:
    task: the TransformerMTTask (for its name in errors).
    stages: every _Stage, first stage first; changed in place.
    lead_parts: per stage, how many leading step parts of its first layer
      the previous stage runs (None: none).

  Raises:
    ValueError: a list of the wrong length, or lead parts where they cannot
      move: a stage whose first layer is not a decoder layer with more parts,
      or a previous stage without decoder layers or with the softmax.
  """
  if lead_parts is None:
    return
  name = task.params.name
  lead_parts = list(lead_parts)
  if len(lead_parts) != len(stages):
    raise ValueError('%s: lead_parts gives one count per stage (%d), got %d' %
                     (name, len(stages), len(lead_parts)))
  for k, lead in enumerate(lead_parts):
    if not isinstance(lead, numbers.Integral) or isinstance(lead, bool):
      raise ValueError('%s: lead_parts[%d]=%r: give whole numbers of step '
                       'parts' % (name, k, lead))
    if not lead:
      continue
    stage = stages[k]
    first = stage.pairs[0][1]
    prev = stages[k - 1] if k else None
    if (lead < 0 or not isinstance(first, blocks.DecoderLayer) or
        lead >= len(first.StepParts()) or prev is None or
        not prev.decoders or prev.softmax):
      raise ValueError(
          '%s: lead_parts[%d]=%d: stage %d\'s first layer (%s) must be a '
          'decoder layer with more than %d step parts, after a stage with '
          'decoder layers and no softmax; use decode_cut.DecodeCut\'s '
          'lead_parts, or none' % (name, k, lead, k,
                                    type(first).__name__, lead))
    key, layer, parts = stage.decoders[0]
    prev.decoders.append((key, layer, parts[:lead]))
    stage.decoders[0] = (key, layer, parts[lead:])


def _LoopStages(stages):
  """The _Stages of the decoding loop (``gpipe.lanes.LoopStages``).

  E.g. the embedding's stage and the first decoder layers' of
  ``decode_cut.DecodeCut`` are one stage of the loop.
  """
  return lanes.LoopStages(stages, has_step=lambda s: s.decodes)


def CheckDecodable(task):
  """Raises a clear ValueError if `task`'s network cannot be decoded.

  Args:
    task: a TransformerMTTask.
  """
  layers = [lp.cls for lp in task.network.params.layers]
  name = task.params.name
  if blocks.DecoderLayer not in layers:
    raise ValueError(
        '%s: the network has no DecoderLayer, so there is nothing to decode; '
        'decode a network built by stack.EncoderDecoderLayers' % name)
  if (blocks.EncoderLayer not in layers or
      not task.network.params.layers[0].has_source):
    raise ValueError(
        '%s: pipelined decoding translates a source, but the network has no '
        'encoder (a decoder-only language model); decode an encoder-decoder '
        'network (stack.EncoderDecoderLayers)' % name)


def NumLanes(task, batch, beam_size, num_lanes=None):
  """M for a batch of `batch` examples, checked (``gpipe.lanes.NumLanes``).

  Args:
    task: a TransformerMTTask.
    batch: examples in the batch (an int).
    beam_size: beams per example.
    num_lanes: the lanes asked for, or None for the default: one per stage
      of the decoding loop (one per device in a row: K for ``DecodeCut``'s
      2K stages on K devices; lead parts move work between loop stages,
      not their number), or the most below that which divide the batch.

  Returns:
    M.

  Raises:
    ValueError: M < 1, M larger than the batch, or M not dividing it.
  """
  return lanes.NumLanes(
      len(_LoopStages(_Stages(task))), batch, num_lanes, beam_size,
      what='%s: decode_micro_batches' % task.params.name)


def _EncoderInputs(src_ids, src_paddings):
  """What the embedding layer reads to embed a source (a dummy target)."""
  batch = py_utils.GetShape(src_ids, 2)[0]
  return (py_utils.NestedMap(
      src_ids=src_ids, src_paddings=src_paddings,
      tgt_ids=tf.zeros([batch, 1], src_ids.dtype),
      tgt_paddings=tf.zeros([batch, 1])),)


def _Encode(task, theta, src_ids, src_paddings, num_lanes):
  """(encoder output, paddings) of each lane, on the encoder's last device.

  The embedding and encoder layers run forward-only over their stages
  (``gpipe.lanes.Encode``), compiled as the network's ``compile`` says.
  """
  return lanes.Encode(
      [s.Only(_IsEncoderLayer) for s in task.network.Stages()],
      theta.network, (src_ids, src_paddings), num_lanes,
      args_fn=lambda part: _EncoderInputs(*part),
      outputs_fn=lambda out: (out[0].src, out[0].src_paddings),
      compile=_Compile(task))


def _Compile(task):
  """The network's ``compile`` param: XLA for the encoder and the steps."""
  return getattr(task.network.params, 'compile', None)


def _StepFn(stage, beam_size, max_len):
  """The decoding step of one stage (see gpipe.lanes.LaneStage.step)."""
  beams = beam_size > 1

  def Step(theta, t, carry, state, sources):
    if stage.embedding:
      (_, emb), = stage.embedding
      x = emb.EmbedTargetStep(theta.emb, carry.ids, t, max_len)
    else:
      x = carry.x
    caches = state.caches
    if beams:
      # The beams the last step kept, in their new order.
      caches = tf.nest.map_structure(
          lambda c: search.ReorderBeams(c, carry.beam), caches)
    new_caches = []
    for (_, layer, parts), layer_theta, cache, source in zip(
        stage.decoders, theta.decoders, caches, sources):
      for part in parts:
        x, cache = layer.ExtendStepPart(layer_theta, part, x, t, cache,
                                        source)
      new_caches.append(cache)
    new_state = py_utils.NestedMap(caches=new_caches)
    if not stage.softmax:
      out = py_utils.NestedMap(x=x)
      if beams:
        out.beam = carry.beam
      return out, new_state
    (_, softmax), = stage.softmax
    logits = search.StepOutputLogits(softmax, theta.softmax, x)
    if beams:
      result, beam = search.BeamPick(logits, t, state.result)
      batch, k, _ = py_utils.GetShape(result.outputs, 3)
      # Sliced at t, a begin in host memory (see sublayers.RowAt).
      ids = tf.reshape(tf.slice(result.outputs, tf.stack([0, 0, t]),
                                [-1, -1, 1]), [batch * k])
      out = py_utils.NestedMap(ids=ids, beam=beam)
    else:
      result, ids = search.GreedyPick(logits, t, state.result)
      out = py_utils.NestedMap(ids=ids)
    out.done = search.AllFinished(result)
    new_state.result = result
    return out, new_state

  return Step


def _StageTheta(stage, theta):
  """The theta a stage's step reads (``lanes.Decode`` reads it once)."""
  net_theta = theta.network
  picked = py_utils.NestedMap(
      decoders=[layer.PartTheta(net_theta[key], parts)
                for key, layer, parts in stage.decoders])
  if stage.embedding:
    picked.emb = net_theta[stage.embedding[0][0]]
  if stage.softmax:
    picked.softmax = net_theta[stage.softmax[0][0]]
  return picked


def Decode(task, theta, src_ids, src_paddings, beam_size=1, num_lanes=None,
           lead_parts=None):
  """Greedy decoding or beam search through the network's stages, in lanes.

  Args:
    task: a TransformerMTTask.
    theta: its theta.
    src_ids: [B, S] int32 source ids (static B).
    src_paddings: [B, S] source paddings.
    beam_size: beams per example (1: greedy).
    num_lanes: M, or None for the default (``NumLanes``).
    lead_parts: None, or per stage of the network the number of leading
      step parts of its first layer (a decoder layer, ``DecoderLayer.
      StepParts``) that the previous stage runs in the decoding loop
      (``decode_cut.DecodeCut`` gives them): one layer's step split between
      two devices, for a finer balance than whole layers.

  Returns:
    (ids [B, T] int32, scores [B]): as ``GreedyDecode`` (beam_size 1) or the
    best hypothesis and its log-probability of ``BeamSearchDecode``; equal
    to theirs.

  Raises:
    ValueError: a network without a decoder (or encoder), a number of
      lanes that does not fit the batch (see ``NumLanes``), or lead parts
      that cannot move.
  """
  CheckDecodable(task)
  p = task.params
  length = p.max_decode_len
  batch = micro_batch.StaticBatchSize([src_ids], 0)
  stages = _Stages(task)
  _MoveLeadParts(task, stages, lead_parts)
  decode_stages = _LoopStages(stages)
  m = NumLanes(task, batch, beam_size, num_lanes)
  k = beam_size
  # The ids as the stages take them in training (int64: device memory on a
  # GPU); the search keeps its ids in search.ID_DTYPE too.
  encoded = _Encode(task, theta, blocks.NetworkInput(src_ids), src_paddings,
                    m)
  rows = batch // m * k
  lane_stages, states, constants = [], [], []
  for s in decode_stages:
    stage_states, stage_constants = [], []
    with tf.device(s.device):
      for src, paddings in encoded:
        if k > 1:
          # Beam b of example i is row i * k + b.
          src, paddings = tf.repeat(src, k, axis=0), tf.repeat(paddings, k,
                                                               axis=0)
        caches, sources = [], []
        for key, layer, parts in s.decoders:
          # The state of the parts the stage runs only (() for the others):
          # the cache of the self-attention, the keys and values of the
          # cross-attention, each on the device that runs that part.
          caches.append(layer.InitCache(rows, length)
                        if 'self_atten' in parts else ())
          sources.append(
              layer.InitSource(layer.PartTheta(theta.network[key],
                                               ['cross_atten']), src, paddings)
              if 'cross_atten' in parts else ())
        state = py_utils.NestedMap(caches=caches)
        if s.softmax:
          state.result = (search.BeamStart(rows // k, k, length) if k > 1
                          else search.GreedyStart(rows, length))
        stage_states.append(state)
        stage_constants.append(sources)
    states.append(stage_states)
    constants.append(stage_constants)
    lane_stages.append(lanes.LaneStage(
        stage=s.index, device=s.device, theta=_StageTheta(s, theta),
        step=_StepFn(s, k, length)))
  with tf.device(decode_stages[-1].device):
    feedback = []
    for _ in range(m):
      start = py_utils.NestedMap(
          ids=tf.fill([rows], tf.constant(vocab_lib.BOS_ID, search.ID_DTYPE)),
          done=tf.constant(False))
      if k > 1:
        start.beam = tf.constant(np.tile(np.arange(k), [rows // k, 1]),
                                 search.ID_DTYPE)
      # The loop starts once the whole encoder has run: a lane's steps
      # cannot run ahead of the others' (each device runs step t of every
      # lane before step t+1), so an early lane would only take a device
      # from the encoder.
      with tf.control_dependencies([src for src, _ in encoded]):
        feedback.append(start.Transform(tf.identity))
  _, states = lanes.Decode(lane_stages, feedback, states, constants, length,
                           lane_done=lambda f: f.done,
                           compile=_Compile(task))
  with tf.device(decode_stages[-1].device):
    results = [state.result for state in states[-1]]
    if k > 1:
      best = [search.BestBeams(r, p.length_alpha)[:2] for r in results]
    else:
      best = [(r.outputs, r.score) for r in results]
    ids, scores = micro_batch.Merge(best, 0)
    return tf.cast(ids, tf.int32), scores
