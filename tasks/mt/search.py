"""Picking tokens from next-token logits: greedy and beam-search steps.

The unpipelined decoder (``model.TransformerMTTask.GreedyDecode`` and
``BeamSearchDecode``) and the pipelined one (``pipelined_decode``) both pick
their tokens here, so the same logits give the same tokens. A search keeps
its ``result`` (a NestedMap of the hypotheses so far) from step to step:

* greedy: ``outputs`` [B, T] ids, ``score`` [B] (log-probability up to and
  including </s>), ``finished`` [B];
* beam search: ``outputs`` [B, k, T], ``scores`` [B, k], ``finished`` and
  ``lengths`` [B, k]; beam b of example i is row i * k + b of the logits
  and of every per-row decoder state, which ``ReorderBeams`` follows.

Ids, lengths and beam indices are ``ID_DTYPE`` (int64): a decoding step on
a GPU keeps them in device memory, where int32 ones would go through host
memory (TensorFlow's int32 kernels on a GPU and its function arguments keep
int32 there) and be copied at every step (gpipe.measure.gpu_audit). The
decoders return int32 ids. The position ``t`` stays an int32 scalar: it is
read only as slices' begins (``sublayers.RowAt``), which are in host memory.

A finished sequence only continues with padding, at no cost, so a step over
sequences that are all finished changes nothing (``AllFinished``).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import py_utils
import numpy as np
from tasks.mt import sublayers
from tasks.mt import vocab as vocab_lib

NEG_INF = -1e9
ID_DTYPE = tf.int64


def StepOutputLogits(softmax, theta, x):
  """[B, V] float32 next-token logits of the decoder output `x` [B, 1, D]."""
  logits = tf.cast(softmax.Logits(theta, py_utils.NestedMap(tgt=x)),
                   tf.float32)
  return logits[:, 0, :]


def GreedyStart(batch, length):
  """The greedy result before position 0."""
  return py_utils.NestedMap(
      outputs=tf.zeros([batch, length], ID_DTYPE), score=tf.zeros([batch]),
      finished=tf.zeros([batch], tf.bool))


def GreedyPick(logits, t, result):
  """The most likely token at position `t` of every unfinished row.

  Args:
    logits: [B, V] next-token logits.
    t: a scalar int32 tensor, the position.
    result: the greedy result before position t.

  Returns:
    (result with position t, [B] tokens picked: 0 in finished rows).
  """
  length = py_utils.GetShape(result.outputs, 2)[1]
  finished = result.finished
  log_probs = tf.nn.log_softmax(logits)
  token = tf.argmax(log_probs, axis=-1, output_type=result.outputs.dtype)
  token = tf.where(finished, tf.zeros_like(token), token)
  gained = tf.reduce_max(log_probs, axis=-1)
  score = result.score + tf.where(finished, tf.zeros_like(gained), gained)
  outputs = result.outputs + (
      sublayers.OneHotAt(t, length, result.outputs.dtype) *
      token[:, tf.newaxis])
  finished = tf.logical_or(finished, tf.equal(token, vocab_lib.EOS_ID))
  return py_utils.NestedMap(outputs=outputs, score=score,
                            finished=finished), token


def BeamStart(batch, beam_size, length):
  """The beam-search result before position 0: one live beam per example."""
  k = beam_size
  first_beam_only = tf.concat(
      [tf.zeros([batch, 1]), tf.fill([batch, k - 1], NEG_INF)], axis=1)
  return py_utils.NestedMap(
      outputs=tf.zeros([batch, k, length], ID_DTYPE), scores=first_beam_only,
      finished=tf.zeros([batch, k], tf.bool),
      lengths=tf.zeros([batch, k], ID_DTYPE))


def BeamPick(logits, t, result):
  """The k best continuations of each example's k beams at position `t`.

  Args:
    logits: [B * k, V] next-token logits, row i * k + b for beam b of
      example i.
    t: a scalar int32 tensor, the position.
    result: the beam-search result before position t.

  Returns:
    (result with position t, beam [B, k] ids: the beam each new beam
    continues, for ``ReorderBeams`` of the per-row decoder state).
  """
  batch, k, length = py_utils.GetShape(result.outputs, 3)
  vocab_size = py_utils.GetShape(logits, 2)[1]
  # A finished hypothesis may only continue with padding, at no cost.
  pad_only = np.full([vocab_size], NEG_INF, np.float32)
  pad_only[vocab_lib.PAD_ID] = 0.0
  pad_only = tf.constant(pad_only)
  log_probs = tf.reshape(tf.nn.log_softmax(logits), [batch, k, vocab_size])
  shape = [batch, k, vocab_size]
  log_probs = tf.where(
      tf.broadcast_to(result.finished[:, :, tf.newaxis], shape),
      tf.broadcast_to(pad_only, shape), log_probs)
  candidates = tf.reshape(result.scores[:, :, tf.newaxis] + log_probs,
                          [batch, k * vocab_size])
  # int32 indices, cast on the device: TensorFlow's GPU TopK kernel has no
  # int64 indices (the audit finds it on the host with index_type=int64).
  scores, index = tf.nn.top_k(candidates, k)
  index = tf.cast(index, result.outputs.dtype)
  beam, token = index // vocab_size, index % vocab_size
  outputs = tf.gather(result.outputs, beam, batch_dims=1)
  finished = tf.gather(result.finished, beam, batch_dims=1)
  lengths = tf.gather(result.lengths, beam, batch_dims=1)
  lengths += 1 - tf.cast(finished, lengths.dtype)
  outputs += (sublayers.OneHotAt(t, length, outputs.dtype)[tf.newaxis,
                                                           tf.newaxis] *
              token[:, :, tf.newaxis])
  finished = tf.logical_or(finished, tf.equal(token, vocab_lib.EOS_ID))
  return py_utils.NestedMap(outputs=outputs, scores=scores, finished=finished,
                            lengths=lengths), beam


def ReorderBeams(x, beam):
  """Rows [B * k, ...] of `x` in the order of the beams `beam` [B, k] picked."""
  batch, k = py_utils.GetShape(beam, 2)
  shape = py_utils.GetShape(x)
  x = tf.reshape(x, [batch, k] + shape[1:])
  return tf.reshape(tf.gather(x, beam, batch_dims=1), shape)


def BestBeams(result, length_alpha):
  """Each example's best hypothesis by length-normalized score.

  Args:
    result: the beam-search result after the last position.
    length_alpha: the exponent of the length normalization
      ((5 + length) / 6)^alpha.

  Returns:
    (ids [B, T] of the best hypothesis, its log-probability [B],
     all hypotheses [B, k, T], their log-probabilities [B, k]).
  """
  penalty = tf.pow((5.0 + tf.cast(result.lengths, tf.float32)) / 6.0,
                   length_alpha)
  best = tf.argmax(result.scores / penalty, axis=1, output_type=ID_DTYPE)
  best_ids = tf.gather(result.outputs, best, batch_dims=1)
  best_scores = tf.gather(result.scores, best, batch_dims=1)
  return best_ids, best_scores, result.outputs, result.scores


def AllFinished(result):
  """Whether every sequence of `result` is finished (a scalar bool)."""
  return tf.reduce_all(result.finished)
