"""GPipe for Lingvo: pipeline-parallel training of sequential networks.

The public names, importable from the package itself::

  import gpipe
  p = gpipe.PipeliningLayer.Params().Set(layers=[...], num_stages=4,
                                         num_micro_batches=8)

``PipeliningLayer`` (the pipeline), ``FromLingvo`` (Lingvo's GPipe layers and
stacks on this executor, same variables; docs/MIGRATING.md),
``MicroBatchBatchNormLayer``, ``Dropout``, ``PartitionByCost``, ``StageCut``,
``LocalCluster``, and the modules ``schedule`` (deprecated: re-exports the
schedules' registry and drawings of ``gpipe.schedules``) and ``timeline`` (the
measured timeline of a traced step).

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
                      (schedule.py: the former single module, a deprecated
                      re-export of schedules/)
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
measure/ (timeline, memory, param_count, run_time, gpu_audit: what would
leave the GPUs), compat/ (Lingvo on TF 2.15, Lingvo's GPipe on this
executor, TensorFlow internals), runtime/ (worker processes and clusters).

Before training, the planner chooses a configuration:

  plan/               measure a model once, simulate every configuration, pick:
                      profile.py (the measured profile, JSON), measure.py
                      (measuring it), calibrate.py (against the executor's own
                      stage calls, with traced.py: what a traced step says
                      of its tasks), simulator.py (a configuration's predicted
                      step), search.py (every configuration under a memory
                      cap), choice.py (the chosen plan, JSON, applied)
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import  # must be first
import importlib

# The public names and the modules that define them, imported on first use:
# a process that needs only part of the library (a worker process, a test of
# one module) does not pay for importing the rest (Lingvo's own GPipe behind
# FromLingvo pulls in matplotlib, half a second).
_PUBLIC = {
    'Dropout': ('gpipe.randomness', 'Dropout'),
    'FromLingvo': ('gpipe.compat.lingvo_gpipe', 'FromLingvo'),
    'LocalCluster': ('gpipe.runtime.local_cluster', 'LocalCluster'),
    'MicroBatchBatchNormLayer': ('gpipe.batch_norm',
                                 'MicroBatchBatchNormLayer'),
    'PartitionByCost': ('gpipe.partition', 'PartitionByCost'),
    'PipeliningLayer': ('gpipe.pipeline', 'PipeliningLayer'),
    'StageCut': ('gpipe.partition', 'StageCut'),
    'schedule': ('gpipe.schedule', None),  # modules
    'timeline': ('gpipe.measure.timeline', None),
}


def __getattr__(name):
  """A public name (``_PUBLIC``), imported on first use."""
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
    'PipeliningLayer', 'StageCut', 'schedule', 'timeline',
]
