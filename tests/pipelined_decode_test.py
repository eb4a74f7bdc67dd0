"""Pipelined decoding equals the unpipelined decoder, token for token.

A small Transformer trained with K=2 stages (``decode_testlib``) decodes
with K = 1, 2 and 4 stages on virtual CPUs in lanes, greedily and with beam
search, and gives the unpipelined decoder's tokens: K = 1 and 4 in M = 1 and
2 lanes, K = 2 in M = 2 and 4 (with early stopping), also with the decode
cut (``decode_cut``: the encoder and the decoder each spread over the
devices, checked in the trace; M = 1 and 2, and M = 2 and 4 with a decoder
layer split between the devices), and with early stopping: padded sources
whose copies end at different steps within and across lanes. Also: each
stage's key/value caches and its sources' keys and values stay on its device
through the decoding loop (the partitioned graph), a lane whose sequences all
ended stops computing, and bad inputs are refused.
pipelined_decode_workers_test decodes K = 2 in M = 1 and 2 and K = 4 in
M = 4 on worker processes: the same graphs on other devices.

Building a graph's decoders costs most of a test's time, so a test builds
one graph: a trace or a partitioned graph is of one of the decoders it
compares (``decode_testlib.AssertDecodesMatch``'s `traced`), run again
alone, and the unpipelined decoder decodes a batch once per process.
"""

import collections
import itertools
import re

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import numpy as np
from gpipe.schedules import pipeline_tasks
from gpipe.measure import timeline
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks.mt import decode_cut
from tasks.mt import pipelined_decode
from tasks.mt import stack
from tasks.mt import vocab
from tests import decode_testlib as dt
from tests import graph_rewrites

graph_rewrites.Off()

LANES = (1, 2, 4)
# Source lengths of the early-stopping batch (dt.BATCH = 8 examples): the
# copies of the first four end at step 2 (a token, then </s>), the others at
# steps 3 to 6. In 2 lanes the first lane is done long before the second,
# whose examples end at different steps; in 4 lanes two lanes are done at
# step 2 and two later, each with examples ending at different steps.
EARLY_LENGTHS = [1, 1, 1, 1, 5, 2, 4, 3]
# The nodes that pass a loop variable on unchanged once the runtime lowered
# the While op: into and out of the decoding loop and from step to step
# (Enter, Merge, Switch, NextIteration, Exit), and inside its body (Identity;
# Switch and Merge of a done lane's tf.cond).
_PASS_NODES = ('Enter', 'Merge', 'Switch', 'NextIteration', 'Exit',
               'Identity')
_Cpus = graph_rewrites.CpuDevices


def _Cpu(device):
  """'CPU:3' of a full or short device string."""
  spec = tf.DeviceSpec.from_string(device)
  return '%s:%d' % (spec.device_type, spec.device_index)


def _LoopVariableNodes(nodes, consumers, switch):
  """The nodes carrying one variable of a lowered while loop, and its edges.

  From the variable's loop Switch, follows data edges both ways through
  ``_PASS_NODES`` (a Switch only by its data input, not its predicate): the
  Enter of the initial value, the Merge of it and of the NextIteration, the
  Switch, the Exit, and in the body the Identity, Switch and Merge nodes of a
  tf.cond that pass the variable through.

  Args:
    nodes: {name: NodeDef} of every partition graph.
    consumers: {name: [(consumer name, input index)]} over those graphs.
    switch: the name of the variable's loop Switch.

  Returns:
    (the names of the carrying nodes, the names of the nodes outside them
    that feed them or read them: where the value comes from and goes to).
  """
  carrying, edges, todo = set(), set(), [switch]
  while todo:
    name = todo.pop()
    if name in carrying:
      continue
    carrying.add(name)
    node = nodes[name]
    inputs = [x for x in node.input if not x.startswith('^')]
    if node.op == 'Switch':
      inputs = inputs[:1]
    for x in inputs:
      producer = x.split(':')[0]
      if nodes[producer].op in _PASS_NODES:
        todo.append(producer)
      else:
        edges.add(producer)
    for reader, index in consumers[name]:
      if nodes[reader].op in _PASS_NODES and not (
          nodes[reader].op == 'Switch' and index > 0):
        todo.append(reader)
      else:
        edges.add(reader)
  return carrying, edges


def _DecodingLoop(fetch):
  """The While op of the decoding loop whose outputs `fetch` reads."""
  loops, seen = [], set()
  todo = [t.op for t in tf.nest.flatten(fetch)]
  while todo:
    op = todo.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type in ('While', 'StatelessWhile'):
      loops.append(op)
    todo.extend(x.op for x in op.inputs)
    todo.extend(op.control_inputs)
  return loops


