"""PipeliningLayer: exact gradients, placement, batch norm, errors, scale."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import collections
import itertools

from absl.testing import parameterized
from gpipe import pipeline
from gpipe.schedules import pipeline_tasks
from gpipe import randomness
import numpy as np
from lingvo import compat as tf
from lingvo.core import builder_layers
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import toy_layers

graph_rewrites.Off()


def _StageCalls(graph):
  """The stage tasks' call ops of `graph` (not the weight forks and adds)."""
  return [op for op in graph.get_operations()
          if op.type in ('PartitionedCall', 'StatefulPartitionedCall') and
          pipeline_tasks.ParseOpName(op.name) is not None]

NUM_LAYERS = 7
UNEVEN_SIZES = {1: [7], 2: [2, 5], 4: [1, 3, 2, 1]}
CONFIG = graph_rewrites.CpuConfig(4)


def _LossAndGrads(net, inputs, pipelined):
  fprop = net.FProp if pipelined else net.FPropUnpipelined
  out = fprop(net.theta, *inputs)
  h = out.h if isinstance(out, py_utils.NestedMap) else out
  loss = tf.reduce_sum(tf.square(h)) + tf.reduce_sum(h)
  xs = net.vars.Flatten() + [x for x in tf.nest.flatten(inputs)
                             if x.dtype.is_floating]
  grads = tf.gradients(loss, xs, colocate_gradients_with_ops=True)
  return loss, grads


