"""GPipe for Lingvo: pipeline-parallel training of sequential networks.

The public names, importable from the package itself::

  import gpipe
  p = gpipe.PipeliningLayer.Params().Set(layers=[...], num_stages=4,
                                         num_micro_batches=8)

``PipeliningLayer`` (the pipeline), ``FromLingvo`` (Lingvo's GPipe layers and
stacks on this executor, same variables; docs/MIGRATING.md),
``MicroBatchBatchNormLayer``, ``Dropout``, ``PartitionByCost``, ``StageCut``,
``LocalCluster``, and the module ``timeline`` (the measured timeline of a
traced step).

The modules, in the order a training step meets them:

  pipeline.py         PipeliningLayer: params, the cut into stages
                      (partition.py: cost-balanced cuts and the report)
  executor.py         one mini-batch: split, one call per (stage, micro-batch)
                      in the schedule's order, accumulate, merge
  micro_batch.py      splitting and merging micro-batches
  schedules/          which task each device runs, in which order:
                      registry.py (every schedule by name), orders.py,
                      timed.py (orders from measured task times),
                      simulate.py, render.py
  pipeline_tasks.py   the task vocabulary (F, B, W of a stage on a
                      micro-batch) and the registry that orders the ops
  stage.py            a stage as graph functions: forward, backward, remat
  accumulation.py     weight gradients summed across micro-batches as their
                      tasks finish (one running sum per stage)
  split_backward.py   a stage's backward as B (input) and W (weight) tasks
  weight_batching.py  one W task per stage for all micro-batches
  replicas.py         R data-parallel replicas of the K stages

Features the stages use: batch_norm.py (micro-batch batch norm), randomness.py
(dropout the recomputation reproduces), precision.py (bfloat16),
separability.py (a loss must not mix micro-batches), thread_stack.py.
Inference: in eval mode the executor runs the forward-only schedule
(schedules/inference.py); lanes.py decodes autoregressively through the
stages, the batch in lanes (schedules/decode_lanes.py). Around the step:
measure/ (timeline, memory, param_count, run_time), compat/ (Lingvo on
TF 2.15, Lingvo's GPipe on this executor, TensorFlow internals), runtime/
(worker processes and clusters).

Before training, the planner chooses a configuration:

  plan/               measure a model once, simulate every configuration, pick:
                      profile.py (the measured profile, JSON), measure.py
                      (measuring it), calibrate.py (against the executor's own
                      stage calls, with traced.py: what a traced step says
                      of its tasks), simulator.py (a configuration's predicted
                      step), search.py (every configuration under a memory
                      cap), choice.py (the chosen plan, JSON, applied)
"""

import importlib

from gpipe.compat import lingvo_alias

# Lingvo imported after gpipe finds the TensorFlow module it expects
# (gpipe.compat.lingvo_import says why), without importing TensorFlow here:
# the package's pure layers (gpipe.schedules, the planner's simulator) import
# without it.
lingvo_alias.InstallFinder()

# The public names and the modules that define them, imported on first use:
# a process that needs only part of the library (a worker process, a test of
# one module) does not pay for importing the rest (Lingvo's own GPipe behind
# FromLingvo pulls in matplotlib, half a second).
_PUBLIC = {
    'Dropout': ('gpipe.randomness', 'Dropout'),
    'FromLingvo': ('gpipe.lingvo_adapter', 'FromLingvo'),
    'LocalCluster': ('gpipe.runtime.local_cluster', 'LocalCluster'),
    'MicroBatchBatchNormLayer': ('gpipe.batch_norm',
                                 'MicroBatchBatchNormLayer'),
    'PartitionByCost': ('gpipe.balance', 'PartitionByCost'),
    'PipeliningLayer': ('gpipe.pipeline', 'PipeliningLayer'),
    'StageCut': ('gpipe.partition', 'StageCut'),
    'timeline': ('gpipe.measure.timeline', None),  # a module
}


# Former public names: where their contents went.
_REMOVED = {
    'schedule': 'gpipe.schedules (registry, orders, simulate, render)',
}


def __getattr__(name):
  """A public name (``_PUBLIC``), imported on first use."""
  if name in _REMOVED:
    raise AttributeError('module %r has no attribute %r any more: use %s' %
                         (__name__, name, _REMOVED[name]))
  if name not in _PUBLIC:
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
  module, attr = _PUBLIC[name]
  value = importlib.import_module(module)
  if attr is not None:
    value = getattr(value, attr)
  globals()[name] = value
  return value


def __dir__():
  return sorted(list(globals()) + list(_PUBLIC))


__all__ = [
    'Dropout', 'FromLingvo', 'LocalCluster', 'MicroBatchBatchNormLayer', 'PartitionByCost',
    'PipeliningLayer', 'StageCut', 'timeline',
]
