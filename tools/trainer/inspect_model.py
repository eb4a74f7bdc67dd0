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

The last line is ``total params: N``.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import logging
from gpipe.measure import param_count
from gpipe.runtime import background
from gpipe import partition
from gpipe.runtime import layout
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
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
