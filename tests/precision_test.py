"""bfloat16 mixed precision (gpipe.precision) in the pipeline.

Variables, gradients and their accumulation stay float32; stages compute in
bfloat16 and hand bfloat16 tensors to each other, also between worker
processes; the loss and batch-norm statistics are float32.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import re

from absl.testing import parameterized
from gpipe.runtime import local_cluster
from gpipe import precision
import numpy as np

from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import toy_layers

graph_rewrites.Off()

CONFIG = graph_rewrites.CpuConfig(2)
DEVICES = graph_rewrites.CpuDevices(2)

# bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); through
# 4 tanh layers, batch norm and a squared loss the float32-accumulated
# gradients of a bfloat16 forward differ from the float32 ones by a few
# percent. Tolerance: relative norm error of all gradients together <= 4%,
# of each variable's <= 10%.
ALL_TOLERANCE = 0.04
EACH_TOLERANCE = 0.10


def _Net(fprop_dtype, remat='always', schedule='gpipe', use_bn=True,
         devices=None, num_micro_batches=4):
  layers = pipeline_testlib.DenseLayers(4, keep_prob=1.0, use_bn=use_bn,
                                        dtype=tf.float32)
  devices = devices or DEVICES
  p = pipeline_testlib.PipelineParams(
      layers, 2, num_micro_batches, stage_devices=devices, remat=remat,
      schedule=schedule, dtype=tf.float32,
      loss_tpl=toy_layers.SquaredErrorLoss.Params())
  if schedule == 'zb_v':
    p.Set(num_stages=4, stage_devices=[devices[0], devices[1], devices[1],
                                       devices[0]])
  precision.SetFPropDtype(p, fprop_dtype)
  return p.Instantiate()


def _LossAndGrads(net, devices=(None, None)):
  """Loss and gradients; inputs on devices[0], targets and loss on [1]."""
  rng = np.random.RandomState(0)
  with tf.device(devices[0]):
    x = tf.constant(rng.randn(16, 8).astype(np.float32))
  with tf.device(devices[1]):
    targets = tf.constant(rng.randn(16, 8).astype(np.float32))
  out = net.FProp(net.theta, x, targets=targets)
  with tf.device(devices[1]):
    loss = tf.reduce_mean(out.per_example)
  grads = tf.gradients(loss, net.vars.Flatten(),
                       colocate_gradients_with_ops=True)
  return out, loss, grads


def _RelativeError(got, want):
  return np.linalg.norm(got - want) / np.linalg.norm(want)


class MixedPrecisionTest(test_utils.TestCase, parameterized.TestCase):

  def _Float32Reference(self):
    """The float32 loss and gradients, computed once per class.

    The float32 computation does not depend on the schedule or remat (they
    agree to float32 rounding, far inside the tolerances): each schedule's
    bfloat16 run compares with the one of 'gpipe' with remat 'always'.

    Returns:
      [loss] + gradients, numpy values.
    """
    cls = type(self)
    if '_float32_values' not in cls.__dict__:
      cls._float32_values = self._Run('float32', 'always', 'gpipe')[-1]
    return cls._float32_values

  def _Run(self, fprop_dtype, remat, schedule):
    graph = tf.Graph()
    with graph.as_default():
      net = _Net(fprop_dtype, remat, schedule)
      out, loss, grads = _LossAndGrads(net)
      with tf.compat.v1.Session(graph=graph, config=CONFIG) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        values = sess.run([loss] + grads)
    return graph, net, out, grads, values

  @parameterized.parameters(
      ('gpipe', 'always'), ('gpipe', 'never'), ('1f1b', 'except_last'),
      ('zb_h1', 'always'), ('zb_h1', 'never'), ('zb_v', 'except_last'))
  def testBfloat16GradientsCloseToFloat32AndAccumulatedInFloat32(
      self, schedule, remat):
    ref = self._Float32Reference()
    graph, net, out, grads, got = self._Run('bfloat16', remat, schedule)
    self.assertLen(ref, len(got))
    # Master weights, their gradients and the loss are float32.
    for v in net.vars.Flatten():
      self.assertEqual(tf.float32, v.dtype.base_dtype, v.name)
    for g in grads:
      self.assertEqual(tf.float32, g.dtype)
    self.assertEqual(tf.float32, out.per_example.dtype)
    # The stage functions compute in bfloat16: their matmuls are bfloat16.
    matmuls = [
        node.attr['T'].type for fn in graph.as_graph_def().library.function
        for node in fn.node_def if node.op == 'MatMul'
    ]
    self.assertNotEmpty(matmuls)
    self.assertEqual({tf.bfloat16.as_datatype_enum}, set(matmuls))
    # Gradients are summed over micro-batches in the outer graph: no add
    # there is bfloat16 (Lingvo's cast outside the stage calls would sum
    # the micro-batch gradients in bfloat16).
    adds = [op.name for op in graph.get_operations()
            if op.type in ('Add', 'AddV2', 'AddN') and
            op.outputs[0].dtype == tf.bfloat16]
    self.assertEqual([], adds)
    # Not the float32 computation (bfloat16 rounding shows), but close.
    self.assertNotEqual(ref[0], got[0])
    self.assertLess(
        _RelativeError(np.concatenate([g.ravel() for g in got[1:]]),
                       np.concatenate([g.ravel() for g in ref[1:]])),
        ALL_TOLERANCE)
    for v, g, r in zip(net.vars.Flatten(), got[1:], ref[1:]):
      if not np.any(r):  # batch-norm moving averages: no gradient
        self.assertAllEqual(r, g)
        continue
      self.assertLess(_RelativeError(g, r), EACH_TOLERANCE, v.name)

  def testBatchNormStatisticsAreFloat32(self):
    with tf.Graph().as_default():
      net = _Net('bfloat16')
      _LossAndGrads(net)
      updates = tf.compat.v1.get_collection(py_utils.BATCH_NORM_UPDATES)
      self.assertLen(updates, 2 * 4)  # moving mean and variance per layer
      # The statistics reach the updates as float32 from the stage calls
      # (summed over micro-batches in float32): no bfloat16 tensor on the
      # way, back to the calls.
      seen, stack, calls = set(), [u.op for u in updates], 0
      while stack:
        op = stack.pop()
        if op in seen:
          continue
        seen.add(op)
        if 'PartitionedCall' in op.type:
          calls += 1
          continue
        for t in op.inputs:
          self.assertNotEqual(tf.bfloat16, t.dtype, t.name)
          stack.append(t.op)
      self.assertEqual(2 * 4, calls)  # every forward call reports them
      self.assertEqual(tf.float32,
                       net.children['layer_001'].bn.vars.moving_mean.dtype
                       .base_dtype)

  def testFloat32LeavesTheGraphAlone(self):
    with tf.Graph().as_default() as graph:
      net = _Net('float32')
      _LossAndGrads(net)
      dtypes = {out.dtype for op in graph.get_operations()
                for out in op.outputs}
      self.assertNotIn(tf.bfloat16, dtypes)

  def testBadFPropDtypes(self):
    with self.assertRaisesRegex(ValueError, 'loss scaling.*use bfloat16'):
      precision.ParseFPropDtype('float16')
    with self.assertRaisesRegex(ValueError,
                                'int8 is unknown; use one of float32, '
                                'bfloat16'):
      precision.ParseFPropDtype('int8')
    self.assertEqual(tf.bfloat16, precision.ParseFPropDtype('bfloat16'))


class AcrossWorkerProcessesTest(test_utils.TestCase):

  def testStagesHandOverBfloat16BetweenProcesses(self):
    cluster = local_cluster.LocalCluster(2)
    try:
      with tf.Graph().as_default():
        devices = cluster.devices
        num_mb = 4
        net = _Net('bfloat16', devices=devices, num_micro_batches=num_mb)
        _, loss, grads = _LossAndGrads(net, devices)
        with tf.compat.v1.Session(cluster.target) as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          metadata = tf.compat.v1.RunMetadata()
          sess.run([loss] + grads, options=tf.compat.v1.RunOptions(
              output_partition_graphs=True), run_metadata=metadata)
      # Every float tensor a stage call sends to the other process is
      # bfloat16: activations forward (task 0 -> 1) and their gradients back
      # (the other sends carry the fetched loss and gradients to task 0,
      # where the session's master runs).
      sent = {}
      for graph_def in metadata.partition_graphs:
        for node in graph_def.node:
          if node.op != '_Send' or node.attr['client_terminated'].b:
            continue
          src = node.attr['send_device'].s.decode()
          dst = node.attr['recv_device'].s.decode()
          task = lambda d: d.split('/task:')[1].split('/')[0]
          dtype = tf.as_dtype(node.attr['T'].type)
          # Outputs of stage calls (F and B tasks), not the summed weight
          # gradients the session fetches.
          if (task(src) != task(dst) and dtype.is_floating and
              re.search(rb'stage\d+_[FB]\d+/.*PartitionedCall',
                        node.attr['tensor_name'].s)):
            sent.setdefault((task(src), task(dst)), []).append(dtype)
      self.assertEqual([tf.bfloat16] * num_mb, sent[('0', '1')])
      self.assertEqual([tf.bfloat16] * num_mb, sent[('1', '0')])
    finally:
      cluster.Stop()


if __name__ == '__main__':
  tf.test.main()
