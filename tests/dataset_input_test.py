"""tasks/dataset_input.py: the position of a resumable input.

A resumed run reads the batches an uninterrupted one would: built into the
graph (``skip_batches``), or fed when the iterator is initialized
(``skip_at_initialization``), so that one kept graph starts anywhere.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from lingvo import compat as tf
from lingvo.core import test_utils
from tasks import dataset_input
from tests import graph_rewrites

graph_rewrites.Off()


class _Numbers(dataset_input.DatasetInput):
  """0, 1, 2, ... shuffled by the base class."""

  def Examples(self):
    return tf.data.Dataset.range(40).map(lambda x: {'x': x})


def _Params(**kwargs):
  return _Numbers.Params().Set(name='numbers', batch_size=4,
                               shuffle_buffer=16, **kwargs)


def _FirstBatches(p, n, skip=None):
  """The first n batches' values; `skip` fed at initialization."""
  with tf.Graph().as_default() as graph:
    batch = p.Instantiate().GetPreprocessedInputBatch()
    init = graph.get_collection(dataset_input.INITIALIZERS)
    skips = graph.get_collection(dataset_input.SKIPS)
    with tf.Session() as sess:
      if init:
        sess.run(init, feed_dict={s: skip for s in skips}
                 if skip is not None else None)
      return [sess.run(batch).x.tolist() for _ in range(n)]


class DatasetInputPositionTest(test_utils.TestCase):

  def testASkipFedAtInitializationReadsTheBatchesOfOneBuiltIn(self):
    unskipped = _FirstBatches(_Params(), 8)
    self.assertLen({x for b in unskipped for x in b}, 32)
    self.assertEqual(unskipped[5:], _FirstBatches(_Params(skip_batches=5), 3))
    fed = _Params(skip_at_initialization=True)
    self.assertEqual(unskipped[:3], _FirstBatches(fed, 3))
    self.assertEqual(unskipped[5:], _FirstBatches(fed, 3, skip=5))
    # Unfed, the placeholder's default is p.skip_batches.
    self.assertEqual(unskipped[2:5],
                     _FirstBatches(fed.Copy().Set(skip_batches=2), 3))

  def testOneGraphStartsAgainAtAnotherBatch(self):
    unskipped = _FirstBatches(_Params(), 8)
    with tf.Graph().as_default() as graph:
      batch = _Params(skip_at_initialization=True).Instantiate(
      ).GetPreprocessedInputBatch()
      (init,) = graph.get_collection(dataset_input.INITIALIZERS)
      (skip,) = graph.get_collection(dataset_input.SKIPS)
      graph.finalize()  # Nothing is added to restart it.
      with tf.Session() as sess:
        sess.run(init, feed_dict={skip: 6})
        self.assertEqual(unskipped[6], sess.run(batch).x.tolist())
      with tf.Session() as sess:  # A restart: a new session, the same graph.
        sess.run(init, feed_dict={skip: 1})
        self.assertEqual(unskipped[1:3],
                         [sess.run(batch).x.tolist() for _ in range(2)])


if __name__ == '__main__':
  tf.test.main()