class PipelineGradientTest(test_utils.TestCase, parameterized.TestCase):
  """Pipelined loss and gradients equal those of the unpipelined layers."""

  # Every K with every M; the remat modes go round them, so each K runs each
  # mode (tests/schedule_pipeline_test.py runs every schedule likewise).
  @parameterized.named_parameters(
      ('K%d_M%d_%s' % (k, m, pipeline.REMAT_MODES[(i + j) % 3]), k, m,
       pipeline.REMAT_MODES[(i + j) % 3])
      for (i, k), (j, m) in itertools.product(enumerate([1, 2, 4]),
                                              enumerate([1, 2, 4, 8])))
  def testUnevenStagesWithDropoutMatchUnpipelined(self, k, m, remat):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(NUM_LAYERS),
                                      k, m, stage_sizes=UNEVEN_SIZES[k],
                                      remat=remat)
      self.assertEqual(net.stage_sizes, UNEVEN_SIZES[k])
      x = tf.constant(np.random.RandomState(1).randn(16, 8))
      loss, grads = _LossAndGrads(net, (x,), pipelined=True)
      # The unpipelined values depend on M only (not on K or remat): each M's
      # are computed by its first case, the others compare with them.
      cache, refs = pipeline_testlib.CachedReference(self, m)
      fetches = [[loss] + grads]
      if refs is None:
        ref_loss, ref_grads = _LossAndGrads(net, (x,), pipelined=False)
        fetches.append([ref_loss] + ref_grads)
      # Dropout was on: the loss differs from the loss without it (which
      # depends on neither K nor M: computed by the first case).
      _, no_drop_loss = pipeline_testlib.CachedReference(self, 'no_dropout')
      if no_drop_loss is None:
        no_drop = pipeline_testlib.Pipeline(
            pipeline_testlib.DenseLayers(NUM_LAYERS, keep_prob=1.0), k, m,
            name='nodrop')
        fetches.append(_LossAndGrads(no_drop, (x,), True)[0])
      sess.run(tf.global_variables_initializer())
      results = sess.run(fetches)
      values = results[0]
      if refs is None:
        refs = cache[m] = results[1]
      if no_drop_loss is None:
        no_drop_loss = cache['no_dropout'] = results[-1]
      self.assertLen(values, 2 * NUM_LAYERS + 2)
      self.assertLen(refs, len(values))
      for v, r in zip(values, refs):
        self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)
      self.assertNotAllClose(refs[0], no_drop_loss)

  @parameterized.named_parameters(('always', 'always'), ('never', 'never'))
  def testNestedMapInputsPassThroughAndMatch(self, remat):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      layers = [
          toy_layers.NestedDense.Params().Set(
              name='nd%d' % i, dtype=tf.float64,
              params_init=py_utils.WeightInit.Gaussian(0.5, seed=i))
          for i in range(4)
      ]
      net = pipeline_testlib.Pipeline(layers, 2, 4, remat=remat,
                                      partition_cost='uniform')
      rng = np.random.RandomState(2)
      inputs = py_utils.NestedMap(
          h=tf.constant(rng.randn(8, 8)),
          context=tf.constant(rng.rand(8, 8) + 0.5),
          ids=tf.constant(rng.randint(0, 3, size=[8]), tf.int32))
      out = net.FProp(net.theta, inputs)
      self.assertIsInstance(out, py_utils.NestedMap)
      self.assertEqual(sorted(out.keys()), ['context', 'h', 'ids'])
      loss, grads = _LossAndGrads(net, (inputs,), pipelined=True)
      ref_loss, ref_grads = _LossAndGrads(net, (inputs,), pipelined=False)
      sess.run(tf.global_variables_initializer())
      out_v, in_v = sess.run([out, inputs])
      # Untouched fields come out exactly as they went in.
      self.assertAllEqual(in_v.ids, out_v.ids)
      self.assertAllEqual(in_v.context, out_v.context)
      values, refs = sess.run([[loss] + grads, [ref_loss] + ref_grads])
      for v, r in zip(values, refs):
        self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)

  def testCellTemplatesOnePerStage(self):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      layers = pipeline_testlib.DenseLayers(5)
      cells = [
          builder_layers.SequentialLayer.Params().Set(
              name='cell0', sub=layers[:2]),
          builder_layers.SequentialLayer.Params().Set(
              name='cell1', sub=layers[2:])
      ]
      p = pipeline.PipeliningLayer.Params().Set(
          name='pipe', cell_tpl=cells, num_micro_batches=4,
          stage_devices=graph_rewrites.CpuDevices(2), dtype=tf.float64)
      net = p.Instantiate()
      self.assertEqual(net.num_stages, 2)
      self.assertEqual(net.stage_sizes, [1, 1])
      x = tf.constant(np.random.RandomState(1).randn(8, 8))
      loss, grads = _LossAndGrads(net, (x,), pipelined=True)
      ref_loss, ref_grads = _LossAndGrads(net, (x,), pipelined=False)
      sess.run(tf.global_variables_initializer())
      values, refs = sess.run([[loss] + grads, [ref_loss] + ref_grads])
      self.assertLen(values, 2 * 5 + 2)
      for v, r in zip(values, refs):
        self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)

  def testMicroBatchSizeParam(self):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2,
                                      micro_batch_size=2)
      x = tf.constant(np.random.RandomState(1).randn(8, 8))
      out = net.FProp(net.theta, x)
      calls = _StageCalls(tf.get_default_graph())
      self.assertLen(calls, 2 * 4)  # K stages x M = 8 / 2 micro-batches
      sess.run(tf.global_variables_initializer())
      self.assertEqual(sess.run(out).shape, (8, 8))

  def testDropoutMasksDifferPerMicroBatch(self):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = pipeline_testlib.Pipeline(
          pipeline_testlib.DenseLayers(2, keep_prob=0.5), 2, 4)
      x = tf.constant(np.tile(np.random.RandomState(3).randn(1, 8), [8, 1]))
      out = net.FProp(net.theta, x)
      sess.run(tf.global_variables_initializer())
      y = sess.run(out)
      # Identical rows in: micro-batch m holds rows 2m, 2m+1.
      self.assertNotAllClose(y[0], y[2])
      self.assertNotAllClose(y[2], y[4])


class PlacementTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('always', 'always'), ('never', 'never'),
                                  ('except_last', 'except_last'))
  def testForwardAndGradientOpsOnStageDevices(self, remat):
    with tf.Graph().as_default() as graph:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2, 4,
                                      remat=remat, partition_cost='uniform')
      x = tf.constant(np.random.RandomState(1).randn(8, 8))
      loss, _ = _LossAndGrads(net, (x,), pipelined=True)
      del loss
      calls = _StageCalls(graph)
      forward = [op for op in calls if not op.name.startswith('gradients')]
      backward = [op for op in calls if op.name.startswith('gradients')]
      self.assertLen(forward, 8)
      self.assertLen(backward, 8)
      for op in calls:
        stage = 0 if '/stage0_' in '/' + op.name else 1
        self.assertEqual(op.device, '/device:CPU:%d' % stage, op.name)
      # Variables live on their stage's device.
      for i, var in enumerate(net.vars.Flatten()):
        del i
        stage = 0 if 'dense0' in var.name or 'dense1' in var.name else 1
        self.assertEqual(var.device, '/device:CPU:%d' % stage, var.name)
      # Inside the traced stage functions no op asks for another device.
      (stage_fns,) = net._stage_fns.values()  # pylint: disable=protected-access
      for fns in stage_fns:
        for fn in (fns._forward, fns._backward):  # pylint: disable=protected-access
          if fn is None:
            continue
          for op in fn.graph.get_operations():
            self.assertIn(op.device, ('', fns.device), op.name)

  def testTasksOfAStageAreChainedInScheduleOrder(self):
    with tf.Graph().as_default() as graph:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2, 3,
                                      partition_cost='uniform')
      x = tf.constant(np.random.RandomState(1).randn(6, 8))
      _LossAndGrads(net, (x,), pipelined=True)
      ops = {op.name: op for op in graph.get_operations()}

      def Find(token):
        (name,) = [n for n in ops if n.endswith(token + '/PartitionedCall')]
        return ops[name]

      for s in range(2):
        chain = ['stage%d_F%d' % (s, m) for m in range(3)] + [
            'stage%d_B%d' % (s, m) for m in (2, 1, 0)
        ]
        for prev, nxt in zip(chain, chain[1:]):
          self.assertIn(Find(prev), Find(nxt).control_inputs, (prev, nxt))

  @parameterized.named_parameters(('always', 'always'), ('never', 'never'))
  def testLoopedStagesMatchUnpipelinedAndChainPerDevice(self, remat):
    # Four stages on two devices: stage s on device s % 2.
    devices = ['/device:CPU:0', '/device:CPU:1'] * 2
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(NUM_LAYERS),
                                      4, 4, stage_sizes=UNEVEN_SIZES[4],
                                      remat=remat, stage_devices=devices)
      x = tf.constant(np.random.RandomState(3).randn(16, 8))
      loss, grads = _LossAndGrads(net, (x,), pipelined=True)
      ref_loss, ref_grads = _LossAndGrads(net, (x,), pipelined=False)
      ops = {op.name: op for op in sess.graph.get_operations()}
      sess.run(tf.global_variables_initializer())
      values, refs = sess.run([[loss] + grads, [ref_loss] + ref_grads])
      for v, r in zip(values, refs):
        self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)

    def Find(token):
      (name,) = [n for n in ops if n.endswith(token + '/PartitionedCall')]
      return ops[name]

    for d in range(2):
      # Breadth-first on each device: all forwards of its first stage, then
      # of its second; backwards last stage first.
      first, second = d, d + 2
      chain = (['stage%d_F%d' % (first, m) for m in range(4)] +
               ['stage%d_F%d' % (second, m) for m in range(4)])
      if remat == 'always':
        chain += (['stage%d_B%d' % (second, m) for m in (3, 2, 1, 0)] +
                  ['stage%d_B%d' % (first, m) for m in (3, 2, 1, 0)])
      for prev, nxt in zip(chain, chain[1:]):
        self.assertIn(Find(prev), Find(nxt).control_inputs, (prev, nxt))
        self.assertEqual(Find(nxt).device, devices[d])


