"""Each private TensorFlow call of gpipe.compat.tf_internal works here.

A TensorFlow version that renames or changes one of them fails this test by
name, instead of a pipeline failing somewhere deep inside graph building.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import re

from gpipe.compat import tf_internal
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites


class TfInternalTest(test_utils.TestCase):

  def testAddControlInputOrdersExistingOps(self):
    with tf.Graph().as_default():
      first = tf.no_op(name='first')
      second = tf.no_op(name='second')
      tf_internal.AddControlInput(second, first)
      self.assertEqual(second.control_inputs, [first])

  def testCreateOpCopiesAnOpIntoAnotherGraph(self):
    with tf.Graph().as_default() as source:
      x = tf.constant([[1.0, 2.0]])
      y = tf.matmul(x, x, transpose_b=True, name='mm')
    with tf.Graph().as_default() as target:
      a = tf.constant([[3.0, 4.0]])
      op = y.op
      new = tf_internal.CreateOp(target, op.type, [a, a],
                                 [o.dtype for o in op.outputs], 'copied',
                                 dict(op.node_def.attr.items()), op.op_def)
      with self.session(graph=target) as sess:
        self.assertAllClose(sess.run(new.outputs[0]), [[25.0]])
    del source

  def testFunctionsOfAGraphCanBeAddedToAnother(self):
    @tf.function(autograph=False)
    def Double(v):
      return 2.0 * v

    with tf.Graph().as_default() as source:
      Double.get_concrete_function(tf.TensorSpec([], tf.float32))(
          tf.constant(1.0))
      functions = tf_internal.GraphFunctions(source)
    self.assertNotEmpty(functions)
    with tf.Graph().as_default() as target:
      for fn in functions.values():
        tf_internal.AddFunction(target, fn)
      self.assertTrue(all(target._is_function(name)  # pylint: disable=protected-access
                          for name in functions))

  def testXlaKernelsAreListedPerJitDevice(self):
    self.assertTrue(tf_internal.XlaKernels('XLA_CPU_JIT', 'MatMul'))
    self.assertTrue(tf_internal.XlaKernels('XLA_GPU_JIT', 'MatMul'))
    self.assertEqual([], tf_internal.XlaKernels('XLA_CPU_JIT', 'AsString'))

  def testFunctionDefinitionListsTheFunctionsOps(self):
    @tf.function(autograph=False)
    def Double(v):
      return 2.0 * v

    with tf.Graph().as_default() as graph:
      Double.get_concrete_function(tf.TensorSpec([], tf.float32))(
          tf.constant(1.0))
      fn, = tf_internal.GraphFunctions(graph).values()
      self.assertIn('Mul', [n.op for n in
                            tf_internal.FunctionDefinition(fn).node_def])
  def testRegisteredKernelsListGpuKernelsWithoutAGpu(self):
    # A CUDA build registers its GPU kernels whatever the machine has.
    kernels = tf_internal.RegisteredKernels('MatMul')
    gpu = [k for k in kernels if k.device_type == 'GPU']
    self.assertNotEmpty(gpu)
    allowed = {t for k in gpu for c in k.constraint if c.name == 'T'
               for t in c.allowed_values.list.type}
    self.assertIn(tf.float32.as_datatype_enum, allowed)
    self.assertEqual([], tf_internal.RegisteredKernels('NoSuchOpAnywhere'))
    self.assertEqual(['a', 'b'],
                     [a.name for a in tf_internal.OpDef('MatMul').input_arg])
    self.assertIsNone(tf_internal.OpDef('NoSuchOpAnywhere'))

  def testLibraryOpsListsLingvosCustomOps(self):
    from lingvo.core import ops  # pylint: disable=g-import-not-at-top
    path = os.path.join(os.path.dirname(ops.__file__), 'x_ops.so')
    names = {op.name for op in tf_internal.LibraryOps(path)}
    self.assertContainsSubset(['AssertSameDim0', 'AssertShapeMatch'], names)

  def testAMissingInternalFailsNamingTheTensorFlowVersion(self):
    with self.assertRaisesRegex(
        RuntimeError, r'TensorFlow %s has no Graph\._functions' %
        re.escape(tf.version.VERSION)):
      tf_internal.GraphFunctions(object())

  def testLocalDevicesFollowTheConfig(self):
    config = graph_rewrites.CpuConfig(2, grappler=True)
    devices = tf_internal.LocalDevices(config)
    self.assertEqual(['CPU:0', 'CPU:1'],
                     [':'.join(d.name.split(':')[-2:]) for d in devices
                      if d.device_type == 'CPU'])

  def testGradientFunctionOfAnOpIsOurs(self):
    @tf.function(autograph=False)
    def Square(v):
      return v * v

    with tf.Graph().as_default():
      x = tf.constant(3.0)
      y = Square.get_concrete_function(tf.TensorSpec([], tf.float32))(x)
      self.assertIsNotNone(tf_internal.GetGradientFunction(y.op))
      tf_internal.SetGradientFunction(y.op, lambda op, dy: [dy * 10.0])
      (grad,) = tf.gradients(y, [x])
      with self.session() as sess:
        self.assertAllClose(sess.run(grad), 10.0)


if __name__ == '__main__':
  test_utils.main()
