"""Image inputs: tensorflow-datasets classification sets and offline digits.

Every example is ``{'image': float32 [size, size, channels], 'label': int32}``
(``p.feature_dtype=tf.float64``: the same images, computed in float32 and
widened, for a float64 model compared to rounding error).

* `TfdsImageInput` reads a prepared tfds data set (imagenet2012 from its
  manual download dir, cifar10, cifar100, and the paper's transfer sets that
  tfds has: oxford_iiit_pet, food101, cars196, caltech_birds2011, ...). The
  paper's augmentation: resize to ``image_size`` (480 in the paper), random
  horizontal flip and cutout in training.
* `DigitsInput` is the offline default: scikit-learn's 1,797 real 8x8
  handwritten digits (shipped inside the package, no download), split into
  train/test by a fixed permutation and upsampled to ``image_size``.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from lingvo import compat as tf
from tasks import dataset_input

# Per-channel mean / stddev of ImageNet RGB in [0, 1] (the usual constants).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STDDEV = (0.229, 0.224, 0.225)


def Cutout(image, size, seed):
  """Zeroes a `size` x `size` square at a random centre of `image` [h, w, c].

  The square is clipped at the borders (as in DeVries & Taylor, 2017).

  Args:
    image: a float [height, width, channels] tensor with static shape.
    size: side of the square in pixels (0: no-op).
    seed: an int [2] stateless seed of the random centre.

  Returns:
    The image with the square set to 0.
  """
  if size <= 0:
    return image
  height, width = image.shape[0], image.shape[1]
  center = tf.random.stateless_uniform([2], seed=seed)
  cy = tf.cast(center[0] * height, tf.int32)
  cx = tf.cast(center[1] * width, tf.int32)
  rows = tf.range(height)[:, None]
  cols = tf.range(width)[None, :]
  inside = ((rows >= cy - size // 2) & (rows < cy - size // 2 + size) &
            (cols >= cx - size // 2) & (cols < cx - size // 2 + size))
  return image * tf.cast(~inside, image.dtype)[:, :, None]


class ImageInput(dataset_input.DatasetInput):
  """Shared preprocessing: resize, flip/cutout in training, normalization."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('image_size', 224, 'Output height and width.')
    p.Define('num_channels', 3, 'Output channels.')
    p.Define('is_training', True,
             'Apply the training augmentation (flip, cutout).')
    p.Define('random_flip', True, 'Random horizontal flips in training.')
    p.Define('cutout_size', 0, 'Side of the cutout square in training (0: off).')
    p.Define('mean', IMAGENET_MEAN, 'Per-channel mean subtracted ([0, 1]).')
    p.Define('stddev', IMAGENET_STDDEV, 'Per-channel stddev divided by.')
    p.Define('feature_dtype', tf.float32,
             'dtype of the images (tf.float64 with task.dtype=float64, for '
             'comparisons to rounding error).')
    return p

  def Preprocess(self, index, image, label):
    """Turns one decoded example into the model's input.

    Args:
      index: the example's position in the stream (seeds its augmentation).
      image: [height, width, channels] uint8 or float in [0, 1].
      label: integer class id.

    Returns:
      {'image': [image_size, image_size, num_channels] of p.feature_dtype,
      'label': int32}.
    """
    p = self.params
    if image.dtype == tf.uint8:
      image = tf.image.convert_image_dtype(image, tf.float32)
    image = tf.cast(image, tf.float32)
    if image.shape.rank == 2:
      image = image[:, :, None]
    image = tf.image.resize(image, [p.image_size, p.image_size])
    image = tf.ensure_shape(image, [p.image_size, p.image_size, None])
    channels = image.shape[-1]
    if channels == 1 and p.num_channels > 1:
      image = tf.broadcast_to(image, [p.image_size, p.image_size,
                                      p.num_channels])
    elif channels != p.num_channels:
      raise ValueError('%s: images have %s channels but num_channels is %d; '
                       'set num_channels to match the data.' %
                       (p.name, channels, p.num_channels))
    image = (image - tf.constant(p.mean, tf.float32)) / tf.constant(
        p.stddev, tf.float32)
    if p.is_training:
      seed = tf.stack([tf.constant(p.seed, tf.int64),
                       tf.cast(index, tf.int64)])
      if p.random_flip:
        image = tf.image.stateless_random_flip_left_right(image, seed)
      # After normalization, so the cut square is the mean colour (0).
      image = Cutout(image, p.cutout_size, seed + [0, 1 << 40])
    return {'image': tf.cast(image, p.feature_dtype),
            'label': tf.cast(label, tf.int32)}


  def ExampleSpecs(self):
    """One example as Preprocess returns it (for p.stand_in)."""
    p = self.params
    return {
        'image': tf.TensorSpec([p.image_size, p.image_size, p.num_channels],
                               p.feature_dtype),
        'label': tf.TensorSpec([], tf.int32),
    }

  def PreprocessAll(self, ds):
    """Maps Preprocess over a dataset of (image, label) pairs.

    Augmentation is seeded by the position in the stream (stateless, so the
    batches are reproducible); training streams repeat here, before the
    positions are counted, so every epoch gets new flips and cutouts.

    Args:
      ds: a tf.data.Dataset of (image, label).

    Returns:
      A dataset of {'image', 'label'} dicts.
    """
    p = self.params
    if p.is_training and p.repeat:
      ds = ds.repeat()
    return ds.enumerate().map(
        lambda index, example: self.Preprocess(index, *example),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class TfdsImageInput(ImageInput):
  """A tensorflow-datasets image classification set (see module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dataset', 'cifar10', 'tfds builder name, e.g. imagenet2012.')
    p.Define('split', 'train', 'tfds split, e.g. train, test, validation.')
    p.Define('data_dir', None, 'tfds data dir (None: the tfds default).')
    p.Define('manual_dir', '',
             'Directory with manually downloaded archives (imagenet2012).')
    p.Define('download', False,
             'Let tfds download and prepare a missing data set into data_dir '
             '(needs network access). False: it must be prepared already '
             '(`tfds build`), or given as archives in manual_dir.')
    return p

  def Examples(self):
    """Preprocessed examples of `p.dataset` / `p.split`."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    p = self.params
    kwargs = {}
    if p.manual_dir:
      kwargs['download_and_prepare_kwargs'] = {
          'download_config': tfds.download.DownloadConfig(
              manual_dir=p.manual_dir)
      }
    ds = dataset_input.LoadTfds(
        p.dataset, p.split, p.data_dir,
        download=p.download or bool(p.manual_dir),
        hint=(', or set download=True where tfds can fetch it (imagenet2012: '
              'set manual_dir to the directory holding the ILSVRC2012 tar '
              'files)'), as_supervised=True, **kwargs)
    return self.PreprocessAll(ds)


def DigitsSplit(split, num_test=360, split_seed=0):
  """scikit-learn's digits as numpy: a fixed train/test split.

  Args:
    split: 'train' or 'test'.
    num_test: how many of the 1,797 images are held out for 'test'.
    split_seed: seed of the permutation that defines the split.

  Returns:
    (images float32 [n, 8, 8] in [0, 1], labels int32 [n]).

  Raises:
    ValueError: for an unknown split.
  """
  # Imported here to keep scikit-learn off the import path of other inputs.
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  if split not in ('train', 'test'):
    raise ValueError("digits split must be 'train' or 'test', got %r" % split)
  digits = datasets.load_digits()
  order = np.random.RandomState(split_seed).permutation(len(digits.target))
  chosen = order[:num_test] if split == 'test' else order[num_test:]
  images = (digits.images[chosen] / 16.0).astype(np.float32)
  return images, digits.target[chosen].astype(np.int32)


class DigitsInput(ImageInput):
  """The offline default: scikit-learn digits (real, 8x8, 10 classes)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('split', 'train', "'train' or 'test'.")
    p.Define('num_test', 360, 'Digits held out for the test split (of 1,797).')
    p.Define('split_seed', 0, 'Seed of the fixed train/test permutation.')
    p.image_size = 16
    p.num_channels = 1
    p.random_flip = False  # Mirrored digits are other symbols.
    p.mean = (0.5,)
    p.stddev = (0.5,)
    p.shuffle_buffer = 2000
    return p

  def Examples(self):
    """Preprocessed digits of `p.split`."""
    p = self.params
    images, labels = DigitsSplit(p.split, p.num_test, p.split_seed)
    return self.PreprocessAll(
        tf.data.Dataset.from_tensor_slices((images, labels)))
