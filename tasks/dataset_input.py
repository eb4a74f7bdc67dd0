"""A Lingvo input generator over a deterministic, resumable tf.data pipeline.

Every input of this project (tfds data sets, the digits and number corpora) is
a subclass that implements ``Examples()``: a tf.data.Dataset of single
examples (dicts of tensors with static shapes). This base class shuffles them
with a fixed seed, repeats, batches with a fixed batch size (remainder
dropped, so the pipeline always sees static shapes) and skips
``p.skip_batches`` batches first. The trainer sets ``skip_batches`` to the
number of batches already consumed when it resumes from a checkpoint, so a
resumed run sees exactly the batches an uninterrupted run would have seen.

``LoadTfds`` reads a prepared tensorflow-datasets data set for the inputs
that use one, and says how to prepare it when it is missing.

With ``p.skip_at_initialization`` the skip is not part of the graph but fed
when the input's iterator is initialized (an initializable iterator: its
initializer and the skip's placeholder are in the graph collections
``INITIALIZERS`` and ``SKIPS``): the trainer keeps a built training graph
across a restart of its workers and starts it at the newest checkpoint's
batch.

With ``p.stand_in`` an input yields batches of zeros shaped like its
examples (``ExampleSpecs()``), without reading any data: a graph that needs
the input's structure but not its values (the trainer's GPU audit) builds
also where the data set is not prepared.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import py_utils

# Graph collections of an input with p.skip_at_initialization: its
# iterator's initializer, and the int64 placeholder of the batches to skip
# (defaulting to p.skip_batches) that the initializer reads.
INITIALIZERS = 'gpipe_input_initializers'
SKIPS = 'gpipe_input_skips'


def LoadTfds(name, split, data_dir=None, download=False, hint='', **kwargs):
  """A tfds data set's split, files in order, or an error saying what to do.

  Args:
    name: the tfds name, with its config if any ('wmt14_translate/de-en').
    split: e.g. 'train', 'test'.
    data_dir: where the prepared data is (None: tfds's default,
      ~/tensorflow_datasets).
    download: let tfds download and prepare a missing data set there.
    hint: more advice for the error message, e.g. about a manual download.
    **kwargs: more arguments of ``tfds.load``.

  Returns:
    The ``tf.data.Dataset`` of ``tfds.load``.

  Raises:
    ValueError: the data set is not prepared in `data_dir` (and could not
      be downloaded): names it, the data_dir, and how to prepare it.
  """
  # Imported here: tensorflow_datasets is slow to import and only the tfds
  # inputs need it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    return tfds.load(name, split=split, data_dir=data_dir, download=download,
                     shuffle_files=False, **kwargs)
  except (AssertionError, FileNotFoundError,
          tfds.core.DatasetNotFoundError) as e:
    raise ValueError(
        'tfds data set %r (split %r) is not prepared in data_dir %r '
        '(download=%s). Prepare it on a machine with network access '
        '(`tfds build %s --data_dir=DIR`, then copy DIR over) and point '
        'data_dir at it (trainer: --model_params_override=input.data_dir='
        'DIR)%s. Cause: %s' % (name, split, data_dir, download, name, hint,
                               e)) from e


class DatasetInput(base_input_generator.BaseInputGenerator):
  """Batches of `Examples()`, resumable by `skip_batches`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('shuffle_buffer', 10000,
             'Examples in the shuffle buffer; 0 or 1 keeps the order.')
    p.Define('seed', 1234, 'Shuffle seed: the same seed, the same batches.')
    p.Define('repeat', True,
             'Cycle through the data forever (training); False yields one '
             'pass (evaluation), with the last partial batch dropped.')
    p.Define('skip_batches', 0,
             'Batches to skip first (set by the trainer when it resumes).')
    p.Define('skip_at_initialization', False,
             'Feed the batches to skip when the iterator is initialized '
             '(collections INITIALIZERS and SKIPS) instead of building them '
             'into the graph: a kept graph resumes anywhere.')
    p.Define('stand_in', False,
             'Yield zeros shaped like the examples (ExampleSpecs) instead of '
             'the data: for building graphs without the data set (the '
             "trainer's GPU audit). Never for training.")
    return p

  def Examples(self):
    """The unbatched tf.data.Dataset of examples (a dict per example)."""
    raise NotImplementedError('DatasetInput subclasses implement Examples()')

  def ExampleSpecs(self):
    """{field: tf.TensorSpec} of one example, as Examples() yields them.

    Needed for ``p.stand_in`` only.
    """
    raise NotImplementedError(
        '%s cannot stand in for its data: it does not implement '
        'ExampleSpecs()' % type(self).__name__)

  def _StandInExamples(self):
    """Zeros ('' for strings) of ExampleSpecs(), forever."""
    zeros = {
        k: tf.fill(spec.shape, tf.constant('' if spec.dtype == tf.string
                                           else 0, spec.dtype))
        for k, spec in self.ExampleSpecs().items()
    }
    return tf.data.Dataset.from_tensors(zeros).repeat()

  def Dataset(self, skip=None):
    """The batched dataset this generator reads from.

    Args:
      skip: the batches to skip first, a scalar int64 tensor (default:
        p.skip_batches).
    """
    p = self.params
    if p.batch_size <= 0:
      raise ValueError('%s: batch_size must be > 0, got %d' %
                       (p.name, p.batch_size))
    if p.stand_in:
      return self._StandInExamples().batch(p.batch_size, drop_remainder=True)
    ds = self.Examples()
    if p.shuffle_buffer > 1:
      ds = ds.shuffle(p.shuffle_buffer, seed=p.seed,
                      reshuffle_each_iteration=True)
    if p.repeat:
      ds = ds.repeat()
    ds = ds.batch(p.batch_size, drop_remainder=True)
    if skip is not None:
      ds = ds.skip(skip)
    elif p.skip_batches:
      ds = ds.skip(p.skip_batches)
    return ds.prefetch(2)

  def _InputBatch(self):
    p = self.params
    if not p.skip_at_initialization:
      iterator = tf.data.make_one_shot_iterator(self.Dataset())
      return py_utils.NestedMap(iterator.get_next())
    skip = tf.compat.v1.placeholder_with_default(
        tf.constant(p.skip_batches, tf.int64), [], name='skip_batches')
    iterator = tf.data.make_initializable_iterator(self.Dataset(skip))
    tf.compat.v1.add_to_collection(INITIALIZERS, iterator.initializer)
    tf.compat.v1.add_to_collection(SKIPS, skip)
    return py_utils.NestedMap(iterator.get_next())