def _StepsUntilDone(ids):
  """Per row, the steps a decode needs: up to and including its </s>."""
  ends = []
  for row in ids:
    eos = np.where(row == vocab.EOS_ID)[0]
    ends.append(eos[0] + 1 if len(eos) else len(row))
  return np.array(ends)


class PipelinedDecodeTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checkpoint = dt.TrainedCheckpoint()

  def _AssertDecodesMatch(self, devices, lanes=LANES, cut=None,
                          traced=None):
    return dt.AssertDecodesMatch(self, self.checkpoint, devices, lanes,
                                 cut=cut, traced=traced)[0]

  def testOneStage(self):
    # M = 1, 2 and 4: the only test of several lanes chained on a device
    # that holds every stage.
    self._AssertDecodesMatch(_Cpus(1))

  # Two uniform stages: testEarlyStoppingDecodesMatchTwoStages... (M = 2, 4),
  # and M = 1 and 2 on worker processes (pipelined_decode_workers_test).

  def testFourStagesOneOfThemEncoderOnly(self):
    # 8 layers cut uniformly: [emb, enc0] [enc1, enc2] [dec0, dec1]
    # [dec2, softmax]: stage 1 has no decoding work and is left out of the
    # decoding loop. M = 4 (a lane per stage): the same graph on 4 worker
    # processes (pipelined_decode_workers_test.testFourStages).
    graph = self._AssertDecodesMatch(_Cpus(4), lanes=(1, 2),
                                     traced=(2, dt.BEAM))
    # Its caches stay on their stages' devices: the decoder layers are on
    # stages 2 and 3, two and one, each with its keys and values (2 tensors)
    # of its cache and of the source, per lane.
    where = self._AssertStateStaysOnItsDevice(graph, (2, dt.BEAM))
    self.assertEqual(where, {('CPU:2', 'cache'): 8, ('CPU:2', 'source'): 8,
                             ('CPU:3', 'cache'): 4, ('CPU:3', 'source'): 4})

  def testDecodeCutSplitsTheEncoderAndTheDecoderOverTheDevices(self):
    cut = decode_cut.DecodeCut(dt.Layers(), _Cpus(2))
    # [emb, enc0, enc1] [enc2] [dec0, dec1] [dec2, softmax] on a loop of the
    # two devices (the encoder by weights, the decoder by step weights).
    self.assertEqual(cut.stage_devices, _Cpus(2) * 2)
    self.assertEqual(cut.stage_sizes, [3, 1, 2, 2])
    # Several stages per device: 4 stages looped over 2 devices, which the
    # decoder sees as a uniform cut of 4 stages on [CPU:0, CPU:1] * 2
    # ([2, 2, 2, 2]) would be: an encoder stage per device, the embedding's
    # stage and the first decoder stage joined on CPU:0 (the trace below),
    # the last on CPU:1. M = 1 and 2 lanes, the greedy M = 2 traced; M = 4
    # with a decode cut: testDecodeCutSplitsALayerBetweenTwoDevices.
    graph = self._AssertDecodesMatch(_Cpus(2), lanes=(1, 2), cut=cut,
                                     traced=(2, 1))
    _, md = graph.traces[2, 1]
    tasks = timeline.ParseStepStats(md.step_stats)
    where = {(t.phase, t.stage, _Cpu(t.device)) for t in tasks}
    # The encoder runs on both devices, in 8 micro-batches (at least 4 per
    # device, decode_lanes.EncoderMicroBatches) ...
    self.assertEqual({w for w in where if w[0] == pipeline_tasks.FORWARD},
                     {(pipeline_tasks.FORWARD, 0, 'CPU:0'),
                      (pipeline_tasks.FORWARD, 1, 'CPU:1')})
    self.assertLen([t for t in tasks if t.phase == pipeline_tasks.FORWARD],
                   2 * 8)
    # ... and the loop makes one call per device and lane: the embedding's
    # stage and the first decoder stage, both on CPU:0, are one.
    self.assertEqual({w for w in where if w[0] == pipeline_tasks.DECODE},
                     {(pipeline_tasks.DECODE, 0, 'CPU:0'),
                      (pipeline_tasks.DECODE, 3, 'CPU:1')})

  def testDecodeCutBalancesTheStepCosts(self):
    layers = dt.Layers()
    # Measured: a step of each decoder layer and of the softmax, in seconds.
    costs = decode_cut.MeasuredStepCosts(layers[4:], rows=4, src_len=dt.LEN,
                                         max_len=dt.LEN + 1, repeats=2)
    self.assertLen(costs, 4)
    self.assertTrue(all(c > 0 for c in costs), costs)
    self.assertEqual(costs[0], costs[1])  # Identical layers: measured once.
    # Per step part, with beam search's pick and cache reordering.
    parts = decode_cut.MeasuredStepCosts(layers[4:], rows=6, src_len=dt.LEN,
                                         max_len=dt.LEN + 1, repeats=2,
                                         parts=True, beam_size=dt.BEAM)
    self.assertEqual([len(c) for c in parts[:3]], [3, 3, 3])
    self.assertIsInstance(parts[3], float)
    self.assertTrue(all(c > 0 for c in parts[0] + [parts[3]]), parts)
    # Given costs decide the decoder's cut, not the weights.
    for step_costs, sizes in (([1, 1, 1, 3], [3, 1]), ([3, 1, 1, 1], [1, 3])):
      cut = decode_cut.DecodeCut(layers, ['a', 'b'], step_costs)
      self.assertEqual(cut.stage_sizes[2:], sizes)
      self.assertEqual(cut.stage_sizes[:2], [3, 1])
    self.assertEqual(decode_cut.DecodeCut(layers, ['a']),
                     decode_cut.Cut([8], ['a']))
    with self.assertRaisesRegex(ValueError, 'needs at least 4 encoder'):
      decode_cut.DecodeCut(layers, _Cpus(4))
    with self.assertRaisesRegex(ValueError, 'needs at least 5 decoder'):
      decode_cut.DecodeCut(layers, _Cpus(5))
    with self.assertRaisesRegex(ValueError, 'one per layer after the '):
      decode_cut.DecodeCut(layers, _Cpus(2), [1.0])
    with self.assertRaisesRegex(ValueError, r'needs \[embedding, encoder'):
      decode_cut.DecodeCut(layers[::-1], _Cpus(2))

  def _AssertStateStaysOnItsDevice(self, graph, key):
    """The devices where the loop's caches and keys/values live.

    Every [rows, heads, length, dim] tensor of the loop (the caches and the
    cross-attention keys and values, each a variable of the lowered while
    loop) is carried on the device where it was made by every node that
    carries it (``_LoopVariableNodes``: its Enter, Merge, Switch,
    NextIteration and Exit, and the tf.cond of a done lane), is made and
    updated there and is never sent or received; inside the loop only a
    decoding call's carry crosses devices: the hidden state and the beam
    indices (outputs 0 and 1), never its state.

    Args:
      graph: a DecodeGraph (max_decode_len other than dt.LEN) whose
        pipelined decoder `key` ran alone, traced (``AssertDecodesMatch``'s
        `traced`).
      key: (M, beam size) of that decoder.

    Returns:
      {(device, 'cache' or 'source'): how many of these tensors it holds}.
    """
    _, md = graph.traces[key]
    # A cache holds max_decode_len positions, a source's keys and values LEN.
    self.assertNotEqual(graph.max_decode_len, dt.LEN)
    nodes = {}
    consumers = collections.defaultdict(list)
    for partition in md.partition_graphs:
      for node in partition.node:
        nodes[node.name] = node
    for node in nodes.values():
      for index, x in enumerate(node.input):
        if not x.startswith('^'):
          consumers[x.split(':')[0]].append((node.name, index))
    sends = [n.input[0] for n in nodes.values() if n.op == '_Send']
    # What enters the loop, as built: per device, the caches (zeros) and the
    # sources' keys and values.
    where = collections.Counter()
    (loop,) = _DecodingLoop(graph.fetches[key])
    for x in loop.inputs:
      if x.shape.rank != 4:
        continue
      # [rows, heads, positions, dim]: the target's or the source's.
      self.assertIn(x.shape[2], (graph.max_decode_len, dt.LEN))
      what = 'cache' if x.shape[2] == graph.max_decode_len else 'source'
      device = _Cpu(x.op.device)
      where[device, what] += 1
      # The lowering names a variable's loop Switch after its input.
      switch = [n for n in nodes if re.fullmatch(
          r'%s/%s_switch/_\d+' % (re.escape(loop.name), re.escape(x.op.name)),
          n)]
      self.assertLen(switch, 1, x.name)
      carrying, edges = _LoopVariableNodes(nodes, consumers, switch[0])
      self.assertContainsSubset(
          ['Enter', 'Merge', 'Switch', 'NextIteration'],
          {nodes[n].op for n in carrying}, x.name)
      for name in carrying | edges:
        self.assertNotIn(nodes[name].op, ('_Send', '_Recv'),
                         '%s (%s) is carried by %s, across devices' %
                         (x.name, what, name))
        self.assertEqual(_Cpu(nodes[name].device), device,
                         '%s (%s) on %s: %s (%s) on %s' % (
                             x.name, what, device, name, nodes[name].op,
                             nodes[name].device))
    crossing = [s for s in sends if re.search(r'stage\d+_D\d+/', s)]
    self.assertNotEmpty(crossing)
    for name in crossing:
      output = int(name.split(':')[1]) if ':' in name else 0
      self.assertLess(output, 2, name)
    return where

  def testDecodeCutSplitsALayerBetweenTwoDevices(self):
    layers = dt.Layers()
    # Per step part costs (self-attention, cross-attention, feed-forward):
    # whole layers cut 2 | 1 + softmax (10 | 6), parts 1 layer + layer 1's
    # self-attention | the rest of layer 1, layer 2, softmax (8 | 8).
    cut = decode_cut.DecodeCut(layers, _Cpus(2),
                               [[3, 1, 1], [3, 1, 1], [3, 1, 1], 1])
    self.assertEqual(cut.stage_sizes, [3, 1, 1, 3])
    self.assertEqual(cut.lead_parts, [0, 0, 0, 1])
    # Whole layers when parts do not cut better.
    self.assertEqual(
        decode_cut.DecodeCut(layers, _Cpus(2),
                             [[1, 1, 1], [1, 1, 1], [1, 1, 1], 3]).lead_parts,
        [0] * 4)

    def TaskDecode(graph):
      # The task decodes with the cut's lead parts (decode_lead_parts), by
      # default in K = 2 lanes: one per device of the loop, not per stage
      # (4).
      self.assertEqual(graph.task.params.decode_lead_parts, [0, 0, 0, 1])
      self.assertEqual(pipelined_decode.NumLanes(graph.task, dt.BATCH, 1),
                       2)
      out = graph.task.DecodeWithTheta(graph.task.theta, py_utils.NestedMap(
          src_ids=graph.src_ids, src_paddings=graph.src_paddings))
      return {'task': out['hyp_ids']}

    # One graph: with this cut, the early-stopping batch decoded in 4 steps
    # (M = 2 and 4; M = 1 and 2 with the decode cut: the test above), the
    # beam search in 2 lanes traced (its partitioned graph) and the task's
    # own decode.
    graph, values = self._AssertEarlyStoppingDecodesMatch(
        4, cut=cut, traced=(2, dt.BEAM), more=TaskDecode)
    self.assertAllEqual(values['task'], values['ref', 1][0])
    # Layer 1's cache is on CPU:0 (its self-attention), its source's keys
    # and values on CPU:1 (its cross-attention); layer 0's on CPU:0, layer
    # 2's on CPU:1.
    where = self._AssertStateStaysOnItsDevice(graph, (2, dt.BEAM))
    self.assertEqual(where, {('CPU:0', 'cache'): 8, ('CPU:0', 'source'): 4,
                             ('CPU:1', 'cache'): 4, ('CPU:1', 'source'): 8})

  def testDecodeCutSplitsTwoLayersOnThreeDevices(self):
    # [emb, enc0] [enc1] [enc2] | dec0 + dec1.self_atten | dec1.cross_atten,
    # dec1.ffn, dec2.self_atten, dec2.cross_atten | dec2.ffn, softmax: the
    # third device runs only the feed-forward of its first layer.
    cut = decode_cut.DecodeCut(dt.Layers(), _Cpus(3),
                               [[1, 1, 1], [1, 1, 1], [1, 1, 1], 3])
    self.assertEqual(cut.stage_sizes, [2, 1, 1, 1, 1, 2])
    self.assertEqual(cut.lead_parts, [0, 0, 0, 0, 1, 2])
    graph = self._AssertDecodesMatch(_Cpus(3), lanes=(4,), cut=cut,
                                     traced=(4, dt.BEAM))
    # Per lane of the 4: dec0's and dec1's caches and dec0's source keys and
    # values on CPU:0, dec2's cache and dec1's and dec2's source on CPU:1
    # (keys and values: 2 tensors each); CPU:2 holds none.
    where = self._AssertStateStaysOnItsDevice(graph, (4, dt.BEAM))
    self.assertEqual(where, {('CPU:0', 'cache'): 16, ('CPU:0', 'source'): 8,
                             ('CPU:1', 'cache'): 8, ('CPU:1', 'source'): 16})

  def testPartCutIsTheBestCut(self):
    # Against every cut of the parts into groups that each end a layer.
    rng = np.random.RandomState(0)
    for _ in range(200):
      num_layers = rng.randint(2, 6)
      k = rng.randint(2, min(4, num_layers + 1) + 1)
      costs = [list(rng.randint(1, 10, size=3)) if rng.rand() < 0.8 else
               int(rng.randint(1, 10)) for _ in range(num_layers)]
      costs.append(int(rng.randint(1, 10)))
      layers, lead = decode_cut._DecoderCut(costs, k)  # pylint: disable=protected-access
      parts = [c if isinstance(c, list) else [c] for c in costs]
      self.assertEqual(sum(layers), len(costs))
      self.assertEqual(lead[0], 0)
      loads, first = [0.0] * k, 0
      for g in range(k):
        self.assertGreaterEqual(layers[g], 1)
        own = parts[first:first + layers[g]]
        self.assertLess(lead[g], len(own[0]))
        loads[g] += sum(map(sum, own)) - sum(own[0][:lead[g]])
        if g:
          loads[g - 1] += sum(own[0][:lead[g]])
        first += layers[g]
      units = [(i, j == len(p) - 1, c) for i, p in enumerate(parts)
               for j, c in enumerate(p)]
      best = float('inf')
      for cuts in itertools.combinations(range(1, len(units)), k - 1):
        bounds = (0,) + cuts + (len(units),)
        groups = [units[a:b] for a, b in zip(bounds, bounds[1:])]
        if all(any(end for _, end, _ in g) for g in groups):
          best = min(best, max(sum(c for _, _, c in g) for g in groups))
      self.assertEqual(max(loads), best, (costs, k, layers, lead))

  def testBadLeadParts(self):
    cut = decode_cut.Cut([3, 1, 1, 3], _Cpus(2) * 2, [0, 0, 0, 2])
    graph = dt.DecodeGraph(_Cpus(2), cut=cut)
    for lead, error in (([0, 0, 2], 'one count per stage'),
                        ([0, 0, 0, 3], r'lead_parts\[3\]=3: .* more than 3'),
                        ([0, 0, 1, 0], r'lead_parts\[2\]=1: .* after a stage'
                                       r' with decoder layers'),
                        ([0, 1, 0, 0], r'first layer \(EncoderLayer\)'),
                        ([0, 0, 0, 1.0], 'give whole numbers')):
      graph.lead_parts = lead
      with graph.graph.as_default(), self.assertRaisesRegex(ValueError,
                                                            error):
        graph.Pipelined(2)
    with self.assertRaisesRegex(ValueError, r'one cost per step part'):
      decode_cut.DecodeCut(dt.Layers(), _Cpus(2), [[1, 1], 1, 1, 1])
    with self.assertRaisesRegex(ValueError, 'beam_size 3 must divide'):
      decode_cut.MeasuredStepCosts(dt.Layers()[4:], rows=4, src_len=dt.LEN,
                                   max_len=dt.LEN + 1, beam_size=3)

  def _AssertEarlyStoppingDecodesMatch(self, max_decode_len, cut=None,
                                       traced=None, more=None):
    """Decodes of EARLY_LENGTHS on 2 devices equal the unpipelined ones.

    Padded sources whose copies end at different steps within and across
    lanes (EARLY_LENGTHS), greedy and beam, in 2 and 4 lanes: the done
    lanes stop while the others go on, with the unpipelined decoder's
    tokens and scores. With 8 steps every lane is done before the last;
    with 4 the longer copies have no </s> yet (their lanes are never done).

    Args:
      max_decode_len: 8 or 4 decoding steps.
      cut: a ``decode_cut.Cut`` on _Cpus(2), or None for 2 uniform stages.
      traced, more: as for ``dt.AssertDecodesMatch``.

    Returns:
      ``dt.AssertDecodesMatch``'s (graph, values).
    """
    graph, values = dt.AssertDecodesMatch(
        self, self.checkpoint, _Cpus(2), lanes=(2, 4), cut=cut,
        max_decode_len=max_decode_len, lengths=EARLY_LENGTHS, traced=traced,
        more=more)
    # The batch is what it is meant to be: the copies end at different
    # steps, and the first lane of 2 is done long before the second.
    self.assertAllEqual(graph.test['src_paddings'].sum(axis=1),
                        [dt.LEN - n for n in EARLY_LENGTHS])
    for beam in (1, dt.BEAM):
      ids = values['ref', beam][0]
      ends = _StepsUntilDone(ids)
      self.assertLessEqual(ends[:4].max(), 3, beam)
      self.assertGreaterEqual(ends[4:].max(), min(5, max_decode_len), beam)
      self.assertGreaterEqual(len(set(ends[4:])), 2, beam)
      if max_decode_len == 8:
        self.assertLess(ends.max(), max_decode_len, beam)
      else:
        self.assertTrue(np.any(np.all(ids != vocab.EOS_ID, axis=1)), beam)
    return graph, values

  def testEarlyStoppingDecodesMatchTwoStagesEveryLaneEndsBeforeTheLastStep(
      self):
    # Two uniform stages, 8 steps; the greedy decode in 2 lanes runs again,
    # traced: a done lane stops computing. (4 steps, the longer copies cut
    # at the last step, on a layer split over the two devices:
    # testDecodeCutSplitsALayerBetweenTwoDevices.)
    graph, _ = self._AssertEarlyStoppingDecodesMatch(8, traced=(2, 1))
    self._AssertADoneLaneStopsComputing(graph.traces[2, 1], 8)

  def _AssertADoneLaneStopsComputing(self, trace, max_decode_len):
    """A done lane's steps run nothing: its last stage picks no more tokens.

    Args:
      trace: ((ids, scores), RunMetadata) of the greedy decode of
        EARLY_LENGTHS in 2 lanes on 2 stages, run alone.
      max_decode_len: its steps; the trained model ends its copies with
        </s> at steps 2 to 6, before the last.
    """
    (values, _), md = trace
    # Each lane's last stage picks tokens only until its sequences ended,
    # and the lane done first stops first.
    ends = _StepsUntilDone(values)
    self.assertLess(ends.max(), max_decode_len)
    lane_ends = [ends[m * 4:(m + 1) * 4].max() for m in range(2)]
    self.assertLessEqual(lane_ends[0] + 3, lane_ends[1])
    argmaxes = sum(1 for dev in md.step_stats.dev_stats
                   for node in dev.node_stats
                   if node.timeline_label.split(' = ')[-1].startswith(
                       'ArgMax('))
    self.assertEqual(argmaxes, sum(lane_ends))
    # A done lane's steps run no stage call at all: the trace holds the
    # decoding tasks of the steps each lane needed, at both stages.
    tasks = [t for t in timeline.ParseStepStats(md.step_stats)
             if t.phase == pipeline_tasks.DECODE]
    self.assertEqual(collections.Counter((t.stage, t.micro_batch)
                                         for t in tasks),
                     {(k, m): lane_ends[m] for k in range(2)
                      for m in range(2)})

  def testBadLanesAndModelsAreRefused(self):
    graph = dt.DecodeGraph(_Cpus(2))
    with graph.graph.as_default():
      with self.assertRaisesRegex(ValueError,
                                  'decode_micro_batches=16 lanes but the '
                                  'batch has only 8 examples'):
        graph.Pipelined(16)
      with self.assertRaisesRegex(
          ValueError, r'decode_micro_batches=3 does not divide the batch of '
          r'8 examples x 3 beams: a lane holds whole examples with all their '
          r'beams; use one of 1, 2, 4, 8'):
        graph.Pipelined(3, dt.BEAM)
      with self.assertRaisesRegex(ValueError, 'a number of lanes >= 1'):
        graph.Pipelined(0)
    layers = stack.EncoderDecoderLayers(vocab_size=dt.VOCAB, model_dim=8,
                                        hidden_dim=8, num_heads=2,
                                        num_layers=1)
    no_decoder = [l for l in layers if 'dec_' not in l.name]
    decoder_only = stack.DecoderOnlyLayers(vocab_size=dt.VOCAB, model_dim=8,
                                           hidden_dim=8, num_heads=2,
                                           num_layers=2)
    for layer_list, message in ((no_decoder, 'no DecoderLayer'),
                                (decoder_only, 'no encoder')):
      with tf.Graph().as_default(), cluster_factory.SetEval(True):
        task = dt.TaskParams(_Cpus(2), layers=layer_list).Instantiate()
        with self.assertRaisesRegex(ValueError, message):
          pipelined_decode.Decode(task, task.theta,
                                  tf.zeros([4, 3], tf.int32),
                                  tf.zeros([4, 3]))


if __name__ == '__main__':
  tf.test.main()
