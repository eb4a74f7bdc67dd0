"""Lingvo's squared norms built with Square ops instead of Pow.

Lingvo's learner, on every training step, takes the global norm of all the
gradients and of all the variables (its ``grad_norm/all`` and
``var_norm/all`` metrics, and the scale of global-norm gradient clipping);
it also builds a norm summary per variable, and the L2 regularization loss
of ``AdjustGradientsWithLpLoss``. Each comes from
``lingvo.core.py_utils.SumSquared``, which squares a tensor as ``v**2``:
TensorFlow's ``Pow`` op. Grappler's arithmetic optimizer would rewrite it
to ``Square``, but the trainer turns Grappler off for its session's graph,
where the learner's ops live (``--session_graph_optimizer``: the whole-graph
passes cost much of a large pipeline's first step). On CPUs the Pow kernel
runs a general power function on every element, where ``Square`` needs one
multiply. In a traced step of ``mt.NumbersSmall`` the Pow ops took 93 of
the two workers' 603 ms of op time, and the trainer's step ran 1.05-1.57x
as fast with Square, data-parallel most (docs/BENCHMARKS.md, "Lingvo's
norms: Square, not Pow").

The sums change only in rounding: Square is exactly rounded, Pow and Square
differ by one unit in the last place on some elements (at most 1.2e-7
relative in float32). The metrics match to that precision; where global-norm
clipping scales the gradients (the Transformers' params), the update moves
by as little, so training is no longer bit for bit that of Lingvo's ops.

``SquareNorms()`` swaps ``py_utils.SumSquared`` for the Square form while a
graph is built, then puts back what was there, so Lingvo outside that block
is unchanged. The trainer builds its graphs inside it unless
``--square_norms=false``.
"""

import contextlib
import threading

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import py_utils

# Lingvo's own, as imported.
_LINGVOS = py_utils.SumSquared
# One block at a time in the process: the swap is of a module attribute.
_LOCK = threading.RLock()


def SumSquared(tensors):
  """The sum of the squares of every element of `tensors`, built with Square.

  Args:
    tensors: Tensors or tf.IndexedSlices (their values are summed). Each one's
      sum is placed on that tensor's device, as in Lingvo.

  Returns:
    A scalar Tensor: a float32 0.0 for an empty list.
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

  Blocks of other threads wait for this one to end; a block nested in it
  (of this thread) installs its own choice until it ends.

  Args:
    enabled: False makes it Lingvo's own inside the block.

  Yields:
    Nothing. What was there before is put back on leaving the block, even
    when the block raises.
  """
  with _LOCK:
    previous = py_utils.SumSquared
    try:
      py_utils.SumSquared = SumSquared if enabled else _LINGVOS
      yield
    finally:
      py_utils.SumSquared = previous
