"""Decoding a trained toy model (a copy task) and BLEU per language pair."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import pipeline
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks.mt import bleu
from tasks.mt import blocks
from tasks.mt import model
from tasks.mt import stack
from tasks.mt import vocab

from tests import decode_testlib
from tests import graph_rewrites

graph_rewrites.Off()

_B, _LEN, _V = 32, decode_testlib.LEN, decode_testlib.VOCAB  # copy 5 tokens


class DecodeTest(test_utils.TestCase):

  def testGreedyAndBeamSearchDecodeATrainedCopyModel(self):
    layer_list = stack.EncoderDecoderLayers(
        vocab_size=_V, model_dim=32, hidden_dim=64, num_heads=2,
        num_layers=1, dropout_prob=0.0, label_smoothing=0.0)
    p = model.TransformerMTTask.Params().Set(
        name='copy', max_decode_len=_LEN + 1, beam_size=3, pipelined=False)
    p.network = pipeline.PipeliningLayer.Params().Set(
        name='network', layers=layer_list, num_stages=1, num_micro_batches=2,
        stage_devices=['/device:CPU:0'], partition_cost='uniform')
    rng = np.random.RandomState(0)
    with self.session(graph=tf.Graph()) as sess:
      tf.random.set_seed(6)
      py_utils.GetOrCreateGlobalStepVar()
      task = p.Instantiate()
      feeds = {
          k: tf.placeholder(tf.as_dtype(v.dtype), v.shape)
          for k, v in decode_testlib.CopyBatch(rng, _B).items()
      }
      batch = py_utils.NestedMap(feeds)
      metrics, _ = task.ComputeLoss(task.theta,
                                    task.ComputePredictions(task.theta, batch),
                                    batch)
      loss = metrics['loss'][0]
      train = tf.train.AdamOptimizer(3e-3).minimize(loss)
      with cluster_factory.SetEval(True):
        greedy_ids, greedy_scores = task.GreedyDecode(
            task.theta, batch.src_ids, batch.src_paddings)
        beam_ids, beam_scores, all_ids, _ = task.BeamSearchDecode(
            task.theta, batch.src_ids, batch.src_paddings)
        beam1_ids, beam1_scores, _, _ = task.BeamSearchDecode(
            task.theta, batch.src_ids, batch.src_paddings, beam_size=1)
      sess.run(tf.global_variables_initializer())
      for _ in range(400):
        _, final_loss = sess.run(
            [train, loss],
            {feeds[k]: v
             for k, v in decode_testlib.CopyBatch(rng, _B).items()})
      test = decode_testlib.CopyBatch(np.random.RandomState(123), _B)
      fetched = sess.run(
          [greedy_ids, greedy_scores, beam_ids, beam_scores, all_ids,
           beam1_ids, beam1_scores],
          {feeds[k]: v for k, v in test.items()})
    greedy, greedy_score, beam, beam_score, all_beams, beam1, beam1_score = (
        fetched)
    self.assertLess(final_loss, 0.1)
    self.assertEqual(greedy.shape, (_B, _LEN + 1))
    self.assertEqual(all_beams.shape, (_B, 3, _LEN + 1))
    expected = test['tgt_labels']
    greedy_exact = np.mean(np.all(greedy == expected, axis=1))
    beam_exact = np.mean(np.all(beam == expected, axis=1))
    self.assertGreaterEqual(greedy_exact, 0.9)
    self.assertGreaterEqual(beam_exact, 0.9)
    # A one-beam search is greedy decoding.
    self.assertAllEqual(beam1, greedy)
    self.assertAllClose(beam1_score, greedy_score, rtol=1e-5)
    # Beam scores are log-probabilities, sorted best first across beams.
    self.assertTrue(np.all(beam_score <= 0))

  def _UntrainedTask(self, max_decode_len, shared_embedding=True):
    layer_list = stack.EncoderDecoderLayers(
        vocab_size=_V, model_dim=32, hidden_dim=64, num_heads=4,
        num_layers=2, dropout_prob=0.1, label_smoothing=0.0,
        shared_embedding=shared_embedding)
    p = model.TransformerMTTask.Params().Set(
        name='mt', max_decode_len=max_decode_len, beam_size=2,
        pipelined=False)
    p.network = pipeline.PipeliningLayer.Params().Set(
        name='network', layers=layer_list, num_stages=1, num_micro_batches=1,
        stage_devices=['/device:CPU:0'], partition_cost='uniform')
    p.network.params_init = py_utils.WeightInit.Gaussian(0.5)
    tf.random.set_seed(3)
    return p.Instantiate()

  def testCachedStepLogitsEqualFullPrefixLogits(self):
    # Incremental decoding (one position per step, keys and values cached)
    # against recomputing the whole prefix, at every position, with padded
    # sources and separate source/target tables.
    batch, length = 3, 7
    rng = np.random.RandomState(1)
    src = rng.randint(4, _V, size=[batch, 6]).astype(np.int32)
    src_paddings = np.zeros([batch, 6], np.float32)
    src_paddings[1, 4:] = 1.0
    src_paddings[2, 2:] = 1.0
    tgt = rng.randint(0, _V, size=[batch, length]).astype(np.int32)
    tgt[:, 0] = vocab.BOS_ID
    for shared in (True, False):
      with self.session(graph=tf.Graph()) as sess, cluster_factory.SetEval(
          True):
        task = self._UntrainedTask(length, shared_embedding=shared)
        encoded = task.Encode(task.theta, tf.constant(src),
                              tf.constant(src_paddings))
        full = task.DecoderLogits(task.theta, encoded, tf.constant(tgt))
        caches, sources = task.InitDecodeState(task.theta, encoded, batch)
        steps = []
        for t in range(length):
          logits, caches = task.StepLogits(task.theta, tf.constant(tgt[:, t]),
                                           tf.constant(t), caches, sources)
          steps.append(logits)
        sess.run(tf.global_variables_initializer())
        full, steps = sess.run([full, tf.stack(steps, axis=1)])
      self.assertEqual(steps.shape, (batch, length, _V))
      self.assertGreater(np.std(full), 0.5)  # not a degenerate model
      self.assertAllClose(steps, full, atol=1e-4, rtol=1e-4)

  def testStepPartsMakeTheStep(self):
    # A decoder layer's step run part by part, each part with only its own
    # weights (PartTheta), is its ExtendStep bit for bit; a layer without
    # cross-attention has no such part.
    rng = np.random.RandomState(2)
    for cross in (True, False):
      with self.session(graph=tf.Graph()) as sess:
        p = blocks.DecoderLayer.Params().Set(
            name='dec', model_dim=8, hidden_dim=16, num_heads=2,
            has_cross_attention=cross, final_layer_norm=True)
        layer = p.Instantiate()
        parts = layer.StepParts()
        self.assertEqual(parts, ['self_atten'] +
                         (['cross_atten'] if cross else []) + ['ffn'])
        src = tf.constant(rng.normal(size=[3, 4, 8]), tf.float32)
        cache, source = layer.InitDecodeState(
            layer.theta, 3, 5, src if cross else None,
            tf.zeros([3, 4]) if cross else None)
        x = tf.constant(rng.normal(size=[3, 1, 8]), tf.float32)
        whole = layer.ExtendStep(layer.theta, x, tf.constant(2), cache,
                                 source)
        y, part_cache = x, cache
        for part in parts:
          theta = layer.PartTheta(layer.theta, [part])
          y, part_cache = layer.ExtendStepPart(theta, part, y, tf.constant(2),
                                               part_cache, source)
        self.assertEqual(sorted(layer.PartTheta(layer.theta, ['ffn']).keys()),
                         ['ffn', 'ffn_ln', 'final_ln'])
        sess.run(tf.global_variables_initializer())
        whole, split = sess.run([whole, (y, part_cache)])
        self.assertAllEqual(whole[0], split[0])
        self.assertAllEqual(whole[1], split[1])
        if not cross:
          with self.assertRaisesRegex(ValueError, r"no step part 'cross_"):
            layer.ExtendStepPart(layer.theta, 'cross_atten', x,
                                 tf.constant(0), cache, source)

  def testGreedyDecodeEqualsArgmaxOfFullPrefixLogits(self):
    batch, length = 4, 6
    src = np.random.RandomState(2).randint(
        4, _V, size=[batch, 5]).astype(np.int32)
    with self.session(graph=tf.Graph()) as sess, cluster_factory.SetEval(True):
      task = self._UntrainedTask(length)
      src_t = tf.constant(src)
      paddings = tf.zeros([batch, 5])
      ids, _ = task.GreedyDecode(task.theta, src_t, paddings)
      prefix = tf.placeholder(tf.int32, [batch, None])
      full = task.DecoderLogits(
          task.theta, task.Encode(task.theta, src_t, paddings), prefix)
      sess.run(tf.global_variables_initializer())
      decoded = sess.run(ids)
      # The reference: argmax of the recomputed prefix, one position a run.
      inputs = np.full([batch, 1], vocab.BOS_ID, np.int32)
      expected = np.zeros([batch, length], np.int32)
      finished = np.zeros([batch], bool)
      for t in range(length):
        token = sess.run(full, {prefix: inputs})[:, t].argmax(-1)
        token = np.where(finished, vocab.PAD_ID, token)
        expected[:, t] = token
        finished |= token == vocab.EOS_ID
        inputs = np.concatenate([inputs, token[:, None]], 1)
    self.assertAllEqual(decoded, expected)

  def testBleuPerPairAndOverall(self):
    hyps = ['one two three four', 'a b c d e', 'сто сорок два', 'x']
    refs = ['one two three four', 'a b c d f', 'сто сорок два', 'y']
    pairs = ['fr-en', 'fr-en', 'en-ru', 'en-ru']
    scores = bleu.BleuByPair(hyps, refs, pairs)
    self.assertEqual(list(scores), ['overall', 'en-ru', 'fr-en'])
    self.assertAllClose(scores['fr-en'],
                        bleu.CorpusBleu(hyps[:2], refs[:2]))
    self.assertGreater(scores['fr-en'], 70.0)
    self.assertLess(scores['fr-en'], 100.0)
    # Three-word sentences have no 4-grams: effective order keeps BLEU > 0.
    self.assertGreater(scores['en-ru'], 50.0)
    self.assertAlmostEqual(bleu.CorpusBleu(refs, refs), 100.0, places=3)
    metric = bleu.SacreBleuMetric()
    for h, r in zip(hyps, refs):
      metric.Update(r, h)
    self.assertAllClose(metric.value, scores['overall'])


if __name__ == '__main__':
  tf.test.main()
