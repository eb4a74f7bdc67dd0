"""Lingvo's squared norms built with Square ops instead of Pow.

Lingvo's learner, on every training step, takes the global norm of all the
gradients and of all the variables (its ``grad_norm/all`` and
``var_norm/all`` metrics, and the scale of gradient clipping), and, for its
summaries, the norm of each variable and of its gradient. Each comes from
``lingvo.core.py_utils.SumSquared``, which squares a tensor as ``v**2``:
TensorFlow's ``Pow`` op. On CPUs, the Pow kernel runs a general power
function on every element, where ``Square`` needs one multiply. In a
traced step of ``mt.NumbersSmall`` the Pow ops took 93 of the two workers'
603 ms of op time, and the trainer's step ran 1.20-1.23x as fast with Square
(docs/BENCHMARKS.md, "Lingvo's norms: Square, not Pow").

The sums do not change beyond rounding. ``Square`` is exactly rounded,
while ``Pow`` can be one ulp off on some elements (up to 1.2e-7 relative in
float32). Only the norms change; the loss, the gradients and the update
are built as before.

``SquareNorms()`` swaps ``py_utils.SumSquared`` for the Square form while a
graph is built, then puts Lingvo's back, so Lingvo outside that block is
unchanged. The trainer builds its graphs inside it unless
``--square_norms=false``.
"""

import contextlib

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import py_utils


def SumSquared(tensors):
  """The sum of the squares of every element of `tensors`, built with Square.

  Args:
    tensors: Tensors or tf.IndexedSlices (their values are summed). Each one's
      sum is placed on that tensor's device, as in Lingvo.

  Returns:
    A scalar Tensor: 0.0 for an empty list.
  """
  with tf.name_scope('SumSquared'):
    sums = []
    for t in tensors:
      with tf.device(t.device):
        values = t.values if isinstance(t, tf.IndexedSlices) else t
        sums.append(tf.reduce_sum(tf.square(values)))
    if not sums:
      return tf.constant(0.0)
    return tf.add_n(sums)


@contextlib.contextmanager
def SquareNorms(enabled=True):
  """Lingvo's ``py_utils.SumSquared`` is ``SumSquared`` inside the block.

  Args:
    enabled: False leaves Lingvo's own in place (the block does nothing).

  Yields:
    Nothing. Lingvo's function is restored on leaving the block, even when
    the block raises.
  """
  if not enabled:
    yield
    return
  lingvos = py_utils.SumSquared
  py_utils.SumSquared = SumSquared
  try:
    yield
  finally:
    py_utils.SumSquared = lingvos
