"""Tests of the multilingual corpus, vocabulary tool and translation inputs."""

import io
import os
import re
import shutil
from unittest import mock

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
import tensorflow_datasets as tfds
from tasks.mt import corpus
from tasks.mt import inputs
from tasks.mt import vocab
from tools import build_vocab
from tests import graph_rewrites

graph_rewrites.Off()

_LANGS = ('en', 'fr', 'ru')


class CorpusTest(test_utils.TestCase):

  def testTrainAndTestNumbersAreDisjoint(self):
    train, test = corpus.SplitNumbers(1000, 0.1, seed=0)
    self.assertLen(test, 100)
    self.assertLen(train, 900)
    self.assertEmpty(set(train) & set(test))
    self.assertEqual(sorted(train + test), list(range(1000)))
    self.assertEqual((train, test), corpus.SplitNumbers(1000, 0.1, seed=0))

  def testManyToManyInTenLanguagesWithTargetTags(self):
    self.assertGreaterEqual(len(corpus.DEFAULT_LANGUAGES), 10)
    pairs = corpus.NumberPairs([342], corpus.DEFAULT_LANGUAGES)
    n = len(corpus.DEFAULT_LANGUAGES)
    self.assertLen(pairs, n * (n - 1))
    source, target, number = pairs[('fr', 'ru')][0]
    self.assertEqual(source, '<2ru> trois cent quarante-deux')
    self.assertEqual(target, 'триста сорок два')
    self.assertEqual(number, 342)

  def testUnknownLanguageSaysSo(self):
    with self.assertRaisesRegex(ValueError, 'cannot spell numbers'):
      corpus.Spell(3, 'xx')

  def testTemperatureSampling(self):
    sizes = {('a', 'b'): 900, ('a', 'c'): 100}
    proportional = corpus.PairSamplingProbs(sizes, 1.0)
    self.assertAllClose(list(proportional.values()), [0.9, 0.1])
    flatter = corpus.PairSamplingProbs(sizes, 5.0)
    # (0.9^0.2, 0.1^0.2) = (0.9791, 0.6310), normalized.
    self.assertAllClose(list(flatter.values()), [0.6081, 0.3919], atol=1e-4)
    nearly_uniform = corpus.PairSamplingProbs(sizes, 1000.0)
    self.assertAllClose(list(nearly_uniform.values()), [0.5, 0.5], atol=1e-3)
    with self.assertRaisesRegex(ValueError, 'temperature must be > 0'):
      corpus.PairSamplingProbs(sizes, 0.0)


class VocabAndInputsTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.prefix = os.path.join(tf.test.get_temp_dir(), 'numbers_spm')
    cls.vocab_path = build_vocab.main([
        '--corpus=numbers', '--output_prefix=' + cls.prefix,
        '--vocab_size=300', '--languages=' + ','.join(_LANGS),
        '--max_number=200'
    ])

  def testToolTrainsVocabWithTagTokens(self):
    self.assertEqual(self.vocab_path, self.prefix + '.model')
    v = vocab.Vocab(self.vocab_path)
    self.assertLessEqual(v.size, 300)
    ids = v.Encode('<2ru> deux')
    tag = v.PieceToId('<2ru>')
    self.assertNotEqual(tag, vocab.UNK_ID)
    self.assertIn(tag, ids)  # the tag is one token
    self.assertEqual(v.Decode(ids[ids.index(tag) + 1:]), 'deux')
    self.assertEqual(v.Decode(ids + [vocab.EOS_ID] + ids), '<2ru> deux')
    # Ids past the vocabulary (a softmax rounded up) are skipped, not a crash.
    self.assertEqual(v.Decode(ids + [v.size, v.size + 7]), '<2ru> deux')

  def testMissingVocabSaysHowToBuildIt(self):
    with self.assertRaisesRegex(FileNotFoundError, 'tools.build_vocab'):
      vocab.Vocab('/nonexistent/spm.model')
    # Not the number corpus's model: the input does not build it either.
    p = inputs.NumberTranslationInput.Params().Set(
        name='numbers', vocab_path='/nonexistent/spm.model', languages=_LANGS,
        max_number=200, batch_size=8)
    with self.assertRaisesRegex(FileNotFoundError, 'tools.build_vocab'):
      p.Instantiate().Examples()
    self.assertFalse(os.path.exists('/nonexistent'))

  def _MissingNumbersModel(self, name):
    """A NUMBERS_VOCAB path in a new temp dir, patched in for this test."""
    directory = os.path.join(self.get_temp_dir(), name)
    os.makedirs(directory)
    path = os.path.join(directory, 'numbers_spm.model')
    patcher = mock.patch.object(vocab, 'NUMBERS_VOCAB', path)
    patcher.start()
    self.addCleanup(patcher.stop)
    return path

  def testMissingNumbersModelIsBuiltOnFirstUseThenUsed(self):
    path = self._MissingNumbersModel('first_use')
    p = inputs.NumberTranslationInput.Params().Set(
        name='numbers', vocab_path=path, languages=_LANGS, max_number=200,
        batch_size=8, src_len=10, tgt_len=12, max_vocab_size=300)
    with mock.patch('sys.stderr', new_callable=io.StringIO) as stderr:
      with self.session(graph=tf.Graph()) as sess:
        batch = sess.run(p.Instantiate().GetPreprocessedInputBatch())
    self.assertRegex(
        stderr.getvalue(),
        r'^building the sentencepiece model %s from the numbers corpus '
        r'\(vocab 300\); once\nbuilt %s in \d+\.\d s\n$' %
        (re.escape(path), re.escape(path)))
    # Only the model and its .vocab are left, no scratch directory.
    self.assertCountEqual(os.listdir(os.path.dirname(path)),
                          ['numbers_spm.model', 'numbers_spm.vocab'])
    v = vocab.Vocab(path)
    self.assertLessEqual(v.size, 300)
    self.assertNotEqual(v.PieceToId('<2ru>'), vocab.UNK_ID)
    for i in range(8):
      self.assertEqual(v.Decode(batch.tgt_labels[i]),
                       batch.tgt_text[i].decode())
    # The second use (here the test split) loads it without building.
    mtime = os.path.getmtime(path)
    with mock.patch('sys.stderr', new_callable=io.StringIO) as stderr:
      test_input = p.Copy().Set(split='test').Instantiate()
      test_input.Examples()
    self.assertEqual(stderr.getvalue(), '')
    self.assertEqual(os.path.getmtime(path), mtime)
    loaded = test_input._Vocab()  # pylint: disable=protected-access
    self.assertEqual(loaded.size, v.size)

  def testConcurrentBuildKeepsTheFirstPublishedModel(self):
    path = self._MissingNumbersModel('concurrent')
    train = vocab.Train

    def _TrainWhileAnotherProcessFinishes(*args, **kwargs):
      built = train(*args, **kwargs)
      # Another process publishes its model while this one trains.
      shutil.copy(self.vocab_path, path)
      return built

    with mock.patch.object(vocab, 'Train', _TrainWhileAnotherProcessFinishes):
      with mock.patch('sys.stderr', new_callable=io.StringIO) as stderr:
        self.assertEqual(
            vocab.BuildNumbersModel(path, 200, _LANGS, max_number=200), path)
    self.assertIn('was built by another process meanwhile; using it',
                  stderr.getvalue())
    with open(path, 'rb') as mine, open(self.vocab_path, 'rb') as theirs:
      self.assertEqual(mine.read(), theirs.read())  # not overwritten
    self.assertEqual(os.listdir(os.path.dirname(path)), ['numbers_spm.model'])

  def testOnlyTheNumberInputBuildsTheNumbersModel(self):
    path = self._MissingNumbersModel('tfds')
    p = inputs.TfdsTranslationInput.Params().Set(
        name='wmt', dataset_name='wmt14_translate/de-en',
        language_pairs=[('de', 'en')], vocab_path=path, batch_size=4)
    with self.assertRaisesRegex(FileNotFoundError, 'tools.build_vocab'):
      p.Instantiate()._Vocab()  # pylint: disable=protected-access
    self.assertEmpty(os.listdir(os.path.dirname(path)))

  def testNumberInputBatches(self):
    p = inputs.NumberTranslationInput.Params().Set(
        name='numbers', vocab_path=self.vocab_path, languages=_LANGS,
        max_number=200, batch_size=8, src_len=10, tgt_len=12, temperature=2.0)
    with self.session(graph=tf.Graph()) as sess:
      batch = sess.run(p.Instantiate().GetPreprocessedInputBatch())
    self.assertEqual(batch.src_ids.shape, (8, 10))
    self.assertEqual(batch.tgt_ids.shape, (8, 12))
    self.assertEqual(batch.tgt_labels.shape, (8, 12))
    self.assertEqual(batch.pair.shape, (8,))
    v = vocab.Vocab(self.vocab_path)
    for i in range(8):
      src, tgt = batch.pair[i].decode().split('-')
      self.assertNotEqual(src, tgt)
      self.assertTrue(v.Decode(batch.src_ids[i]).startswith('<2%s>' % tgt))
      length = int(batch.tgt_weights[i].sum())
      # Decoder input is <s> + labels shifted right; labels end in </s>.
      self.assertEqual(batch.tgt_ids[i, 0], vocab.BOS_ID)
      self.assertAllEqual(batch.tgt_ids[i, 1:length],
                          batch.tgt_labels[i, :length - 1])
      self.assertEqual(batch.tgt_labels[i, length - 1], vocab.EOS_ID)
      self.assertEqual(v.Decode(batch.tgt_labels[i]),
                       batch.tgt_text[i].decode())

  def testVocabularyLargerThanTheModelIsRefused(self):
    p = inputs.NumberTranslationInput.Params().Set(
        name='numbers', vocab_path=self.vocab_path, languages=_LANGS,
        max_number=200, batch_size=8, max_vocab_size=100)
    with self.assertRaisesRegex(
        ValueError, r'has \d+ pieces but the model embeds only 100 ids; '
        r'rebuild it with tools.build_vocab --vocab_size=100'):
      p.Instantiate().Examples()

  def testNumberTestSplitHoldsOutNumbersPairByPair(self):
    p = inputs.NumberTranslationInput.Params().Set(
        name='numbers', vocab_path=self.vocab_path, languages=_LANGS,
        max_number=200, split='test', max_examples_per_pair=4)
    pairs = p.Instantiate().Pairs()
    self.assertLen(pairs, 6)
    _, test = corpus.SplitNumbers(200, 0.1, 0)
    for examples in pairs.values():
      self.assertLen(examples, 4)
      self.assertTrue(all(n in test for _, _, n in examples))

  def testWmtWithMockData(self):
    p = inputs.TfdsTranslationInput.Params().Set(
        name='wmt', dataset_name='wmt14_translate/de-en',
        language_pairs=[('de', 'en')], vocab_path=self.vocab_path,
        batch_size=4, src_len=8, tgt_len=9)
    with tfds.testing.mock_data(num_examples=16):
      with self.session(graph=tf.Graph()) as sess:
        batch = sess.run(p.Instantiate().GetPreprocessedInputBatch())
    self.assertEqual(batch.src_ids.shape, (4, 8))
    self.assertEqual(batch.tgt_labels.shape, (4, 9))
    self.assertEqual(set(batch.pair), {b'de-en'})
    v = vocab.Vocab(self.vocab_path)
    self.assertTrue(v.Decode(batch.src_ids[0]).startswith('<2en>'))

  def testTedMultiWithMockDataPicksRequestedPairs(self):
    p = inputs.TfdsTranslationInput.Params().Set(
        name='ted', dataset_name='ted_multi_translate',
        language_pairs=[('fr', 'en'), ('en', 'ru')],
        vocab_path=self.vocab_path, batch_size=3, src_len=8, tgt_len=8,
        repeat=False, shuffle_buffer=0)
    with tfds.testing.mock_data(as_dataset_fn=_TedTalks):
      with self.session(graph=tf.Graph()) as sess:
        batch = sess.run(p.Instantiate().GetPreprocessedInputBatch())
    # Pairs are concatenated in evaluation: fr-en (2 talks), then en-ru (1).
    self.assertEqual(list(batch.pair), [b'fr-en', b'fr-en', b'en-ru'])
    self.assertEqual(list(batch.tgt_text), [b'two', b'three', 'два'.encode()])
    v = vocab.Vocab(self.vocab_path)
    self.assertEqual(v.Decode(batch.src_ids[1]), '<2en> trois')

  def testToolBuildsVocabFromTfdsCorpus(self):
    prefix = os.path.join(self.get_temp_dir(), 'ted_spm')
    with tfds.testing.mock_data(as_dataset_fn=_TedTalks):
      sentences = inputs.TfdsSentences('ted_multi_translate', ['en', 'fr'])
      path = build_vocab.main([
          '--corpus=tfds', '--tfds_name=ted_multi_translate',
          '--data_dir=' + self.get_temp_dir(), '--languages=en,fr',
          '--output_prefix=' + prefix, '--vocab_size=40',
          '--model_type=char'])
    # Only the asked languages' texts, in order.
    self.assertEqual(sentences, ['two', 'deux', 'three', 'trois'])
    v = vocab.Vocab(path)
    self.assertEqual(v.Decode(v.Encode('<2fr> deux')), '<2fr> deux')
    with tfds.testing.mock_data(as_dataset_fn=_TedTalks):
      with self.assertRaisesRegex(ValueError, 'has no text in the languages'):
        inputs.TfdsSentences('ted_multi_translate', ['de'])

  def testMissingTfdsCorpusSaysHowToPrepareIt(self):
    data_dir = self.get_temp_dir()
    p = inputs.TfdsTranslationInput.Params().Set(
        name='ted', data_dir=data_dir, vocab_path=self.vocab_path,
        batch_size=2)
    with self.assertRaisesRegex(
        ValueError, r"'ted_multi_translate' \(split 'train'\) is not prepared "
        r"in data_dir '%s'.*tfds build ted_multi_translate --data_dir=DIR.*"
        r'input.data_dir=DIR' % data_dir):
      p.Instantiate().Examples()


_TALKS = [{
    'translations': {
        'language': np.array([b'en', b'fr', b'ru']),
        'translation': np.array([b'two', b'deux', b'\xd0\xb4\xd0\xb2\xd0\xb0']),
    },
    'talk_name': b'a'
}, {
    'translations': {
        'language': np.array([b'en', b'fr']),
        'translation': np.array([b'three', b'trois']),
    },
    'talk_name': b'b'
}]


def _TedTalks(*unused_args, **unused_kwargs):
  """ted_multi_translate's layout: two talks (tfds.testing.mock_data)."""
  return tf.data.Dataset.from_generator(
      lambda: iter(_TALKS),
      output_signature={
          'translations': {
              'language': tf.TensorSpec([None], tf.string),
              'translation': tf.TensorSpec([None], tf.string),
          },
          'talk_name': tf.TensorSpec([], tf.string),
      })


if __name__ == '__main__':
  tf.test.main()
