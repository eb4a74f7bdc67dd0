"""Measuring a pipeline: what a traced step did and what the model holds.

* ``timeline``: the tasks of a traced step (start, end, recompute) parsed from
  TensorFlow's step stats, bubbles, a PNG and a Perfetto/Chrome trace;
* ``memory``: peak memory per device from a traced step;
* ``param_count``: parameter counts and bytes of layers and stages;
* ``run_time``: how long a session run takes (median of timed runs).
"""
