"""How long a session run takes: the median (or least) of timed runs.

Used wherever a cost is measured by running a graph: the 'time' partition
cost (``gpipe.partition``), the planner's profile (``gpipe.plan.profiling``)
and the decode cut's step costs (``tasks.mt.decode_cut``).
"""

import statistics
import time


def RunSeconds(sess, fetch, feed_dict=None, repeats=5, warmup=1,
               statistic=statistics.median):
  """Seconds of ``sess.run(fetch, feed_dict)``.

  Args:
    sess: the session.
    fetch: what to run.
    feed_dict: the feeds, or None.
    repeats: timed runs.
    warmup: untimed runs first (the first run of a graph builds its
      kernels and functions).
    statistic: of the timed runs: the median, or ``min`` where other work on
      the machine may slow some runs down.

  Returns:
    The statistic of the timed runs' wall seconds.
  """
  for _ in range(warmup):
    sess.run(fetch, feed_dict)
  runs = []
  for _ in range(repeats):
    start = time.perf_counter()
    sess.run(fetch, feed_dict)
    runs.append(time.perf_counter() - start)
  return float(statistic(runs))
