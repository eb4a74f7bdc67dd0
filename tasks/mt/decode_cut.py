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

``tasks.mt.pipelined_decode`` decodes any cut; on this one device k runs the
k-th share of the encoder, then in the decoding loop the k-th share of the
decoder (device 0 also embeds the tokens). The same cut trains as a looped
pipeline (``PipeliningLayer`` with ``stage_sizes`` and ``stage_devices``).
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import partition
from gpipe.measure import param_count
from gpipe.measure import run_time
from lingvo import compat as tf
from tasks.mt import blocks
from tasks.mt import search
from tasks.mt import stack


class Cut(collections.namedtuple('Cut', ['stage_sizes', 'stage_devices'])):
  """Layers per stage and each stage's device (``PipeliningLayer`` params)."""

  __slots__ = ()


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


def DecodeCut(layer_params, devices, step_costs=None):
  """The 2K-stage decode cut on K devices (one stage for one device).

  Args:
    layer_params: a flat encoder-decoder layer list
      (``stack.EncoderDecoderLayers``).
    devices: the K devices.
    step_costs: per layer after the encoder (decoder layers and softmax),
      the cost of its decoding step, e.g. ``MeasuredStepCosts``; None: the
      weights it reads (``stack.DecodeStepCosts``).

  Returns:
    A Cut: 2K stage sizes and devices ``devices + devices`` (K=1: one stage).

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
  # The embedding's lookup is next to nothing beside an encoder layer.
  encoder_costs = [0.0 if p.cls is blocks.EmbeddingLayer else
                   float(stack.CountParams([p])) for p in encoder]
  if num_encoder - 1 < len(devices):
    raise ValueError('a decode cut on %d devices needs at least %d encoder '
                     'layers; got %d' % (len(devices), len(devices),
                                         num_encoder - 1))
  sizes = (partition.PartitionByCost(encoder_costs, len(devices)) +
           partition.PartitionByCost(step_costs, len(devices)))
  return Cut(sizes, devices + devices)


def MeasuredStepCosts(layer_params, rows, src_len, max_len, repeats=5):
  """Seconds of one decoding step of each decoder layer and the softmax.

  Each distinct layer (up to its name) is built once in a graph of its own
  and its step (``DecoderLayer.ExtendStep``; the softmax's logits and
  greedy pick) timed on `rows` rows at the middle position, in a session
  with one thread, as a one-core worker runs it. The median of `repeats`
  runs after a warm-up. Beam search is balanced by these costs too: its
  step's pick and cache reordering are not in them.

  Args:
    layer_params: the decoder layers and the softmax (the layers after the
      encoder in ``stack.EncoderDecoderLayers``).
    rows: rows decoded together in one lane (examples x beams).
    src_len: source length.
    max_len: decoding steps.
    repeats: timed runs per layer.

  Returns:
    A list of seconds, one per layer.
  """
  return param_count.RunIsolated(
      lambda: _MeasureSteps(layer_params, rows, src_len, max_len, repeats))


def _StepFetch(sess, layer, rows, src_len, max_len):
  """(fetch, feeds) of one decoding step of `layer` at the middle position.

  Everything the step reads but its weights is fed, so that no part of it is
  folded into a constant.
  """
  p = layer.params
  rng = np.random.RandomState(0)
  t = max_len // 2
  x = tf.compat.v1.placeholder(tf.float32, [rows, 1, p.model_dim])
  feeds = {x: rng.normal(size=[rows, 1, p.model_dim]).astype(np.float32)}
  if p.cls is blocks.SoftmaxLayer:
    logits = search.StepOutputLogits(layer, layer.theta, x)
    return search.GreedyPick(logits, t, search.GreedyStart(rows, max_len)), (
        feeds)
  src = tf.constant(rng.normal(size=[rows, src_len, p.model_dim]),
                    tf.float32)
  state = layer.InitDecodeState(layer.theta, rows, max_len, src,
                                tf.zeros([rows, src_len]))
  values = sess.run(state)
  holders = tf.nest.map_structure(
      lambda v: tf.compat.v1.placeholder(tf.as_dtype(v.dtype), v.shape),
      values)
  feeds.update(zip(tf.nest.flatten(holders), tf.nest.flatten(values)))
  cache, source = holders
  return layer.ExtendStep(layer.theta, x, t, cache, source), feeds


def _MeasureSteps(layer_params, rows, src_len, max_len, repeats):
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
          fetch, feeds = _StepFetch(sess, layer, rows, src_len, max_len)
          measured[key] = run_time.RunSeconds(sess, fetch, feeds,
                                              repeats=repeats)
    costs.append(measured[key])
  return costs
