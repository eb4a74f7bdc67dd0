"""Measuring a pipeline: what a traced step did and what the model holds.

* ``timeline``: the tasks of a traced step (start, end, recompute) parsed from
  TensorFlow's step stats, bubbles, a PNG and a Perfetto/Chrome trace;
* ``memory``: peak memory per device from a traced step;
* ``param_count``: parameter counts and bytes of layers and stages;
* ``run_time``: how long a session run takes (median of timed runs);
* ``gpu_audit``: the ops of GPU stages without a GPU kernel for their dtypes
  and the host-GPU copies of each micro-batch, from TensorFlow's kernel
  registry (no GPU needed).

Layer 2 (``gpipe/__init__.py`` has the map): below the executor, which uses
it (costs, counts), above ``runtime/``; the planner's profiling of a model is
``gpipe.plan.profiling``.
"""
