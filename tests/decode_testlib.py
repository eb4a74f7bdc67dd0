"""A small trained Transformer for the decoding tests, and its decoders.

``TrainedCheckpoint()`` gives the weights of an encoder-decoder T(3, 64, 2)
with d_model 32 trained to copy up to 5 tokens (``Train``: one process, two
stages on virtual CPUs; half the sources shorter and padded, so that its
copies end at different steps): under Bazel the ones the build trained once
for every test that decodes them (``//tests:copy_model_checkpoint``, run by
tests/decode_checkpoint.py), else trained in this process. ``DecodeGraph``
restores them into a network cut into any number of stages on given devices
and builds the unpipelined and pipelined decoders.
"""

import os
import tempfile

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import pipeline
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from tasks.mt import model
from tasks.mt import pipelined_decode
from tasks.mt import stack
from tasks.mt import vocab
from tests import graph_rewrites

BATCH, LEN, VOCAB = 8, 5, 16  # Copy 5 tokens drawn from ids 4..15.
NUM_LAYERS = 3
BEAM = 3
CONFIG = graph_rewrites.CpuConfig(4)


def CopyBatch(rng, batch=BATCH, lengths=None):
  """Source = random tokens; target = the same tokens, then </s>.

  Args:
    rng: a numpy RandomState.
    batch: examples.
    lengths: per example, its source's length (1 to LEN), or None for LEN
      in every example. A shorter source is padded to LEN with random
      tokens under its padding (a decoder must not read them); its target
      is the tokens, </s>, then padding.

  Returns:
    A dict of numpy arrays: src_ids and src_paddings [batch, LEN], tgt_ids,
    tgt_labels, tgt_paddings and tgt_weights [batch, LEN + 1].
  """
  tokens = rng.randint(4, VOCAB, size=[batch, LEN]).astype(np.int32)
  lengths = np.full([batch], LEN) if lengths is None else np.asarray(lengths)
  src_paddings = (np.arange(LEN) >= lengths[:, None]).astype(np.float32)
  # Target position i: the i-th token, </s> at the source's length, padding
  # after it.
  tgt_paddings = (np.arange(LEN + 1) > lengths[:, None]).astype(np.float32)
  labels = np.concatenate([tokens, np.zeros([batch, 1], np.int32)], 1)
  labels[np.arange(batch), lengths] = vocab.EOS_ID
  labels = np.where(tgt_paddings > 0, vocab.PAD_ID, labels).astype(np.int32)
  bos = np.full([batch, 1], vocab.BOS_ID, np.int32)
  tgt_ids = np.concatenate([bos, labels[:, :-1]], 1)
  tgt_ids = np.where(tgt_ids == vocab.EOS_ID, vocab.PAD_ID, tgt_ids)
  return dict(
      src_ids=tokens, src_paddings=src_paddings,
      tgt_ids=tgt_ids.astype(np.int32), tgt_labels=labels,
      tgt_paddings=tgt_paddings, tgt_weights=1.0 - tgt_paddings)


def TrainingBatch(rng, batch=32):
  """A copy batch in which half the sources (at random) are shorter."""
  lengths = np.where(rng.rand(batch) < 0.5,
                     rng.randint(1, LEN + 1, size=batch), LEN)
  return CopyBatch(rng, batch, lengths)


def Layers():
  """The copy model's flat layer list."""
  return stack.EncoderDecoderLayers(
      vocab_size=VOCAB, model_dim=32, hidden_dim=64, num_heads=2,
      num_layers=NUM_LAYERS, dropout_prob=0.0, label_smoothing=0.0)


def TaskParams(devices, max_decode_len=LEN + 1, layers=None, cut=None,
               compile_mode=None):
  """The copy task's params, its network cut into len(devices) stages.

  Args:
    devices: the stage devices.
    max_decode_len: decoding steps.
    layers: the flat layer list (default: the copy model's).
    cut: a ``decode_cut.Cut`` to use instead (its own devices), or None
      for a uniform cut.
    compile_mode: the pipeline's ``compile`` (e.g. 'xla').

  Returns:
    TransformerMTTask params.
  """
  layer_list = layers or Layers()
  p = model.TransformerMTTask.Params().Set(
      name='copy', max_decode_len=max_decode_len, beam_size=1)
  p.network = pipeline.PipeliningLayer.Params().Set(
      name='network', layers=layer_list, num_stages=len(devices),
      num_micro_batches=2, stage_devices=list(devices),
      partition_cost='uniform', compile=compile_mode)
  if cut is not None:
    p.network.Set(num_stages=len(cut.stage_sizes),
                  stage_sizes=list(cut.stage_sizes),
                  stage_devices=list(cut.stage_devices))
    p.decode_lead_parts = cut.lead_parts
  return p


_CHECKPOINT = {}
STEPS = 200
# The checkpoint the build trained (//tests:copy_model_checkpoint), in a
# test's runfiles.
BUILT_CHECKPOINT = os.path.join('gpipe_lingvo', 'tests', 'copy_model', 'copy')


