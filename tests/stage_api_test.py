"""The public stage API: a toy autoregressive model decodes through gpipe.lanes.

The model is not a Transformer: a dense source encoder, a token embedding,
dense step layers that each keep a running sum of their inputs (the state a
decoder keeps per layer, as a Transformer's key/value cache) and read the
encoded source (as cross-attention does), and a readout that picks the next
token. It decodes pipelined with public names only: its pipeline's
``Stages()`` and ``gpipe.lanes`` (``Encode``, ``LoopStages``, ``NumLanes``,
``Decode``), and gives the tokens of its unpipelined loop.

Also: ``tasks/mt/pipelined_decode.py`` reaches no private name of gpipe.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import ast
import os

from absl.testing import parameterized
from gpipe import lanes
from gpipe import lingvo_adapter
from gpipe import pipeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import gpipe as lingvo_gpipe
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites

graph_rewrites.Off()

CONFIG = graph_rewrites.CpuConfig(2)
BATCH, DIM, VOCAB, STEPS = 8, 6, 11, 7
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _Weight(layer, name, shape, seed):
  p = layer.params
  layer.CreateVariable(name, py_utils.WeightParams(
      shape, py_utils.WeightInit.Gaussian(1.0, seed=seed), p.dtype))


class _SourceEncoder(base_layer.BaseLayer):
  """The source [B, D] -> its encoding tanh(src W), once per batch."""

  def __init__(self, params):
    super().__init__(params)
    _Weight(self, 'w', [DIM, DIM], 1)

  def FProp(self, theta, src):
    return tf.tanh(tf.matmul(src, theta.w))


class _TokenEmbedding(base_layer.BaseLayer):
  """A step's tokens [B] -> their embeddings [B, D]."""

  def __init__(self, params):
    super().__init__(params)
    _Weight(self, 'emb', [VOCAB, DIM], 2)

  def Embed(self, theta, ids):
    return tf.gather(theta.emb, ids)


