"""Image inputs: tfds pipelines on mock data, and the offline digits."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import tempfile

from absl.testing import parameterized
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tasks.image import inputs
import tensorflow_datasets as tfds
from tests import graph_rewrites

graph_rewrites.Off()


def _Batches(p, n=1):
  with tf.Graph().as_default():
    batch = p.Instantiate().GetPreprocessedInputBatch()
    with tf.Session() as sess:
      return [sess.run(batch) for _ in range(n)]


class TfdsImageInputTest(test_utils.TestCase, parameterized.TestCase):
  """The tfds sets of the paper, with tfds.testing.mock_data (no download)."""

  @parameterized.parameters(
      ('cifar10', 10, 'train'), ('cifar100', 100, 'test'),
      ('imagenet2012', 1000, 'validation'), ('oxford_iiit_pet', 37, 'train'),
      ('food101', 101, 'validation'), ('cars196', 196, 'train'))
  def testShapesAndLabels(self, dataset, num_classes, split):
    p = inputs.TfdsImageInput.Params().Set(
        name='input', dataset=dataset, split=split, image_size=24,
        batch_size=4, is_training=False, shuffle_buffer=0)
    if dataset == 'imagenet2012':
      p.manual_dir = tempfile.mkdtemp()
    with tfds.testing.mock_data(num_examples=8):
      (batch,) = _Batches(p)
    self.assertEqual(batch.image.shape, (4, 24, 24, 3))
    self.assertEqual(batch.image.dtype, np.float32)
    self.assertEqual(batch.label.dtype, np.int32)
    self.assertTrue(np.all((batch.label >= 0) & (batch.label < num_classes)))

  def testAugmentationFlipAndCutout(self):
    base = inputs.TfdsImageInput.Params().Set(
        name='input', dataset='cifar10', image_size=32, batch_size=8,
        shuffle_buffer=0, repeat=False, is_training=False, mean=(0.5,) * 3,
        stddev=(0.5,) * 3)
    aug = base.Copy().Set(is_training=True, random_flip=True, cutout_size=8)
    with tfds.testing.mock_data(num_examples=8):
      (plain,) = _Batches(base)
      (augmented,) = _Batches(aug)
      (again,) = _Batches(aug)
    self.assertAllEqual(plain.label, augmented.label)
    self.assertAllEqual(augmented.image, again.image)  # Deterministic.
    flipped = 0
    for x, y in zip(plain.image, augmented.image):
      cut = np.all(y == 0, axis=-1)
      # The cutout square (clipped at the border) is at most 8 x 8 pixels.
      self.assertBetween(int(cut.sum()), 16, 64)
      keep = ~cut
      if np.allclose(x[keep], y[keep]):
        continue
      self.assertAllClose(x[:, ::-1][keep], y[keep])
      flipped += 1
    self.assertBetween(flipped, 1, 7)

  def testMissingDataSaysHowToPrepareIt(self):
    p = inputs.TfdsImageInput.Params().Set(
        name='input', dataset='cifar10', batch_size=2,
        data_dir=tempfile.mkdtemp())
    with self.assertRaisesRegex(ValueError, r'not prepared.*tfds build cifar10'):
      _Batches(p)


class DigitsInputTest(test_utils.TestCase):
  """scikit-learn digits: real data, fixed disjoint split, upsampled."""

  def testSplitIsFixedAndDisjoint(self):
    train_x, train_y = inputs.DigitsSplit('train')
    test_x, test_y = inputs.DigitsSplit('test')
    self.assertEqual((len(train_y), len(test_y)), (1437, 360))
    self.assertEqual(set(np.unique(test_y)), set(range(10)))
    train_keys = {x.tobytes() for x in train_x}
    overlap = sum(x.tobytes() in train_keys for x in test_x)
    self.assertLess(overlap, 5)  # Only duplicate scans of the same digit.
    again_x, _ = inputs.DigitsSplit('test')
    self.assertAllEqual(test_x, again_x)
    with self.assertRaisesRegex(ValueError, "'train' or 'test'"):
      inputs.DigitsSplit('validation')

  def testBatches(self):
    p = inputs.DigitsInput.Params().Set(
        name='digits', split='test', batch_size=40, is_training=False,
        repeat=False, shuffle_buffer=0, image_size=16)
    with tf.Graph().as_default():
      batch = p.Instantiate().GetPreprocessedInputBatch()
      seen = 0
      with tf.Session() as sess:
        first = sess.run(batch)
        seen += 40
        while True:
          try:
            sess.run(batch)
            seen += 40
          except tf.errors.OutOfRangeError:
            break
    self.assertEqual(seen, 360)  # 9 full batches: every test digit.
    self.assertEqual(first.image.shape, (40, 16, 16, 1))
    self.assertBetween(float(first.image.min()), -1.0, -0.99)
    self.assertBetween(float(first.image.max()), 0.9, 1.0)
    _, test_y = inputs.DigitsSplit('test')
    self.assertAllEqual(first.label, test_y[:40])
    # In float64 (a model compared to rounding error): the same images.
    (wide,) = _Batches(p.Copy().Set(feature_dtype=tf.float64))
    self.assertEqual(np.float64, wide.image.dtype)
    self.assertAllClose(first.image, wide.image, rtol=1e-6, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
