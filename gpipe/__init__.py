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

The directories and modules in layers, bottom up. A module imports modules
of its own directory and of lower layers only; compat/ and schedules/ (both
layer 0) do not import each other. tests/layering_test.py checks every import
statement against this map; tests/pure_imports_test.py checks that the parts
marked "pure" import no TensorFlow or Lingvo (the package itself too: its
public names are imported on first use).

  0  compat/      the outside world: Lingvo 0.14 on TensorFlow 2.15
                  (lingvo_import.py, lingvo_alias.py), TensorFlow's import
                  without its CUDA noise (quiet_import.py), every private
                  TensorFlow call (tf_internal.py), Lingvo's learner's norms
                  built with Square, not Pow (lingvo_norms.py)
  0  schedules/   pure: which task each device runs, in which order:
                  pipeline_tasks.py (the task vocabulary: F, B, W, D of a
                  stage on a micro-batch, dependencies, op names),
                  registry.py (every schedule by name), orders.py, timed.py
                  (orders from measured task times), simulate.py, render.py,
                  inference.py (forward only), decode_lanes.py (decoding)
  1  runtime/     where stages run: cluster_spec.py (a cluster's workers),
                  worker.py (the worker binary), local_cluster.py (K worker
                  processes here; forked_workers.py and fork_server.py: forks
                  of one process that imported TensorFlow; child_env.py),
                  liveness.py (does the server at an
                  address answer), devices.py, layout.py (R x K stages on
                  the devices), memory_cap.py and cpu_quota.py (a
                  worker's memory cap and CPU quota; cgroups.py),
                  background.py (work in a thread of its own; RunIsolated
                  for scratch layers), netns.py (joining a network
                  namespace),
                  session_cluster.py (a session over any set of running
                  servers: the survivors of a lost one, a replacement)
  2  measure/     what a step did and what a model holds: timeline.py (the
                  tasks of a traced step), memory.py (peak memory per
                  device), param_count.py, run_time.py, gpu_audit.py (what
                  would leave a GPU, from the kernel registry)
  3  gpipe/       the core: the modules directly in gpipe/, the executor and
                  what it runs, in the order a training step meets them:
       pipeline.py        PipeliningLayer: params, the cut into stages
                          (partition.py: layer costs, the cut and its report;
                          balance.py: the exact balanced cut, pure;
                          stage_layers.py: the public view of the cut,
                          PipeliningLayer.Stages())
       executor.py        one mini-batch: split, one call per (stage,
                          micro-batch) in the schedule's order, accumulate,
                          merge (StepSetup: the step before its first task)
       task_ops.py        each device's task ops chained in its order
       micro_batch.py     splitting and merging micro-batches
       stage.py           a stage as graph functions: forward, backward, remat
       accumulation.py    weight gradients summed across micro-batches as
                          their tasks finish (one running sum per stage)
       split_backward.py  a stage's backward as B (input) and W (weight) tasks
       weight_batching.py one W task per stage for all micro-batches (pure)
       replicas.py        R data-parallel replicas of the K stages
       lanes.py           pipelined decoding: the batch in lanes through the
                          stages, with what every autoregressive model needs
                          (the loop's stages, the lane count, the encoder
                          forward-only); eval mode runs schedules/inference.py
       lingvo_adapter.py  FromLingvo: Lingvo's GPipe layers and stacks on
                          this executor, their variables unchanged
     features the stages use: batch_norm.py (micro-batch batch norm),
     randomness.py (dropout the recomputation reproduces), precision.py
     (bfloat16), separability.py (a loss must not mix micro-batches),
     xla.py (stage functions compiled by XLA, p.compile), thread_stack.py;
     and worker.py (python -m gpipe.worker) and this
     __init__.py (the public names)
  4  plan/        the planner, before training: measure a model once, simulate
                  every configuration, pick: profile.py (the measured profile,
                  JSON), profiling.py (measuring it), calibrate.py (against
                  the executor's own stage calls, with traced.py: what a
                  traced step says of its tasks), simulator.py (a
                  configuration's predicted step), search.py (every
                  configuration under a memory cap), choice.py (the chosen
                  plan, JSON, applied); profile, simulator, search, choice
                  and traced are pure

Deprecated paths, kept for one release (each hands out the new objects, the
modules warn on import; tests/deprecated_paths_test.py): pipeline_tasks.py
(schedules/pipeline_tasks.py, and TaskRegistry: task_ops.ScheduledOps),
compat/lingvo_gpipe.py (lingvo_adapter.py: the one import up a layer, named
as such in tests/layering_test.py), plan/measure.py (plan/profiling.py), and
the name measure.param_count.RunIsolated (runtime.background.RunIsolated).
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
    'Dropout', 'FromLingvo', 'LocalCluster', 'MicroBatchBatchNormLayer',
    'PartitionByCost', 'PipeliningLayer', 'StageCut', 'timeline',
]
