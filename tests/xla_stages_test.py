"""XLA-compiled stages (PipeliningLayer's compile='xla', gpipe/xla.py).

Every stage function runs as one XLA computation and the pipeline's loss
and gradients equal the uncompiled pipeline's (float64, with dropout: the
masks of gpipe.randomness are the same compiled or not), under every schedule
of the registry, every remat mode, replicas, batched weight gradients and
bfloat16; pipelined decoding gives the unpipelined decoder's tokens. An op
XLA cannot compile is refused when the graph is built, naming the layer and
the op, or left uncompiled with 'xla_where_possible'. Evidence that XLA ran:
a traced step executes none of the compiled functions' ops, and with the
build-time check bypassed, the uncompilable op fails the run on XLA_CPU_JIT.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from unittest import mock

from absl.testing import parameterized
from gpipe import pipeline
from gpipe import precision
from gpipe import randomness
from gpipe import stage
from gpipe import xla
from gpipe.schedules import registry
import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import hyperparams
from lingvo.core import test_utils
from tasks.mt import pipelined_decode
from tasks.mt import stack
from tasks.mt import vocab
from tests import decode_testlib
from tests import graph_rewrites
from tests import schedule_testlib as lib
from tests import toy_layers
from tools.trainer import model_select

graph_rewrites.Off()
graph_rewrites.XlaWithoutLlvmOptimizations()

K, M = 2, 4


class Stringify(base_layer.BaseLayer):
  """Adds 0 * the length of its input's decimal text: a string op inside."""

  def FProp(self, theta, x):
    text = tf.strings.as_string(x)
    return x + 0.0 * tf.cast(tf.strings.length(text), x.dtype)


class StringifiedGradient(base_layer.BaseLayer):
  """The identity, whose gradient has a string op inside."""

  def FProp(self, theta, x):

    @tf.custom_gradient
    def Identity(x):

      def Grad(dy):
        text = tf.strings.as_string(dy)
        return dy + 0.0 * tf.cast(tf.strings.length(text), dy.dtype)

      return tf.identity(x), Grad

    return Identity(x)


def _Inputs(dtype=tf.float64):
  rng = np.random.RandomState(3)
  return (tf.constant(rng.randn(8, 8), dtype),), tf.constant(rng.randn(8, 8),
                                                             dtype)


def _StageCalls(graph):
  return list(lib.CallOps(graph).values())


def _Run(fetches, trace=False):
  """Runs `fetches` in a fresh session of 4 CPUs; (values, run metadata)."""
  with tf.Session(config=lib.CONFIG) as sess:
    sess.run(tf.global_variables_initializer())
    metadata = tf.RunMetadata()
    options = tf.RunOptions(
        trace_level=tf.RunOptions.FULL_TRACE if trace else
        tf.RunOptions.NO_TRACE)
    return sess.run(fetches, options=options,
                    run_metadata=metadata), metadata


