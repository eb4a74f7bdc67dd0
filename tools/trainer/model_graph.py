"""Building a registered model's graph for training, evaluation or decoding.

Lingvo's way: instantiate the model params inside a Lingvo cluster context
(which says whether this is an eval graph and how many devices a model split
has), then construct the graph of the mode: ``ConstructFPropBPropGraph``
(loss, gradients and the learners' update: ``task.train_op``),
``ConstructFPropGraph`` (loss and metrics only) or ``ConstructDecodeGraph``.
Graph-level randomness is seeded first, so variable initialization and
dropout are the same in every run with the same seed. Lingvo's learner's
squared norms are built with Square ops, not Pow, unless asked otherwise
(gpipe/compat/lingvo_norms.py).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from gpipe.compat import lingvo_norms
from gpipe.runtime import layout
from lingvo import compat as tf
from lingvo.core import py_utils
from tools.trainer import startup

MODES = ('train', 'eval', 'decode')


def Build(cfg, placement, mode, seed, phases=None, square_norms=True):
  """Builds the model of `cfg` in a new graph.

  Args:
    cfg: SingleTaskModel params (input, devices already set).
    placement: a tools.placement.Placement.
    mode: 'train', 'eval' or 'decode'.
    seed: the graph-level random seed.
    phases: optional tools.trainer.startup.StartupLog timing the build's
      phases.
    square_norms: build Lingvo's squared norms with Square, not Pow
      (``lingvo_norms.SquareNorms``; the trainer's --square_norms).

  Returns:
    NestedMap(graph, model, task, global_step, decode_out): decode_out is
    the task's Decode() output in 'decode' mode, else None.
  """
  if mode not in MODES:
    raise ValueError('unknown graph mode %r; use one of %s' % (mode, MODES))
  phases = phases or startup.StartupLog()
  graph = tf.Graph()
  decode_out = None
  with graph.as_default(), lingvo_norms.SquareNorms(square_norms):
    tf.compat.v1.set_random_seed(seed)
    with placement.LingvoCluster(do_eval=mode != 'train'):
      with phases.Phase('layers and variables'):
        model = cfg.Instantiate()
      with phases.Phase('%s graph' % mode), startup.TimeGraphBuild(phases):
        if mode == 'train':
          model.ConstructFPropBPropGraph()
        elif mode == 'eval':
          model.ConstructFPropGraph()
        else:
          _, decode_out = model.ConstructDecodeGraph()
  task = model.GetTask()
  return py_utils.NestedMap(graph=graph, model=model, task=task,
                            global_step=task.global_step,
                            decode_out=decode_out)


def Pipelines(layer):
  """The PipeliningLayers in `layer`'s tree, depth first."""
  if isinstance(layer, pipeline.PipeliningLayer):
    return [layer]
  found = []
  for child in tf.nest.flatten(dict(layer.children)):
    found += Pipelines(child)
  return found


def Describe(layer):
  """Lines describing each pipeline: stages, micro-batches, devices, cut."""
  lines = []
  for pipe in Pipelines(layer):
    p = pipe.params
    micro = ('%d micro-batches' % p.num_micro_batches if p.num_micro_batches
             else 'micro-batches of %d' % p.micro_batch_size)
    lines.append('pipeline %s: %d stages, %s, schedule %s, remat=%s, '
                 'devices %s' % (pipe.path, pipe.num_stages, micro,
                                 p.schedule, p.remat,
                                 ', '.join(pipe.stage_devices)))
    if pipe.num_replicas > 1:
      lines.append('pipeline %s: %d data-parallel replicas, on %s' % (
          pipe.path, pipe.num_replicas, ' | '.join(
              ', '.join(devices) for devices in pipe.replica_devices)))
    lines.extend(layout.Describe(pipe.replica_devices))
    lines.append(pipe.PartitionReport())
  return lines