class BatchNormTest(test_utils.TestCase):

  def _Net(self, name='pipe'):
    return pipeline_testlib.Pipeline(
        pipeline_testlib.DenseLayers(2, keep_prob=1.0, use_bn=True), 2, 4,
        name=name, partition_cost='uniform')

  def testMicroBatchStatisticsAndOneMiniBatchUpdate(self):
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = self._Net()
      x_np = np.random.RandomState(4).randn(16, 8) * 3.0 + 1.0
      x = tf.constant(x_np)
      out = net.FProp(net.theta, x)
      updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)
      # One update per moving average (2 layers x mean/variance), not per
      # micro-batch.
      self.assertLen(updates, 4)
      sess.run(tf.global_variables_initializer())
      w0, b0 = sess.run([net.theta.layer_000.w, net.theta.layer_000.b])
      y, _ = sess.run([out, updates])
      del y
      bn0 = net.layer_000.bn
      mean, var = sess.run([bn0.vars.moving_mean, bn0.vars.moving_variance])
      # decay 0.5 from (0, 1), with the statistics of all 16 examples.
      self.assertAllClose(0.5 * x_np.mean(0), mean)
      self.assertAllClose(0.5 + 0.5 * x_np.var(0), var)
      # Training normalized each micro-batch of 4 with its own statistics.
      h = sess.run(
          net.FPropUnpipelined(net.theta, x)[:4])  # same per-micro-batch path
      xm = x_np[:4]
      normalized = (xm - xm.mean(0)) / np.sqrt(xm.var(0) + 1e-3)
      layer1_in = np.tanh(normalized @ w0 + b0)
      del layer1_in  # layer 1's BN re-normalizes; check the first layer only
      first = sess.run(
          net.layer_000.FProp(net.theta.layer_000, tf.constant(xm)))
      self.assertAllClose(np.tanh(normalized @ w0 + b0), first)
      self.assertEqual(h.shape, (4, 8))

  def testLingvoTrainOpFindsTheUpdatesRelevant(self):
    # Lingvo's BaseTask runs only the batch-norm updates whose statistics the
    # loss depends on: all of them must qualify, pipelined or not, and for a
    # batch norm used alone too.
    for fprop in ('FProp', 'FPropUnpipelined', 'alone'):
      with tf.Graph().as_default():
        net = self._Net()
        x = tf.constant(np.random.RandomState(6).randn(16, 8))
        if fprop == 'alone':
          out = net.layer_000.bn.FProp(net.theta.layer_000.bn, x)
        else:
          out = getattr(net, fprop)(net.theta, x)
        loss = tf.reduce_sum(out)
        updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)
        self.assertLen(updates, 2 if fprop == 'alone' else 4)
        relevant, irrelevant = py_utils.FindRelevantBatchNormUpdates(
            loss, updates)
        self.assertLen(relevant, len(updates), fprop)
        self.assertEmpty(irrelevant, fprop)

  def testPipelinedUpdateEqualsUnpipelinedAndEvalUsesMovingAverages(self):
    x_np = np.random.RandomState(5).randn(16, 8) * 2.0
    with self.session(graph=tf.Graph(), config=CONFIG) as sess:
      net = self._Net()
      x = tf.constant(x_np)
      n = len(tf.get_collection(py_utils.BATCH_NORM_UPDATES))
      out = net.FProp(net.theta, x)
      updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)[n:]
      n += len(updates)
      ref_out = net.FPropUnpipelined(net.theta, x)
      ref_updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)[n:]
      with cluster_factory.SetEval(True):
        eval_out = net.FProp(net.theta, x)
      bn = [net.layer_000.bn, net.layer_001.bn]
      moving = [[b.vars.moving_mean, b.vars.moving_variance] for b in bn]
      results = []
      sess.run(tf.global_variables_initializer())
      reset_moving = tf.variables_initializer(tf.nest.flatten(moving))
      for fetch in ([out, updates], [ref_out, ref_updates]):
        sess.run(reset_moving)
        sess.run(fetch)
        results.append(sess.run(moving))
      self.assertAllClose(results[0], results[1])
      # Both layers' averages moved (the second one's input is the first
      # layer's output, computed with micro-batch statistics).
      for mean, var in results[0]:
        self.assertNotAllClose(np.zeros(8), mean)
        self.assertNotAllClose(np.ones(8), var)
      # Eval normalizes with the moving averages, not batch statistics.
      (mean, var), _ = results[1]
      beta, gamma = sess.run([bn[0].vars.beta, bn[0].vars.gamma])
      self.assertAllClose((x_np - mean) / np.sqrt(var + 1e-3) * gamma + beta,
                          sess.run(_EvalFirstBN(net, x)))
      train_y, eval_y = sess.run([out, eval_out])
      self.assertNotAllClose(train_y, eval_y)


def _EvalFirstBN(net, x):
  with cluster_factory.SetEval(True):
    return net.layer_000.bn.FProp(net.theta.layer_000.bn, x)


