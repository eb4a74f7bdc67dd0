"""Tests of the Transformer layers: tasks/mt/blocks.py and sublayers.py."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils
from lingvo.core import tshape
from tasks.mt import blocks
from tasks.mt import stack
from tasks.mt import sublayers
from tests import graph_rewrites

graph_rewrites.Off()

_B, _S, _T, _V, _D = 3, 5, 6, 17, 16


def _Batch(seed=0):
  rng = np.random.RandomState(seed)
  src_paddings = np.zeros([_B, _S], np.float32)
  src_paddings[0, 3:] = 1.0
  tgt_paddings = np.zeros([_B, _T], np.float32)
  tgt_paddings[1, 4:] = 1.0
  return dict(
      src_ids=rng.randint(4, _V, size=[_B, _S]).astype(np.int32),
      src_paddings=src_paddings,
      tgt_ids=rng.randint(4, _V, size=[_B, _T]).astype(np.int32),
      tgt_paddings=tgt_paddings,
      tgt_labels=rng.randint(4, _V, size=[_B, _T]).astype(np.int32),
      tgt_weights=1.0 - tgt_paddings)


def _Layers(dropout=0.0, **kwargs):
  return stack.EncoderDecoderLayers(
      vocab_size=_V, model_dim=_D, hidden_dim=32, num_heads=4, num_layers=2,
      dropout_prob=dropout, **kwargs)


class TransformerLayersTest(test_utils.TestCase):

  def _Build(self, layer_params):
    built = [p.Copy().Instantiate() for p in layer_params]
    placeholders = {
        k: tf.placeholder(tf.as_dtype(v.dtype), v.shape)
        for k, v in _Batch().items()
    }
    x = py_utils.NestedMap(placeholders)
    outputs = []
    for layer in built:
      x = layer.FProp(layer.theta, x)
      outputs.append(x)
    return built, placeholders, outputs

  def testShapesFollowFPropMeta(self):
    layer_params = _Layers()
    with self.session(graph=tf.Graph()) as sess:
      tf.random.set_seed(1)
      _, placeholders, outputs = self._Build(layer_params)
      sess.run(tf.global_variables_initializer())
      shapes = py_utils.NestedMap({
          k: tshape.Shape(list(v.shape)) for k, v in _Batch().items()
      })
      for p, out in zip(layer_params, outputs):
        meta = p.cls.FPropMeta(p, shapes)
        self.assertGreater(meta.flops, 0)
        shapes = meta.out_shapes[0]
        static = out.Transform(lambda t: t.shape.as_list())
        expected = shapes.Transform(lambda s: [int(d) for d in s.ToTensorShape()])
        self.assertEqual(static.FlattenItems(), expected.FlattenItems())
      final = sess.run(outputs[-1], {placeholders[k]: v
                                     for k, v in _Batch().items()})
      for key in ('xent', 'nll', 'correct', 'weight'):
        self.assertEqual(final[key].shape, (_B,))
      np.testing.assert_allclose(final.weight, [_T, 4, _T])
      self.assertEqual(outputs[2].src.shape.as_list(), [_B, _S, _D])
      self.assertEqual(outputs[4].tgt.shape.as_list(), [_B, _T, _D])

  def testEncoderDecoderFlopsDominatedByMatmuls(self):
    p = _Layers()[1]
    meta = p.cls.FPropMeta(
        p, py_utils.NestedMap(src=tshape.Shape([8, 10, _D])))
    # 2 flops per multiply-add: 4 DxD projections + 2 DxH feed-forward.
    self.assertGreaterEqual(meta.flops, 2 * 8 * 10 * (4 * _D * _D +
                                                      2 * _D * 32))

  def testNoPeekingAtFutureTargetsOrPaddedSource(self):
    with self.session(graph=tf.Graph()) as sess:
      tf.random.set_seed(2)
      built, placeholders, _ = self._Build(_Layers())
      x = py_utils.NestedMap(placeholders)
      for layer in built[:-1]:
        x = layer.FProp(layer.theta, x)
      logits_op = built[-1].Logits(built[-1].theta, x)
      sess.run(tf.global_variables_initializer())

      def _Logits(batch):
        return sess.run(logits_op,
                        {placeholders[k]: v for k, v in batch.items()})

      batch = _Batch()
      base = _Logits(batch)
      for t in range(_T):
        changed = {k: v.copy() for k, v in batch.items()}
        changed['tgt_ids'][:, t] = (changed['tgt_ids'][:, t] + 3) % _V
        logits = _Logits(changed)
        # Positions before t do not see token t; position t does.
        np.testing.assert_allclose(logits[:, :t], base[:, :t], atol=1e-5)
        self.assertGreater(np.abs(logits[:, t] - base[:, t]).max(), 1e-4)
      # A padded source token is invisible; a real one is not.
      changed = {k: v.copy() for k, v in batch.items()}
      changed['src_ids'][0, 4] = (changed['src_ids'][0, 4] + 1) % _V
      np.testing.assert_allclose(_Logits(changed), base, atol=1e-5)
      changed['src_ids'][0, 1] = (changed['src_ids'][0, 1] + 1) % _V
      self.assertGreater(np.abs(_Logits(changed)[0] - base[0]).max(), 1e-4)

  def testDropoutOnlyInTraining(self):
    batch = _Batch()
    results = {}
    for do_eval in (False, True):
      with self.session(graph=tf.Graph()) as sess, \
          cluster_factory.ForTestingWorker(mode='sync', do_eval=do_eval):
        tf.random.set_seed(3)
        _, placeholders, outputs = self._Build(_Layers(dropout=0.5))
        sess.run(tf.global_variables_initializer())
        feed = {placeholders[k]: v for k, v in batch.items()}
        results[do_eval] = [sess.run(outputs[-1].xent, feed) for _ in range(2)]
    self.assertGreater(np.abs(results[False][0] - results[False][1]).max(),
                       1e-4)
    np.testing.assert_allclose(results[True][0], results[True][1])

  def testLogitClippingAndLabelSmoothing(self):
    p = blocks.SoftmaxLayer.Params().Set(
        name='softmax', vocab_size=_V, model_dim=_D, logits_abs_max=0.5,
        label_smoothing=0.2, params_init=py_utils.WeightInit.Gaussian(10.0))
    with self.session(graph=tf.Graph()) as sess:
      layer = p.Instantiate()
      batch = _Batch()
      x = py_utils.NestedMap(
          tgt=tf.random.normal([_B, _T, _D], seed=4),
          tgt_labels=tf.constant(batch['tgt_labels']),
          tgt_weights=tf.constant(batch['tgt_weights']))
      logits = layer.Logits(layer.theta, x)
      out = layer.FProp(layer.theta, x)
      sess.run(tf.global_variables_initializer())
      logits, out = sess.run([logits, out])
    self.assertLessEqual(np.abs(logits).max(), 0.5 + 1e-6)
    self.assertGreater(np.abs(logits).max(), 0.49)  # weights are large
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, batch['tgt_labels'][..., None],
                              -1)[..., 0]
    xent = 0.8 * nll + 0.2 * -log_probs.mean(-1)
    np.testing.assert_allclose(out.nll, (nll * batch['tgt_weights']).sum(1),
                               rtol=1e-5)
    np.testing.assert_allclose(out.xent, (xent * batch['tgt_weights']).sum(1),
                               rtol=1e-5)

  def testFeedForwardInitScaledDownByDepth(self):
    plain = _Layers()
    scaled = _Layers(scale_ffn_init_by_num_layers=True)
    self.assertEqual(plain[1].ffn_init_scale, 1.0)
    self.assertEqual(scaled[1].ffn_init_scale, 0.5)  # L = 2
    stds = []
    for layer_params in (plain[1], scaled[1]):
      with self.session(graph=tf.Graph()) as sess:
        layer = layer_params.Copy().Set(hidden_dim=512).Instantiate()
        sess.run(tf.global_variables_initializer())
        stds.append(np.std(sess.run(layer.vars.ffn.w_in)))
    self.assertAllClose(stds[1] / stds[0], 0.5, atol=0.05)

  def testSharedAndSeparateEmbeddings(self):
    shared = stack.CountParams(_Layers()[:1])
    separate = stack.CountParams(_Layers(shared_embedding=False)[:1])
    self.assertEqual(shared, _V * _D)
    self.assertEqual(separate, 2 * _V * _D)

  def testHeadsMustDivideModelDim(self):
    p = sublayers.MultiHeadAttention.Params().Set(name='a', model_dim=10,
                                                  num_heads=4)
    with self.assertRaisesRegex(ValueError, 'not divisible by num_heads'):
      p.Instantiate()


if __name__ == '__main__':
  tf.test.main()
