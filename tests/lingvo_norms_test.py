"""Lingvo's learner's squared norms built with Square: the same sums, no Pow.

gpipe/compat/lingvo_norms.py swaps Lingvo's ``py_utils.SumSquared`` (``v**2``,
a Pow op per tensor) for a Square form while the trainer builds its graph.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from unittest import mock

import numpy as np
from gpipe.compat import lingvo_norms
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import summary_utils
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import model_graph

# Lingvo's own, as imported (before any block swapped it).
LINGVOS = py_utils.SumSquared


def _OpTypes(graph, scope):
  """The types of the ops of `graph` whose names have `scope` in them."""
  return sorted({op.type for op in graph.get_operations() if scope in op.name})


class SumSquaredTest(test_utils.TestCase):

  def testTheSameSumsAsLingvosWithoutPow(self):
    rng = np.random.default_rng(3)
    dense = [rng.standard_normal(shape).astype(np.float32) *
             scale for shape, scale in (((64, 33), 1e-3), ((7,), 1.0),
                                        ((5, 4, 3), 1e3))]
    rows = rng.standard_normal((3, 6)).astype(np.float32)
    with self.session(graph=tf.Graph()) as sess:
      # Slices of one row twice: their values are summed, not the rows.
      tensors = [tf.constant(x) for x in dense] + [tf.IndexedSlices(
          tf.constant(rows), tf.constant([0, 4, 0]), tf.constant([9, 6]))]
      with tf.name_scope('ours'):
        ours = lingvo_norms.SumSquared(tensors)
      with tf.name_scope('lingvos'):
        lingvos = LINGVOS(tensors)
      empty = lingvo_norms.SumSquared([])
      got, want, zero = sess.run([ours, lingvos, empty])
      graph = sess.graph
    exact = sum(np.sum(x.astype(np.float64) ** 2) for x in dense + [rows])
    self.assertAllClose(got, exact, rtol=1e-6)
    self.assertAllClose(got, want, rtol=1e-6)
    self.assertEqual(zero, 0.0)
    self.assertEqual(empty.dtype, tf.float32)
    self.assertIn('Square', _OpTypes(graph, 'ours/'))
    self.assertNotIn('Pow', _OpTypes(graph, 'ours/'))
    # What the swap removes: Lingvo squares with Pow.
    self.assertIn('Pow', _OpTypes(graph, 'lingvos/'))

  def testSquareAndPowDifferByAtMostOneUlpPerElement(self):
    x = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)
    with self.session(graph=tf.Graph()) as sess:
      pow2, square = sess.run([tf.constant(x)**2, tf.square(x)])
    ulp = np.spacing(np.maximum(np.abs(pow2), np.abs(square)))
    self.assertTrue(np.all(np.abs(pow2 - square) <= ulp))
    # Square is exactly rounded.
    self.assertTrue(np.array_equal(square, x * x))

  def testLingvosIsSwappedInsideTheBlockOnly(self):
    with tf.Graph().as_default() as graph:
      v = tf.ones([4, 4])
      with lingvo_norms.SquareNorms():
        self.assertIs(py_utils.SumSquared, lingvo_norms.SumSquared)
        with tf.name_scope('inside'):
          # Lingvo's summaries reach it through py_utils too.
          summary_utils.AddNormSummary('w', [py_utils.VarGrad(v, v)])
      self.assertIs(py_utils.SumSquared, LINGVOS)
      with tf.name_scope('outside'):
        summary_utils.AddNormSummary('w', [py_utils.VarGrad(v, v)])
    self.assertNotIn('Pow', _OpTypes(graph, 'inside/'))
    self.assertIn('Square', _OpTypes(graph, 'inside/'))
    self.assertIn('Pow', _OpTypes(graph, 'outside/'))
    # Put back when the block raises; Lingvo's when not enabled, nested
    # blocks too.
    with self.assertRaises(ValueError):
      with lingvo_norms.SquareNorms():
        raise ValueError('a failed build')
    self.assertIs(py_utils.SumSquared, LINGVOS)
    with lingvo_norms.SquareNorms(enabled=False):
      self.assertIs(py_utils.SumSquared, LINGVOS)
    with lingvo_norms.SquareNorms():
      with lingvo_norms.SquareNorms(enabled=False):
        self.assertIs(py_utils.SumSquared, LINGVOS)
      self.assertIs(py_utils.SumSquared, lingvo_norms.SumSquared)
    self.assertIs(py_utils.SumSquared, LINGVOS)

  def testEachSumIsOnItsTensorsDevice(self):
    with tf.Graph().as_default() as graph:
      with tf.device('/device:CPU:1'):
        a = tf.ones([3])
      with tf.device('/device:CPU:2'):
        b = tf.ones([2, 2])
      with tf.name_scope('norms'):
        lingvo_norms.SumSquared([a, b])
    devices = {op.type + ':' + op.inputs[0].op.name: op.device
               for op in graph.get_operations()
               if op.name.startswith('norms/') and op.type == 'Square'}
    self.assertEqual(sorted(devices.values()),
                     ['/device:CPU:1', '/device:CPU:2'])


class TrainerNormsTest(test_utils.TestCase):
  """The trainer's graph: Square unless --square_norms=false; same losses."""

  def _Train(self, square_norms):
    built = []
    build = model_graph.Build

    def Capture(*args, **kwargs):
      built.append(build(*args, **kwargs))
      return built[-1]

    logdir = self.create_tempdir().full_path
    settings = trainer_testlib.ResumableSettings(100)
    with mock.patch.object(model_graph, 'Build', Capture):
      code, _, err = trainer_testlib.RunInProcess(
          logdir=logdir, max_steps=3, square_norms=square_norms, **settings)
    self.assertEqual(code, 0, err)
    self.assertLen(built, 1)
    return built[0].graph, trainer_testlib.Losses(
        logdir, 'grad_norm/all/loss', 'var_norm/all/loss')

  def testTheLearnersNormsUseSquareUnlessAskedAndTheMetricsAgree(self):
    graph, records = self._Train(True)
    # Lingvo's Pow form (its scope TransformAndSum) is not built at all.
    self.assertEmpty(_OpTypes(graph, 'TransformAndSum'))
    self.assertIn('Square', _OpTypes(graph, 'SumSquared'))
    lingvo_graph, lingvo_records = self._Train(False)
    self.assertIn('Pow', _OpTypes(lingvo_graph, 'TransformAndSum'))
    self.assertEmpty(_OpTypes(lingvo_graph, 'SumSquared'))
    # The norms the learner reports, step by step, to within rounding (the
    # toy does not clip: its losses are the same either way).
    self.assertEqual([r[0] for r in records], [1, 2, 3])
    self.assertEqual([r[0] for r in lingvo_records], [1, 2, 3])
    self.assertAllClose(records, lingvo_records, rtol=1e-6)
    self.assertTrue(all(g > 0 and v > 0 for _, _, g, v in records), records)


if __name__ == '__main__':
  tf.test.main()
