"""Prints this machine's speed: a pinned one-core float32 1024^3 matmul.

``./test.sh`` prints it beside the slowest test targets, so that a reader
can tell a slow machine from a slow change: machines of one kind differ
about 2x (e.g. ~200 GFLOP/s on one, ~90 on another).
"""

import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

SIZE = 1024
REPEATS = 20


def MatmulRate():
  """GFLOP/s of a float32 SIZE^3 matmul on one pinned core (median of 3)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  except (AttributeError, OSError):
    pass  # Not Linux: unpinned.
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  a = tf.constant(np.random.RandomState(0).rand(SIZE, SIZE), tf.float32)

  @tf.function
  def Chain(x):
    for _ in range(REPEATS):
      x = tf.matmul(x, a) * (1.0 / SIZE)
    return x

  Chain(a).numpy()  # Traced and warmed up.
  rates = []
  for _ in range(3):
    start = time.perf_counter()
    Chain(a).numpy()
    rates.append(2.0 * SIZE**3 * REPEATS / (time.perf_counter() - start))
  return sorted(rates)[1] / 1e9


if __name__ == '__main__':
  print('%.0f GFLOP/s' % MatmulRate())