class _SummingDense(base_layer.BaseLayer):
  """One step: h' = tanh(h W + ctx U + sum V), sum the inputs so far."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('seed', 3, 'Init seed of the weights.')
    return p

  def __init__(self, params):
    super().__init__(params)
    for i, name in enumerate(('w', 'u', 'v')):
      _Weight(self, name, [DIM, DIM], self.params.seed + 10 * i)

  def Step(self, theta, h, total, ctx):
    """(h', total + h) for input h, running sum `total`, encoded source."""
    total += h
    out = tf.tanh(tf.matmul(h, theta.w) + tf.matmul(ctx, theta.u) +
                  tf.matmul(total, theta.v))
    return out, total


class _Readout(base_layer.BaseLayer):
  """h [B, D] -> the next tokens [B], argmax of h W."""

  def __init__(self, params):
    super().__init__(params)
    _Weight(self, 'w', [DIM, VOCAB], 4)

  def Pick(self, theta, h):
    return tf.argmax(tf.matmul(h, theta.w), axis=-1, output_type=tf.int32)


def _LayerParams():
  layers = [
      _SourceEncoder.Params().Set(name='encoder'),
      _TokenEmbedding.Params().Set(name='embedding'),
      _SummingDense.Params().Set(name='dense0', seed=5),
      _SummingDense.Params().Set(name='dense1', seed=7),
      _SummingDense.Params().Set(name='dense2', seed=9),
      _Readout.Params().Set(name='readout'),
  ]
  return [lp.Set(dtype=tf.float64) for lp in layers]


def _Net(stage_sizes, devices):
  return pipeline.PipeliningLayer.Params().Set(
      name='toy', layers=_LayerParams(), num_stages=len(stage_sizes),
      stage_sizes=stage_sizes, stage_devices=devices, num_micro_batches=1,
      dtype=tf.float64).Instantiate()


def _IsStepLayer(layer):
  return not isinstance(layer, _SourceEncoder)


def _Of(stage, cls):
  """[(key, layer)] of the stage's layers of class `cls`."""
  return [(k, l) for k, l in stage.Items() if isinstance(l, cls)]


def _Step(stage):
  """The step of a loop stage (gpipe.lanes.LaneStage.step), from its layers.

  The carry is the tokens into the stage holding the embedding, the hidden
  state after it; the state, each dense layer's running sum and, at the
  readout, the tokens so far [rows, STEPS].
  """
  embedding, readout = _Of(stage, _TokenEmbedding), _Of(stage, _Readout)

  def Step(theta, t, carry, state, ctx):
    if embedding:
      (key, layer), = embedding
      h = layer.Embed(theta[key], carry.ids)
    else:
      h = carry.h
    totals = []
    for (key, layer), total in zip(_Of(stage, _SummingDense), state.totals):
      h, total = layer.Step(theta[key], h, total, ctx)
      totals.append(total)
    new_state = py_utils.NestedMap(totals=totals)
    if not readout:
      return py_utils.NestedMap(h=h), new_state
    (key, layer), = readout
    ids = layer.Pick(theta[key], h)
    new_state.tokens = state.tokens + ids[:, None] * tf.one_hot(
        t, STEPS, dtype=tf.int32)[None, :]
    return py_utils.NestedMap(ids=ids), new_state

  return Step


def PipelinedTokens(net, src, num_lanes=None):
  """[BATCH, STEPS] tokens decoded through the net's stages in lanes."""
  stages = net.Stages()
  loop = lanes.LoopStages([s.Only(_IsStepLayer) for s in stages],
                          has_step=lambda s: bool(s.layers))
  m = lanes.NumLanes(len(loop), BATCH, num_lanes)
  rows = BATCH // m
  contexts = lanes.Encode(
      [s.Only(lambda l: not _IsStepLayer(l)) for s in stages], net.theta,
      src, m, outputs_fn=lambda out: out[0])
  lane_stages, states, constants = [], [], []
  for s in loop:
    with tf.device(s.device):
      state = py_utils.NestedMap(totals=[
          tf.zeros([rows, DIM], tf.float64)
          for _ in _Of(s, _SummingDense)])
      if _Of(s, _Readout):
        state.tokens = tf.zeros([rows, STEPS], tf.int32)
      states.append([state.Transform(tf.identity) for _ in range(m)])
      constants.append([tf.identity(ctx) for ctx in contexts])
    lane_stages.append(lanes.LaneStage(
        stage=s.index, device=s.device, theta=s.Theta(net.theta),
        step=_Step(s)))
  with tf.device(loop[-1].device):
    feedback = [py_utils.NestedMap(ids=tf.zeros([rows], tf.int32))
                for _ in range(m)]
  _, states = lanes.Decode(lane_stages, feedback, states, constants, STEPS)
  with tf.device(loop[-1].device):
    return tf.concat([state.tokens for state in states[-1]], axis=0), loop


def UnpipelinedTokens(net, src):
  """[BATCH, STEPS] tokens of the same model's plain loop, one device."""
  # {layer name: (the layer, its theta)}.
  layers = {layer.params.name: (layer, net.theta[key])
            for s in net.Stages() for key, layer in s.Items()}

  def Run(name, method, *args):
    layer, theta = layers[name]
    return getattr(layer, method)(theta, *args)

  ctx = Run('encoder', 'FProp', src)
  ids = tf.zeros([BATCH], tf.int32)
  totals = [tf.zeros([BATCH, DIM], tf.float64) for _ in range(3)]
  tokens = []
  for _ in range(STEPS):
    h = Run('embedding', 'Embed', ids)
    for i in range(3):
      h, totals[i] = Run('dense%d' % i, 'Step', h, totals[i], ctx)
    ids = Run('readout', 'Pick', h)
    tokens.append(ids)
  return tf.stack(tokens, axis=1)


class StageApiTest(test_utils.TestCase, parameterized.TestCase):

  def testStagesNameTheCut(self):
    devices = graph_rewrites.CpuDevices(2)
    with tf.Graph().as_default():
      net = _Net([2, 1, 3], [devices[0], devices[0], devices[1]])
      stages = net.Stages()
      self.assertEqual([0, 1, 2], [s.index for s in stages])
      self.assertEqual([devices[0], devices[0], devices[1]],
                       [s.device for s in stages])
      names = [[layer.params.name for layer in s.layers] for s in stages]
      self.assertEqual([['encoder', 'embedding'], ['dense0'],
                        ['dense1', 'dense2', 'readout']], names)
      # Each stage's theta is its layers' share of the pipeline's.
      theta = stages[2].Theta(net.theta)
      self.assertCountEqual(stages[2].keys, theta.keys())
      for key in stages[2].keys:
        self.assertIs(net.theta[key].w, theta[key].w)
      # Variables live on their stage's device.
      for s in stages:
        for layer in s.layers:
          for var in layer.vars.Flatten():
            self.assertEqual(s.device, var.device)
      steps = [s.Only(_IsStepLayer) for s in stages]
      self.assertEqual(['dense1', 'dense2', 'readout'],
                       [l.params.name for l in steps[2].layers])
      self.assertEqual(['embedding'], [l.params.name for l in steps[0].layers])
      # The loop: stages 0 and 1 share a device, so they are one stage.
      loop = lanes.LoopStages(steps, has_step=lambda s: bool(s.layers))
      self.assertEqual([(0, devices[0]), (2, devices[1])],
                       [(s.index, s.device) for s in loop])
      self.assertEqual(['embedding', 'dense0'],
                       [l.params.name for l in loop[0].layers])

  def testLingvosGPipeLayersNameTheirStagesToo(self):
    # FromLingvo: one cell per stage, on the cluster's devices.
    cells = [_SourceEncoder.Params().Set(name='cell%d' % k, dtype=tf.float64)
             for k in range(2)]
    p = lingvo_adapter.FromLingvo(lingvo_gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=cells, num_micro_batches=2, dtype=tf.float64))
    with tf.Graph().as_default(), cluster_factory.ForTestingWorker(
        cpus=2, split_size=2):
      net = p.Instantiate()
      stages = net.Stages()
      self.assertEqual(net.stage_devices, [s.device for s in stages])
      self.assertEqual([['cell0'], ['cell1']], [s.keys for s in stages])
      self.assertIs(net.theta.cell1.w, stages[1].Theta(net.theta).cell1.w)

  def testLaneCounts(self):
    self.assertEqual([1, 2, 3, 6], lanes.LaneCounts(6))
    self.assertEqual(2, lanes.NumLanes(2, 8))
    self.assertEqual(3, lanes.NumLanes(4, 9))  # The largest divisor <= 4.
    self.assertEqual(1, lanes.NumLanes(1, 8))
    self.assertEqual(4, lanes.NumLanes(2, 8, 4))
    with self.assertRaisesRegex(
        ValueError, r'toy: lanes=3 does not divide the batch of 8 examples '
        r'x 2 beams: a lane holds whole examples with all their beams; use '
        r'one of 1, 2, 4, 8'):
      lanes.NumLanes(2, 8, 3, beam_size=2, what='toy: lanes')
    with self.assertRaisesRegex(ValueError, 'lanes=9 lanes but the batch'):
      lanes.NumLanes(2, 8, 9)
    with self.assertRaisesRegex(ValueError, 'a number of lanes >= 1'):
      lanes.NumLanes(2, 8, 0)

  @parameterized.named_parameters(
      # The encoder alone on the first stage (it sits out of the loop).
      ('EncoderStageOnTwoDevices', [1, 2, 3], (0, 0, 1), None, 2),
      # Stages 0 and 1 on one device: one stage of the loop; 4 lanes.
      ('SharedDevice', [2, 1, 3], (0, 0, 1), 4, 2),
      # Stages alternating between the devices: three in the loop.
      ('Interleaved', [1, 1, 2, 2], (0, 1, 0, 1), 2, 3),
      ('OneStage', [6], (0,), None, 1),
  )
  def testPipelinedTokensEqualTheUnpipelinedLoop(self, stage_sizes, where,
                                                 num_lanes, loop_stages):
    devices = graph_rewrites.CpuDevices(2)
    src = np.random.RandomState(0).randn(BATCH, DIM)
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = _Net(stage_sizes, [devices[d] for d in where])
      got, loop = PipelinedTokens(net, tf.constant(src), num_lanes)
      want = UnpipelinedTokens(net, tf.constant(src))
      self.assertLen(loop, loop_stages)
      sess.run(tf.global_variables_initializer())
      got, want = sess.run([got, want])
    self.assertAllEqual(want, got)
    # Tokens that depend on the example and the step: a real decode.
    self.assertGreater(len(np.unique(want)), 2)
    self.assertGreater(len({tuple(row) for row in want}), 1)


