"""Proves the pinned stack: Lingvo layers build and train on 2 virtual CPUs."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import numpy as np
from lingvo import compat as tf
from lingvo.core import layers
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites


class InstalledStackTest(test_utils.TestCase):

  def testTwoDeviceTrainingStepReducesLoss(self):
    config = graph_rewrites.CpuConfig(2, grappler=True)
    with self.session(graph=tf.Graph(), config=config) as sess:
      tf.random.set_seed(1)
      devices = graph_rewrites.CpuDevices(2)
      fcs = []
      for i, device in enumerate(devices):
        with tf.device(device):
          p = layers.FCLayer.Params().Set(
              name='fc%d' % i, input_dim=8, output_dim=8,
              params_init=py_utils.WeightInit.Gaussian(0.3, seed=i))
          fcs.append(p.Instantiate())
      x = tf.constant(np.random.RandomState(0).randn(16, 8), tf.float32)
      h = x
      for device, fc in zip(devices, fcs):
        with tf.device(device):
          h = fc.FPropDefaultTheta(h)
      loss = tf.reduce_mean(tf.square(h - 1.0))
      variables = fcs[0].vars.Flatten() + fcs[1].vars.Flatten()
      train_op = tf.train.GradientDescentOptimizer(0.1).minimize(
          loss, var_list=variables, colocate_gradients_with_ops=True)
      # Each layer's matmul and its gradient run on that layer's device.
      for op in tf.get_default_graph().get_operations():
        if op.type == 'MatMul':
          expected = 'CPU:1' if 'fc1' in op.name else 'CPU:0'
          self.assertIn(expected, op.device, op.name)
      sess.run(tf.global_variables_initializer())
      before = sess.run(loss)
      sess.run(train_op)
      after = sess.run(loss)
      self.assertEqual(len(sess.list_devices()), 2)
      self.assertLess(after, before)


class PublicNamesTest(test_utils.TestCase):

  def testPackageExportsThePublicNames(self):
    import gpipe  # pylint: disable=g-import-not-at-top
    from gpipe import pipeline  # pylint: disable=g-import-not-at-top
    self.assertIs(gpipe.PipeliningLayer, pipeline.PipeliningLayer)
    for name in gpipe.__all__:
      self.assertTrue(hasattr(gpipe, name), name)
    p = gpipe.PipeliningLayer.Params()
    self.assertIn('num_micro_batches', p)


if __name__ == '__main__':
  tf.test.main()