def TrainedCheckpoint():
  """The path of the copy model's weights (``Train``'s), once per process.

  Under ``bazel test``: the checkpoint the build trained, a data dependency
  of the test (``BUILT_CHECKPOINT`` in its runfiles); else trained here.
  """
  if 'path' not in _CHECKPOINT:
    built = os.path.join(os.environ.get('TEST_SRCDIR', ''), BUILT_CHECKPOINT)
    if os.environ.get('TEST_SRCDIR') and os.path.exists(built + '.index'):
      _CHECKPOINT['path'] = built
    else:
      _CHECKPOINT['path'] = Train(os.path.join(tempfile.mkdtemp(), 'copy'))
  return _CHECKPOINT['path']


def Train(prefix, steps=STEPS):
  """Trains the copy model; saves its weights to `prefix`; returns `prefix`.

  Trained with K=2 stages on /device:CPU:0 and :1 on ``TrainingBatch``es,
  seeded: the same weights every time. Writes ``prefix.index`` and
  ``prefix.data-00000-of-00001`` (no meta graph, no checkpoint state file).
  """
  rng = np.random.RandomState(0)
  with tf.Graph().as_default(), tf.compat.v1.Session(config=CONFIG) as sess:
    tf.random.set_seed(6)
    py_utils.GetOrCreateGlobalStepVar()
    task = TaskParams(['/device:CPU:0', '/device:CPU:1']).Instantiate()
    feeds = {
        k: tf.placeholder(tf.as_dtype(v.dtype), v.shape)
        for k, v in TrainingBatch(rng).items()
    }
    batch = py_utils.NestedMap(feeds)
    metrics, _ = task.ComputeLoss(
        task.theta, task.ComputePredictions(task.theta, batch), batch)
    loss = metrics['loss'][0]
    train = tf.train.AdamOptimizer(3e-3).minimize(loss)
    sess.run(tf.global_variables_initializer())
    for _ in range(steps):
      sess.run(train, {feeds[k]: v for k, v in TrainingBatch(rng).items()})
    saver = tf.train.Saver(task.vars.Flatten())
    return saver.save(sess, prefix, write_meta_graph=False,
                      write_state=False)


class DecodeGraph:
  """A restored copy model cut into stages, with its decoders.

  Build the decoders with ``Unpipelined`` / ``Pipelined`` inside
  ``with graph.graph.as_default()``, then ``Restore(sess)``.
  """

  def __init__(self, devices, max_decode_len=LEN + 1, batch=BATCH, seed=123,
               cut=None, lengths=None, compile_mode=None):
    """Builds the task and its test batch (no decoder yet).

    Args:
      devices: the stage devices (of a uniform cut).
      max_decode_len: decoding steps.
      batch: examples in the test batch.
      seed: of the test batch's tokens.
      cut: a ``decode_cut.Cut`` instead of a uniform cut on `devices`.
      lengths: the test sources' lengths (``CopyBatch``), or None for LEN.
      compile_mode: the pipeline's ``compile`` (e.g. 'xla').
    """
    self.graph = tf.Graph()
    self.max_decode_len = max_decode_len
    self.test = CopyBatch(np.random.RandomState(seed), batch, lengths)
    with self.graph.as_default(), cluster_factory.SetEval(True):
      self.task = TaskParams(devices, max_decode_len, cut=cut,
                             compile_mode=compile_mode).Instantiate()
      self.lead_parts = self.task.params.decode_lead_parts
      self.src_ids = tf.constant(self.test['src_ids'])
      self.src_paddings = tf.constant(self.test['src_paddings'])
      self._saver = tf.train.Saver(self.task.vars.Flatten())

    # AssertDecodesMatch's decoders and traced runs.
    self.fetches = {}
    self.traces = {}

  def Unpipelined(self, beam_size=1):
    """(ids, scores) of the unpipelined decoder."""
    with cluster_factory.SetEval(True):
      if beam_size > 1:
        return self.task.BeamSearchDecode(
            self.task.theta, self.src_ids, self.src_paddings,
            beam_size=beam_size)[:2]
      return self.task.GreedyDecode(self.task.theta, self.src_ids,
                                    self.src_paddings)

  def Pipelined(self, num_lanes, beam_size=1):
    """(ids, scores) of the pipelined decoder in `num_lanes` lanes."""
    with cluster_factory.SetEval(True):
      return pipelined_decode.Decode(self.task, self.task.theta, self.src_ids,
                                     self.src_paddings, beam_size=beam_size,
                                     num_lanes=num_lanes,
                                     lead_parts=self.lead_parts)

  def Restore(self, sess, path):
    """Initializes the graph's variables, then restores the copy model's."""
    sess.run(tf.global_variables_initializer())
    self._saver.restore(sess, path)

  def Copies(self):
    """[batch, max_decode_len]: what a perfect copy decodes (0 after </s>)."""
    labels = self.test['tgt_labels'][:, :self.max_decode_len]
    return np.pad(labels, [(0, 0), (0, self.max_decode_len - labels.shape[1])])