class PipelinedDecodeUsesThePublicApiTest(test_utils.TestCase):

  def testNoPrivateGpipeName(self):
    path = os.path.join(_ROOT, 'tasks', 'mt', 'pipelined_decode.py')
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    gpipe_names, found = set(), []
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module.startswith('gpipe'):
        for alias in node.names:
          gpipe_names.add(alias.asname or alias.name)
          if alias.name.startswith('_') or node.module.split('.')[-1] in (
              'stage', 'replicas') or alias.name in ('stage', 'replicas'):
            found.append('from %s import %s' % (node.module, alias.name))
      elif isinstance(node, ast.Import):
        for alias in node.names:
          if alias.name.startswith('gpipe'):
            found.append('import %s' % alias.name)
    private = ('StageFunctions', 'NestedTheta', 'ReadTheta', 'Canonical')
    for node in ast.walk(tree):
      if not isinstance(node, ast.Attribute):
        continue
      # A leading underscore reached on anything (a gpipe module, the
      # pipelining layer), or a private piece of a gpipe module.
      if (node.attr.startswith('_') and not node.attr.startswith('__') or
          node.attr in private):
        found.append('%s (line %d)' % (ast.unparse(node), node.lineno))
    self.assertEqual([], found)
    self.assertIn('lanes', gpipe_names)


if __name__ == '__main__':
  tf.test.main()