class XlaStagesTest(test_utils.TestCase, parameterized.TestCase):

  def _AssertCompiledAndExact(self, schedule, remat='always', m=M, **kwargs):
    """XLA's loss and gradients equal the uncompiled (unpipelined) ones.

    With dropout (keep 0.8 in every layer): the unpipelined reference draws
    its masks uncompiled, so equality needs the same masks under XLA. The
    reference does not depend on the schedule, remat or the weight
    gradients' batching, only on the micro-batches of the batch (R x M
    with R replicas of M each): the first case computes it, the others
    compare with its values (lib.CachedReference; the layers' seeded inits
    make the same initial values).

    Args:
      schedule: the schedule's name.
      remat: the pipeline's remat.
      m: micro-batches (of each replica).
      **kwargs: more params of the pipeline.
    """
    with tf.Graph().as_default() as graph:
      net = lib.Net(schedule, K, m, remat, layers=lib.Layers(keep_prob=0.8),
                    compile='xla', **kwargs)
      inputs, targets = _Inputs()
      loss, grads = lib.LossAndGrads(net, inputs, targets, pipelined=True)
      key = ('keep 0.8', net.num_replicas * m)
      cache, refs = lib.CachedReference(self, key)
      if refs is None:
        ref_loss, ref_grads = lib.LossAndGrads(net, inputs, targets,
                                               pipelined=False)
      calls = _StageCalls(graph)
      self.assertNotEmpty(calls)
      for op in calls:
        self.assertTrue(xla.IsCompiled(op), op.name)
      if refs is None:
        (values, refs), _ = _Run([[loss] + grads, [ref_loss] + ref_grads])
        cache[key] = refs
      else:
        values, _ = _Run([loss] + grads)
    self.assertLen(values, 1 + len(lib.Trainable(net)) + 1)
    self.assertLen(refs, len(values))
    for v, r in zip(values, refs):
      self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)

  @parameterized.parameters(*registry.Names())
  def testEveryScheduleIsCompiledAndExact(self, schedule):
    self.assertTrue(lib.Allowed(schedule, K, M), schedule)
    self._AssertCompiledAndExact(schedule)

  @parameterized.parameters(('gpipe', 'never'), ('1f1b', 'except_last'),
                            ('zb_h1', 'never'))
  def testRematModes(self, schedule, remat):
    self._AssertCompiledAndExact(schedule, remat)

  def testBatchedWeightGradients(self):
    self._AssertCompiledAndExact('zb_h1', batched_weight_gradients=True)

  def testReplicas(self):
    # 2 replicas of M / 2 micro-batches: the batch's M micro-batches, whose
    # reference the other cases compare with.
    devices = graph_rewrites.CpuDevices(4)
    self._AssertCompiledAndExact(
        '1f1b', m=M // 2, stage_devices=devices[:2],
        replica_devices=[devices[:2], devices[2:]])

  def testBfloat16CloseToUncompiled(self):
    # Both compute in bfloat16 (8 significant bits); XLA rounds its own way
    # (it may keep a fused matmul's sum in float32). Tolerance: the relative
    # norm error of all gradients together <= 4%, as precision_test allows
    # between bfloat16 and float32.
    values = {}
    for mode in (None, 'xla'):
      with tf.Graph().as_default() as graph:
        layers = lib.Layers(keep_prob=1.0)
        for lp in layers:
          lp.dtype = tf.float32
        p = pipeline.PipeliningLayer.Params().Set(
            name='pipe', layers=layers, num_stages=K, num_micro_batches=M,
            stage_sizes=lib.UNEVEN_SIZES[K], schedule='zb_h1',
            stage_devices=graph_rewrites.CpuDevices(2), compile=mode,
            loss_tpl=toy_layers.SquaredErrorLoss.Params())
        precision.SetFPropDtype(p, 'bfloat16')
        net = p.Instantiate()
        inputs, targets = _Inputs(tf.float32)
        loss, grads = lib.LossAndGrads(net, inputs, targets, pipelined=True)
        matmuls = [node.attr['T'].type
                   for fn in graph.as_graph_def().library.function
                   for node in fn.node_def if node.op == 'MatMul']
        self.assertEqual({tf.bfloat16.as_datatype_enum}, set(matmuls))
        self.assertEqual(mode == 'xla', all(
            xla.IsCompiled(op) for op in _StageCalls(graph)))
        values[mode], _ = _Run([loss] + grads)
    got = np.concatenate([np.ravel(g) for g in values['xla']])
    want = np.concatenate([np.ravel(g) for g in values[None]])
    self.assertLess(np.linalg.norm(got - want) / np.linalg.norm(want), 0.04)

  def testDropoutMasksAreReproducedByTheRecomputation(self):
    # The recomputed forward (remat 'always') draws the masks the forward
    # drew: its gradients are those of TensorFlow's gradient of the
    # compiled forward itself (remat 'never').
    values = {}
    for remat in ('always', 'never'):
      with tf.Graph().as_default():
        net = lib.Net('gpipe', K, M, remat, layers=lib.Layers(keep_prob=0.8),
                      compile='xla')
        inputs, targets = _Inputs()
        loss, grads = lib.LossAndGrads(net, inputs, targets, pipelined=True)
        values[remat], _ = _Run([loss] + grads)
    for a, b in zip(values['always'], values['never']):
      self.assertAllClose(a, b, rtol=1e-10, atol=1e-12)

  def testStageOpsDoNotRunOneByOne(self):
    # A traced step lists the ops of uncompiled functions (their matmuls);
    # an XLA-compiled call runs as one computation: no matmul is listed.
    matmuls = {}
    for mode in (None, 'xla'):
      with tf.Graph().as_default():
        net = lib.Net('1f1b', K, M, 'always',
                      layers=lib.Layers(keep_prob=1.0), compile=mode)
        inputs, targets = _Inputs()
        loss, grads = lib.LossAndGrads(net, inputs, targets, pipelined=True)
        _, metadata = _Run([loss] + grads, trace=True)
        matmuls[mode] = [
            n.timeline_label for d in metadata.step_stats.dev_stats
            for n in d.node_stats if 'MatMul' in n.timeline_label]
    self.assertNotEmpty(matmuls[None])
    self.assertEqual([], matmuls['xla'])

  def _StringNet(self, mode):
    layers = lib.Layers(keep_prob=1.0)
    layers.insert(3, Stringify.Params().Set(name='stringify',
                                            dtype=tf.float64))
    net = lib.Net('zb_h1', K, M, 'always', layers=layers, compile=mode,
                  stage_sizes=[3, 4])
    inputs, targets = _Inputs()
    return net, lib.LossAndGrads(net, inputs, targets, pipelined=True)

  def testAnOpXlaCannotCompileIsRefusedNamingLayerAndOp(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          xla.UncompilableError,
          r"stage 1 \(pipe\.stringify, .*XLA_CPU_JIT.* in its forward "
          r"function: op '[^']*AsString' \(AsString, layer pipe\.stringify\).*"
          r"compile='xla_where_possible'"
      ):
        self._StringNet('xla')

  def testAnOpOnlyTheGradientHasIsRefusedWithoutRemat(self):
    # Without remat TensorFlow differentiates the compiled forward call
    # itself; its gradient's ops are checked when the stage is built, not
    # met at the first run.
    with tf.Graph().as_default():
      layers = lib.Layers(keep_prob=1.0)
      layers.insert(3, StringifiedGradient.Params().Set(
          name='stringified_grad', dtype=tf.float64))
      with self.assertRaisesRegex(
          xla.UncompilableError,
          r"stage 1 \(pipe\.stringified_grad, .* in its backward function: "
          r"op '[^']*AsString' \(AsString\)"):
        net = lib.Net('gpipe', K, M, 'never', layers=layers, compile='xla',
                      stage_sizes=[3, 4])
        inputs, targets = _Inputs()
        lib.LossAndGrads(net, inputs, targets, pipelined=True)

  def testWherePossibleLeavesTheStageWithTheOpUncompiled(self):
    with tf.Graph().as_default() as graph:
      with mock.patch.object(tf.logging, 'warning') as warning:
        net, (loss, grads) = self._StringNet('xla_where_possible')
      self.assertIn('AsString', warning.call_args[0][1])
      compiled = {}
      for task, op in lib.CallOps(graph).items():
        compiled.setdefault(task.stage, set()).add(xla.IsCompiled(op))
      self.assertEqual({0: {True}, 1: {False}}, compiled)
      (values, refs), _ = _Run([
          [loss] + grads,
          lib.LossAndGrads(net, *_Inputs(), pipelined=False)[:1]])
    self.assertAllClose(refs[0], values[0], rtol=1e-10)

  def testWithoutTheCheckTheOpFailsTheRunOnXla(self):
    # The stage calls really run on XLA's JIT device: the op XLA cannot
    # compile, let through, fails the session run there.
    with tf.Graph().as_default():
      with mock.patch.object(xla, 'Problems', return_value=[]):
        _, (loss, _) = self._StringNet('xla')
      with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                  "No registered 'AsString' OpKernel for "
                                  'XLA_CPU_JIT'):
        _Run(loss)

  def testKernelCheck(self):
    supported = xla._Supported  # pylint: disable=protected-access
    with tf.Graph().as_default():
      x = tf.constant([1.0])
      self.assertEqual((True, ''), supported(
          'XLA_CPU_JIT', 'MatMul', tf.matmul([[1.0]], [[1.0]]).op.node_def.attr))
      self.assertEqual((False, ''), supported(
          'XLA_GPU_JIT', 'AsString', tf.strings.as_string(x).op.node_def.attr))
      # A kernel exists, but not for a float64 stateless V1 draw.
      op = tf.raw_ops.StatelessRandomUniform(
          shape=[2], seed=tf.constant([1, 2], tf.int64), dtype=tf.float64).op
      ok, dtypes = supported('XLA_CPU_JIT', op.type, op.node_def.attr)
      self.assertFalse(ok)
      self.assertIn('dtype=float64', dtypes)
    self.assertEqual('XLA_GPU_JIT', xla.JitDevice('/job:w/task:1/device:GPU:0'))
    self.assertEqual('XLA_CPU_JIT', xla.JitDevice(None))
    self.assertIsNone(xla.JitDevice('/device:TPU:0'))
    rewrites = xla.SessionConfig().graph_options.rewrite_options
    self.assertEqual(rewrites.NO_MEM_OPT, rewrites.memory_optimization)

  def testOpsInNestedFunctionsAreFound(self):
    @tf.function(autograph=False)
    def Inner(x):
      return tf.strings.length(tf.strings.as_string(x))

    def Outer(x):
      y = tf.cond(x[0] > 0, lambda: tf.cast(Inner(x), x.dtype), lambda: x)
      return y + 1.0

    with tf.Graph().as_default():
      concrete = xla.Trace(Outer, [tf.TensorSpec([2], tf.float32)], True)
      found = xla.Problems(concrete, '/device:CPU:0')
    self.assertCountEqual(['AsString', 'StringLength'],
                          [u.type for u in found])
    self.assertIn("in function '__inference_Inner", found[0].Describe())

  def testTrainerXlaSetsEveryPipeline(self):
    cfg = hyperparams.Params()
    cfg.Define('encoder', pipeline.PipeliningLayer.Params(), '')
    cfg.Define('decoder', pipeline.PipeliningLayer.Params(), '')
    model_select.SetCompile(cfg, 'xla')
    self.assertEqual(('xla', 'xla'), (cfg.encoder.compile,
                                      cfg.decoder.compile))
    with self.assertRaisesRegex(ValueError, '--xla: this model has no'):
      model_select.SetCompile(hyperparams.Params(), 'xla')

  def testUnknownModeIsRefused(self):
    with self.assertRaisesRegex(ValueError, "unknown compile='jit'.*'xla'"):
      lib.Net('gpipe', K, M, 'always', compile='jit')

  def testPipelinedDecodingGivesTheUnpipelinedTokens(self):
    # The copy model untrained (random weights), one encoder and one
    # decoder layer instead of its three each (the cut is the same: the
    # embedding and the encoder in stage 0, the decoder and the softmax in
    # stage 1): greedy tokens of the compiled encoder stages and decoding
    # steps, in 2 lanes on 2 stages. The graph seed gives tokens that vary
    # by example and step and one example that ends at its first step (some
    # seeds decode one token over and over, which would not tell steps or
    # lanes apart).
    devices = graph_rewrites.CpuDevices(2)
    test = decode_testlib.CopyBatch(np.random.RandomState(5), 4)
    layers = stack.EncoderDecoderLayers(
        vocab_size=decode_testlib.VOCAB, model_dim=32, hidden_dim=64,
        num_heads=2, num_layers=1, dropout_prob=0.0, label_smoothing=0.0)
    with tf.Graph().as_default() as graph, cluster_factory.SetEval(True):
      tf.random.set_seed(3)
      p = decode_testlib.TaskParams(devices, max_decode_len=4, layers=layers)
      p.network.compile = 'xla'
      task = p.Instantiate()
      src = tf.constant(test['src_ids']), tf.constant(test['src_paddings'])
      want = task.GreedyDecode(task.theta, *src)
      got = pipelined_decode.Decode(task, task.theta, *src, num_lanes=2)
      steps = [fn for fn in graph.as_graph_def().library.function
               if fn.signature.name.startswith('__inference_stage') and
               '_D_' in fn.signature.name]
      self.assertNotEmpty(steps)
      for fn in steps:
        self.assertTrue(fn.attr[xla.MUST_COMPILE_ATTR].b, fn.signature.name)
      (got, want), _ = _Run([got, want])
    # The seed's decodes tell steps and lanes apart: more than two tokens,
    # no two examples alike, and an example that ends at its first step.
    ids = np.asarray(want[0])
    self.assertGreater(len(np.unique(ids)), 2, ids)
    self.assertLen({tuple(row) for row in ids.tolist()}, len(ids), ids)
    self.assertIn(vocab.EOS_ID, ids[:, 0], ids)
    decode_testlib.AssertSameDecodes(self, got, want, 'XLA, 2 lanes')