def Traced(sess, fetch):
  """(value, RunMetadata) of a traced run with its partition graphs."""
  md = tf.compat.v1.RunMetadata()
  value = sess.run(fetch, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
      output_partition_graphs=True), run_metadata=md)
  return value, md


def AssertSameDecodes(test, got, want, what):
  """Token for token the same ids; scores equal up to float rounding."""
  test.assertAllEqual(want[0], got[0], msg=what)
  test.assertAllClose(want[1], got[1], rtol=1e-5, atol=1e-5, msg=what)


# The unpipelined decoder's decodes of a test batch, once per process:
# {(checkpoint, max_decode_len, lengths): {beam size: (ids, scores)}}.
_REFERENCES = {}


def AssertDecodesMatch(test, checkpoint, devices, lanes=(1, 2, 4),
                       target='', config=None, cut=None,
                       max_decode_len=LEN + 1, lengths=None,
                       compile_mode=None, traced=None, more=None):
  """Pipelined decodes in `lanes` equal the unpipelined one, greedy and beam.

  Every decoder is built in one graph and decoded in one run. A test that
  also inspects one of them (its trace, its partitioned graph) names it in
  `traced`: it is decoded again alone in the same session, traced, instead
  of in a graph of its own (a graph's decoders cost most of a test's time
  to build).

  The unpipelined decoder (the task's GreedyDecode and BeamSearchDecode)
  runs the layers' own ops, not the pipeline's stage functions: its decodes
  of a batch are the same whatever the cut, the devices or the compile
  mode. The first call of a process for a batch and number of steps decodes
  them in its graph; later calls compare with those values instead of
  building the unpipelined decoder again.

  Args:
    test: the TestCase.
    checkpoint: the copy model's weights (TrainedCheckpoint).
    devices: the stage devices (K of them).
    lanes: the M values to decode with.
    target: the session target ('' in process).
    config: the session ConfigProto (default CONFIG in process).
    cut: a ``decode_cut.Cut`` instead of a uniform cut on `devices`.
    max_decode_len: decoding steps.
    lengths: the test sources' lengths (``CopyBatch``), or None for LEN.
    compile_mode: the pipeline's ``compile`` (e.g. 'xla').
    traced: None, or an (M, beam size) of `lanes` whose pipelined decoder
      then runs alone, traced with its partition graphs: ``graph.traces[M,
      beam]`` is ((ids, scores), RunMetadata), ``graph.fetches[M, beam]`` its
      tensors. It is built first: a later decoder's encoder tasks are named
      in suffixed scopes (``stage0_F0_1``), which a trace does not read as
      tasks (``pipeline_tasks.ParseOpName``).
    more: None, or function(DecodeGraph) -> {key: fetches}: more to build in
      the graph (in eval mode, after the decoders) and run with them; their
      values are returned under their keys (not compared).

  Returns:
    (the DecodeGraph, {('ref' or M, beam size): (ids, scores)} and `more`'s
    values).
  """
  graph = DecodeGraph(devices, cut=cut, max_decode_len=max_decode_len,
                      lengths=lengths, compile_mode=compile_mode)
  reference_key = (checkpoint, max_decode_len,
                   None if lengths is None else tuple(lengths))
  reference = _REFERENCES.get(reference_key)
  keys = [(m, beam) for beam in (1, BEAM) for m in tuple(lanes)]
  if traced is not None:
    if traced not in keys:
      raise ValueError('traced=%r: not one of the pipelined decoders %s' %
                       (traced, keys))
    keys.remove(traced)
    keys.insert(0, traced)
  if reference is None:
    keys += [('ref', beam) for beam in (1, BEAM)]
  with graph.graph.as_default():
    fetches = {}
    for m, beam in keys:
      fetches[m, beam] = (graph.Unpipelined(beam) if m == 'ref' else
                          graph.Pipelined(m, beam))
    graph.fetches = dict(fetches)
    if more is not None:
      with cluster_factory.SetEval(True):
        fetches.update(more(graph))
    with tf.compat.v1.Session(
        target, config=config or (None if target else CONFIG)) as sess:
      graph.Restore(sess, checkpoint)
      values = sess.run(fetches)
      if traced is not None:
        graph.traces[traced] = Traced(sess, fetches[traced])
  if reference is None:
    reference = {beam: values['ref', beam] for beam in (1, BEAM)}
    _REFERENCES[reference_key] = reference
  for beam in (1, BEAM):
    values['ref', beam] = reference[beam]
  # A trained model, not a degenerate one: it copies its source.
  greedy = values['ref', 1][0]
  test.assertGreaterEqual(
      np.mean(np.all(greedy == graph.Copies(), axis=1)), 0.75)
  for (m, beam) in keys:
    AssertSameDecodes(test, values[m, beam], values['ref', beam],
                      '%d stages, M=%s, beam %d' % (len(devices), m, beam))
  return graph, values