class ErrorsTest(test_utils.TestCase):

  def testBatchNotDivisible(self):
    with tf.Graph().as_default():
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 4)
      with self.assertRaisesRegex(ValueError,
                                  'batch 30 is not divisible by 4 micro'):
        net.FProp(net.theta, tf.zeros([30, 8], tf.float64))

  def testMicroBatchCountAndSizeMustAgree(self):
    with tf.Graph().as_default():
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 4,
                                      micro_batch_size=3)
      with self.assertRaisesRegex(
          ValueError, 'num_micro_batches=4 and micro_batch_size=3 disagree '
          'with the batch of 8'):
        net.FProp(net.theta, tf.zeros([8, 8], tf.float64))
    with tf.Graph().as_default():
      # Both given and agreeing (as Lingvo accepts): 4 micro-batches of 2.
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 4,
                                      micro_batch_size=2)
      net.FProp(net.theta, tf.zeros([8, 8], tf.float64))
      self.assertLen(_StageCalls(tf.get_default_graph()), 2 * 4)

  def testNeitherMicroBatchCountNorSize(self):
    with tf.Graph().as_default():
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2)
      with self.assertRaisesRegex(ValueError, 'set num_micro_batches or'):
        net.FProp(net.theta, tf.zeros([8, 8], tf.float64))

  def testMoreStagesThanLayers(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError,
                                  'cannot cut 3 layers into 4 stages'):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(3), 4, 2)

  def testFewerDevicesThanStages(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError,
                                  '4 stages but only 2 stage_devices'):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 4, 2,
                                  stage_devices=graph_rewrites.CpuDevices(2))

  def testFewerClusterDevicesThanStages(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, 'device.* per model split'):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2, 2,
                                  stage_devices=None)

  def testClusterDevicesAreTheDefault(self):
    with tf.Graph().as_default():
      with cluster_factory.ForTestingWorker(cpus=2, split_size=2):
        net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2, 2,
                                        stage_devices=None)
      self.assertEqual([d[-5:] for d in net.stage_devices],
                       ['CPU:0', 'CPU:1'])

  def testUnknownStaticBatchSize(self):
    with tf.Graph().as_default():
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 2)
      x = tf.compat.v1.placeholder(tf.float64, [None, 8])
      with self.assertRaisesRegex(ValueError, 'unknown static batch size'):
        net.FProp(net.theta, x)

  def testLayerWithoutCostInformation(self):
    with tf.Graph().as_default():
      layers = pipeline_testlib.DenseLayers(2) + [
          toy_layers.NoMeta.Params().Set(name='nometa')]
      with self.assertRaisesRegex(ValueError,
                                  'layer 2 .nometa, NoMeta. has no cost'):
        pipeline_testlib.Pipeline(layers, 2, 2, partition_cost='flops',
                                  input_shapes=[[4, 8]])

  def testFlopsWithoutInputShapes(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, 'needs input_shapes'):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 2,
                                  partition_cost='flops')

  def testUnknownRematAndSchedule(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, "unknown remat 'sometimes'"):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 2,
                                  remat='sometimes')
      with self.assertRaisesRegex(ValueError, "unknown schedule 'zigzag'"):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(2), 2, 2,
                                  schedule='zigzag')

  def testBadStageSizes(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, 'summing to 4 layers'):
        pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(4), 2, 2,
                                  stage_sizes=[1, 2])


class ScaleTest(test_utils.TestCase):

  def _CountOps(self, num_layers, num_micro_batches):
    """Op types added by FProp + gradients (outside the traced functions)."""
    with tf.Graph().as_default() as graph:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(num_layers),
                                      4, num_micro_batches,
                                      stage_devices=['/device:CPU:0'] * 4,
                                      partition_cost='uniform')
      before = len(graph.get_operations())
      x = tf.zeros([32, 8], tf.float64)
      _LossAndGrads(net, (x,), pipelined=True)
      return collections.Counter(
          op.type for op in graph.get_operations()[before:])

  def testGraphDoesNotGrowWithLayersTimesMicroBatches(self):
    small, small_many = self._CountOps(8, 8), self._CountOps(8, 16)
    deep, deep_many = self._CountOps(32, 8), self._CountOps(32, 16)
    # What 8 more micro-batches add to a 32-layer pipeline beyond what they
    # add to an 8-layer one: nothing. No op per (layer, micro-batch) pair:
    # the weight gradients are summed by one call per stage and micro-batch
    # (gpipe/accumulation.py), not by one add per variable.
    interaction = (deep_many - deep) - (small_many - small)
    self.assertEqual(dict(interaction), {})
    # Per (stage, micro-batch) call: a fixed handful of ops.
    per_call = sum((small_many - small).values()) / (4 * 8)
    self.assertLess(per_call, 30)

  def testStageCallOpsAreKTimesM(self):
    with tf.Graph().as_default() as graph:
      net = pipeline_testlib.Pipeline(pipeline_testlib.DenseLayers(16), 4, 8,
                                      stage_devices=['/device:CPU:0'] * 4,
                                      partition_cost='uniform')
      _LossAndGrads(net, (tf.zeros([32, 8], tf.float64),), pipelined=True)
      self.assertLen(_StageCalls(graph), 2 * 4 * 8)
      # A forward and a backward function per stage, and the weight fork and
      # its gradient's add, traced once for the four equal stages; and the
      # dropout's generator (gpipe.randomness), traced once for them all.
      self.assertLen(graph.as_graph_def().library.function, 2 * 4 + 2 + 1)


class SeedTest(test_utils.TestCase):

  def testSeedsDependOnStepAndMicroBatch(self):
    with self.session(graph=tf.Graph()) as sess:
      seeds = sess.run([
          randomness.MicroBatchSeed(0, 0),
          randomness.MicroBatchSeed(0, 1),
          randomness.MicroBatchSeed(1, 0)
      ])
      self.assertLen({tuple(s) for s in seeds}, 3)


if __name__ == '__main__':
  tf.test.main()
