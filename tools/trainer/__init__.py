"""The trainer binary: ``python -m tools.trainer`` (or ``//tools:trainer``).

Its parts, in the order a run meets them:

* ``settings``: every setting once (its flag, default and help; a field of
  the run's configuration);
* ``cli``: the flags and the mode dispatch (``main``);
* ``model_select``: registered models, ``--model_params_override``, and the
  pipelines inside a model's params (stages, micro-batches, devices);
* ``placement``: virtual CPUs, local worker processes or a cluster spec, and
  the session that drives them;
* ``run_config``: the run settled once from the two above, passed on as data;
* ``model_graph``: the model's graph for training, evaluation or decoding;
* ``train_loop`` (with ``progress``, ``summaries``, ``step_trace``): the
  resumable training loop, its console lines, TensorBoard events and traced
  steps;
* ``checkpoints`` and ``restored``: saving, choosing and restoring
  checkpoints; the one restore set-up of ``evaler`` and ``decoder``;
* ``inspect_model``: layers, stages and parameter counts without weights;
  with the stages on (planned) GPUs, the GPU audit of the training graph.
"""

import os as _os
import time as _time

# The trainer's own start: the first import of its package, so that a start-up
# line does not count what ran in the process before an exec (``train.sh``
# execs the trainer after the machine's set-up, and /proc's process start
# time counts from the shell); in a process forked from one that imported it
# (a fork server's program, gpipe.runtime.forked_workers), the fork.
STARTED = _time.time()


def _Forked():
  global STARTED
  STARTED = _time.time()


if hasattr(_os, 'register_at_fork'):
  _os.register_at_fork(after_in_child=_Forked)
