"""tasks.dense.DenseLayer: values, cost metadata, dropout, batch norm, errors."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks import dense
from tests import graph_rewrites

graph_rewrites.Off()


def _Params(**kwargs):
  return dense.DenseLayer.Params().Set(
      name='dense', input_dim=3, output_dim=4, dtype=tf.float64,
      params_init=py_utils.WeightInit.Gaussian(1.0, seed=1), **kwargs)


class DenseLayerTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.parameters(('RELU', lambda z: np.maximum(z, 0)),
                            ('TANH', np.tanh), ('NONE', lambda z: z))
  def testComputesActOfAffine(self, activation, numpy_act):
    with self.session(graph=tf.Graph()) as sess:
      layer = _Params(activation=activation, bias_init=0.25).Instantiate()
      x = np.random.RandomState(0).randn(5, 3)
      y = layer.FPropDefaultTheta(tf.constant(x))
      sess.run(tf.global_variables_initializer())
      w, b, got = sess.run([layer.vars.w, layer.vars.b, y])
      self.assertAllClose(b, np.full([4], 0.25))
      self.assertAllClose(got, numpy_act(x.dot(w) + b))

  def testFPropMetaGivesFlopsAndShape(self):
    p = _Params()
    meta = p.cls.FPropMeta(p, tf.TensorShape([6, 3]))
    self.assertEqual(meta.flops, 2 * 6 * 3 * 4)
    self.assertEqual(meta.out_shapes[0].as_list(), [6, 4])

  def testDropoutOnlyInTraining(self):
    with self.session(graph=tf.Graph()) as sess:
      layer = _Params(activation='NONE', keep_prob=0.5).Instantiate()
      x = tf.ones([64, 3], tf.float64)
      train = layer.FPropDefaultTheta(x)
      sess.run(tf.global_variables_initializer())
      got = sess.run(train)
      self.assertGreater(np.mean(got == 0), 0.2)  # about half dropped
    with self.session(graph=tf.Graph()) as sess, \
        cluster_factory.ForTestingWorker(mode='sync', do_eval=True):
      eval_layer = _Params(activation='NONE', keep_prob=0.5).Instantiate()
      self.assertTrue(eval_layer.do_eval)
      out = eval_layer.FPropDefaultTheta(tf.ones([64, 3], tf.float64))
      sess.run(tf.global_variables_initializer())
      self.assertEqual(np.mean(sess.run(out) == 0), 0.0)

  def testBatchNormChild(self):
    with tf.Graph().as_default():
      self.assertIn('bn', _Params(use_bn=True).Instantiate().children)
    with tf.Graph().as_default():
      self.assertNotIn('bn', _Params().Instantiate().children)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, "unknown activation 'GELU'"):
      _Params(activation='GELU').Instantiate()
    with self.assertRaisesRegex(ValueError, r'keep_prob must be in \(0, 1\]'):
      _Params(keep_prob=0.0).Instantiate()


if __name__ == '__main__':
  tf.test.main()