def _Compiled(fn, seed):
  """fn(seed) as an XLA-compiled call that the session does not inline."""
  concrete = xla.Trace(fn, [tf.TensorSpec([2], tf.int64)], True, 'draw',
                       stage.NO_INLINE)
  return concrete(seed)


class CompiledRandomnessTest(test_utils.TestCase, parameterized.TestCase):
  """gpipe.randomness draws the same numbers compiled by XLA or not."""

  @parameterized.parameters(tf.float64, tf.float32, tf.bfloat16)
  def testSameNumbersCompiledOrNot(self, dtype):
    shape = [3, 5, 7]
    with tf.Graph().as_default():
      # Fed, not a constant: the session would fold a constant's draws.
      seed = tf.placeholder(tf.int64, [2])
      plain = randomness.StatelessUniform(shape, seed, dtype)
      compiled = _Compiled(
          lambda s: randomness.StatelessUniform(shape, s, dtype), seed)
      with tf.Session(config=lib.CONFIG) as sess:
        a, b = sess.run([plain, compiled],
                        {seed: [2**40 + 12345, -987654321]})
    self.assertEqual(a.dtype, b.dtype)
    self.assertAllEqual(a, b)
    self.assertTrue(np.all(a >= 0) and np.all(a < 1))

  def testUniformAndUncorrelated(self):
    n = 1 << 16
    with tf.Graph().as_default():
      seed = tf.constant([7, 11], tf.int64)
      draws = [randomness.StatelessUniform([n], seed + delta, tf.float64)
               for delta in ([0, 0], [0, 1], [1, 0], [2**32, 0])]
      with tf.Session() as sess:
        draws = sess.run(draws)
    first = draws[0]
    # Mean 1/2 and variance 1/12 within 5 standard errors.
    self.assertLess(abs(first.mean() - 0.5), 5 * np.sqrt(1 / 12 / n))
    self.assertLess(abs(first.var() - 1 / 12), 5 * np.sqrt(1 / 180 / n))
    # Neighbouring elements, and neighbouring seeds (either word, and the
    # high 32 bits of a word), are uncorrelated.
    limit = 5 / np.sqrt(n)
    self.assertLess(abs(np.corrcoef(first[1:], first[:-1])[0, 1]), limit)
    for other in draws[1:]:
      self.assertFalse(np.array_equal(first, other))
      self.assertLess(abs(np.corrcoef(first, other)[0, 1]), limit)
    # A dropout mask keeps about keep_prob of the units.
    self.assertLess(abs((first < 0.8).mean() - 0.8),
                    5 * np.sqrt(0.16 / n))


if __name__ == '__main__':
  tf.test.main()
