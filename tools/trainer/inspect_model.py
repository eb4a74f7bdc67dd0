"""--mode=inspect_model: every layer and stage with its parameter count.

Nothing is trained and no weight is allocated, so even the multi-billion
parameter configs can be inspected on a laptop:

* each PipeliningLayer's flat layers are counted with
  ``gpipe.measure.param_count.CountParams`` (a scratch graph per distinct layer;
  graph-mode variables take no memory until initialized) and cut into stages
  the way the pipeline will cut them (``gpipe.partition``);
* the rest of the task (embeddings, heads outside the pipeline...) is built
  in a scratch graph with each pipeline replaced by an empty layer, and its
  variables are counted by layer.

The last line of that report is ``total params: N``.

With the stages on GPUs (``--device_type=gpu``, alone for GPUs of this
process, or with ``--cluster_spec`` and ``--devices_per_task`` for a
cluster's; neither needs a GPU here), ``AuditGpus`` then builds the
training graph on those devices, without running or allocating anything and
with the input standing in for its data, and prints
``gpipe.measure.gpu_audit``'s report: per GPU, the ops without a GPU kernel
for their dtypes, the host-GPU copies of every micro-batch, and the Lingvo
ops that would run on the host.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import logging
from gpipe.measure import gpu_audit
from gpipe.measure import param_count
from gpipe.runtime import background
from gpipe import partition
from gpipe.runtime import layout
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
from tasks import dataset_input
from tools.trainer import model_graph
from tools.trainer import model_select


class _EmptyLayer(base_layer.BaseLayer):
  """Stands in for a pipeline while the rest of the task is counted.

  It keeps the pipeline's params (a task may read e.g. p.network.layers)
  but creates no children and no variables.
  """


def _StandIn(pipeline_params):
  stand_in = pipeline_params.Copy()
  stand_in.cls = _EmptyLayer
  return stand_in


def _ReplacePipelines(params):
  """Replaces every PipeliningLayer params in the tree by an empty layer."""
  for key, value in list(params.IterParams()):
    if (isinstance(value, hyperparams.Params) and
        model_select.FindPipelines(value) == [('', value)]):
      params.Set(**{key: _StandIn(value)})
    elif isinstance(value, hyperparams.Params):
      _ReplacePipelines(value)
    elif isinstance(value, list):
      for i, item in enumerate(value):
        if isinstance(item, hyperparams.Params):
          if model_select.FindPipelines(item) == [('', item)]:
            value[i] = _StandIn(item)
          else:
            _ReplacePipelines(item)


def _RestOfModel(cfg):
  """{variable name: parameter count} of the trainable non-pipeline vars."""
  rest = cfg.Copy()
  rest.input = None
  rest.task.input = None
  _ReplacePipelines(rest)

  def Build():
    verbosity = logging.get_verbosity()
    # Without its input (not needed to count) Lingvo warns; nothing is wrong.
    logging.set_verbosity(logging.ERROR)
    try:
      with tf.Graph().as_default():
        rest.Instantiate()
        return {
            v.op.name: int(v.shape.num_elements())
            for v in tf.compat.v1.trainable_variables()
        }
    finally:
      logging.set_verbosity(verbosity)

  return background.RunIsolated(Build)


def Inspect(cfg, echo=print):
  """Prints the model's layers, stages and parameter counts.

  Args:
    cfg: model params.
    echo: prints a line.

  Returns:
    The total number of trainable parameters.
  """
  total = 0
  for path, pp in model_select.FindPipelines(cfg):
    # Timing would run the layers (allocating weights): balance by params.
    cut = partition.StageCut(pp, measure_time=False)
    layers, sizes = cut.layer_params, cut.sizes
    counts = [param_count.CountParams(lp) for lp in layers]
    micro = ('%d micro-batches' % pp.num_micro_batches if pp.num_micro_batches
             else 'micro-batches of %s' % pp.micro_batch_size)
    echo('pipeline %s: %d layers, %d stages, %s, remat %s' %
         (path, len(layers), len(sizes), micro, pp.remat))
    start = 0
    for k, size in enumerate(sizes):
      device = (pp.stage_devices[k] if pp.stage_devices and
                k < len(pp.stage_devices) else 'default device')
      echo('  stage %d (%s): %d layers, %s params' %
           (k, device, size, '{:,}'.format(sum(counts[start:start + size]))))
      for i in range(start, start + size):
        echo('    %s %-24s %s %s' % (cut.child_keys[i], layers[i].name or '',
                                     layers[i].cls.__name__,
                                     '{:,}'.format(counts[i])))
      start += size
    echo(partition.Report(layers, sizes, cut.costs, cut.cost_name))
    for line in layout.Describe(pp.replica_devices or
                                [pp.stage_devices or []]):
      echo(line)
    total += sum(counts)
  rest = _RestOfModel(cfg)
  if rest:
    by_layer = collections.OrderedDict()
    for name, count in sorted(rest.items()):
      layer = name.rsplit('/', 2)[0] if name.count('/') >= 2 else name
      by_layer[layer] = by_layer.get(layer, 0) + count
    echo('outside the pipeline: %d variables' % len(rest))
    for layer, count in by_layer.items():
      echo('  %-40s %s' % (layer, '{:,}'.format(count)))
    total += sum(rest.values())
  echo('total params: %d' % total)
  return total


def _CanStandIn(input_params):
  """Whether an input can yield zeros in place of its data (stand_in)."""
  return (input_params is not None and 'stand_in' in input_params and
          input_params.cls.ExampleSpecs is not
          dataset_input.DatasetInput.ExampleSpecs)


def HasGpuStages(placement):
  """Whether a planned placement puts the stages on GPUs."""
  return placement is not None and placement.device_type == 'GPU'


def AuditGpus(cfg, placement, seed=1234, echo=print, square_norms=True):
  """Builds the training graph on the planned GPUs and prints its audit.

  Nothing runs and no weight is allocated: the graph is read against
  TensorFlow's kernel registry (gpipe.measure.gpu_audit), so the GPUs need
  not exist. An input that can (tasks.dataset_input's ``stand_in``) yields
  zeros in place of its data, so a data set that is not prepared here does
  not stop the audit.

  Args:
    cfg: model params, the stage devices set (run_config.Settle).
    placement: the planned placement.Placement of those devices.
    seed: the graph-level random seed.
    echo: prints a line.
    square_norms: the learner's norms as the trainer builds them
      (``model_graph.Build``, --square_norms).

  Returns:
    The gpu_audit.AuditResult.

  Raises:
    ValueError: the graph could not be built (e.g. an input that cannot
      stand in and whose data is missing); the message says why.
  """
  cfg = cfg.Copy()
  if _CanStandIn(cfg.input):
    cfg.input.stand_in = True
  echo('GPU audit: building the training graph on %s (nothing runs)' %
       layout.CountByTask(placement.devices))
  verbosity = logging.get_verbosity()
  # Lingvo logs every variable it creates; the report is what matters here.
  logging.set_verbosity(logging.ERROR)
  try:
    built = model_graph.Build(cfg, placement, 'train', seed,
                              square_norms=square_norms)
  except ValueError as e:
    raise ValueError('the GPU audit could not build the training graph: %s'
                     % e) from e
  finally:
    logging.set_verbosity(verbosity)
  result = gpu_audit.Audit(built.graph)
  for line in gpu_audit.Report(result):
    echo(line)
  return result
