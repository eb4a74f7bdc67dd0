"""Cutting a sequence of layers into K stages of balanced cost.

GPipe's partitioner balances the estimated cost of the K cells. Here the
objective is the one that bounds pipeline throughput: minimize the cost of the
most expensive stage (every stage waits for the slowest one each tick). The
cut is exact (``PartitionByCost``, from ``gpipe.balance``: pure Python, for the
planner too).

Costs per layer come from one of:

  * ``'flops'``: the layers' ``FPropMeta`` flops, with shapes propagated
    from the pipeline's input shapes;
  * ``'params'``: parameter bytes (stage memory balance), from the layers built
    in a scratch graph without allocating weights;
  * ``'time'``: measured forward+backward time of each layer on a sample
    micro-batch;
  * ``'uniform'``: one unit per layer.

``StageCut`` turns a PipeliningLayer's params into its stages (the one place
that does: the layer and the trainer's ``inspect_model`` both call it), and
``Report`` prints a table of the stages: layer ranges, parameters, cost.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import balance
from gpipe.measure import param_count
from gpipe.measure import run_time
from gpipe.runtime import background
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import tshape

COST_METHODS = ('uniform', 'flops', 'params', 'time')

# The cut itself, pure (gpipe.balance); here beside the costs it cuts.
CheckStageCount = balance.CheckStageCount
PartitionByCost = balance.PartitionByCost


def _ToTShape(shape):
  if isinstance(shape, tshape.Shape):
    return shape
  if isinstance(shape, tf.TensorSpec):
    return tshape.Shape(shape.shape.as_list())
  if isinstance(shape, tf.TensorShape):
    return tshape.Shape(shape.as_list())
  return tshape.Shape(list(shape))


def _ShapesOf(x):
  """tshape.Shapes of one input: a shape, a spec or a dict of them."""
  if isinstance(x, (tshape.Shape, tf.TensorSpec, tf.TensorShape)):
    return _ToTShape(x)
  if isinstance(x, (list, tuple)) and all(
      isinstance(d, (int, str)) or d is None for d in x):
    return _ToTShape(x)
  if isinstance(x, dict):
    return py_utils.NestedMap({k: _ShapesOf(v) for k, v in x.items()})
  raise ValueError('input_shapes entries must be shapes (lists of ints, '
                   'TensorSpec, tshape.Shape) or dicts of them, got %r' % (x,))


def FlopsCosts(layer_params, input_shapes):
  """Per-layer flops from FPropMeta, propagating shapes through the layers.

  Args:
    layer_params: the layers' params, in order.
    input_shapes: the shapes of the first layer's inputs for ONE micro-batch
      (lists of ints, TensorSpecs or tshape.Shapes; may be nested in a
      NestedMap).

  Returns:
    A list of flops, one per layer.

  Raises:
    ValueError: a layer has no FPropMeta or its meta lacks flops.
  """
  if input_shapes is None:
    raise ValueError("partition_cost='flops' needs input_shapes: the shapes "
                     'of one micro-batch of the pipeline inputs')
  args = tuple(_ShapesOf(x) for x in input_shapes)
  costs = []
  for i, p in enumerate(layer_params):
    try:
      meta = p.cls.FPropMeta(p, *args)
    except NotImplementedError as e:
      raise ValueError(
          'layer %d (%s, %s) has no cost information: %s.FPropMeta is not '
          'implemented. Implement FPropMeta, or partition by '
          "partition_cost='params' or 'time', or give stage_sizes." %
          (i, p.name, p.cls.__name__, p.cls.__name__)) from e
    if meta is None or 'flops' not in meta or meta.flops is None:
      raise ValueError(
          'layer %d (%s, %s): FPropMeta returned no flops; it cannot be '
          "partitioned by partition_cost='flops'" % (i, p.name, p.cls.__name__))
    costs.append(float(meta.flops))
    args = tuple(meta.out_shapes)
  return costs


def ParamBytes(p):
  """Bytes of all variables (trainable or not) of the layer `p` builds."""
  total = 0
  itemsize = np.dtype(p.dtype.as_numpy_dtype).itemsize
  for shape, _ in param_count.VariableShapes(p).values():
    total += int(np.prod(shape)) * itemsize
  return total


def ParamsCosts(layer_params):
  """Per-layer parameter bytes."""
  return [float(ParamBytes(p)) for p in layer_params]


def TimeCosts(layer_params, input_specs, repeats=3, config=None):
  """Per-layer measured forward+backward seconds on one sample micro-batch.

  Args:
    layer_params: the layers' params, in order.
    input_specs: tf.TensorSpecs (or a NestedMap of them) of one micro-batch of
      the first layer's inputs; float inputs are filled with normal noise,
      integer inputs with zeros.
    repeats: timed runs per layer (the median is used), after one warm-up.
    config: an optional session ConfigProto.

  Returns:
    A list of seconds, one per layer.
  """
  if input_specs is None:
    raise ValueError("partition_cost='time' needs input_shapes given as "
                     'tf.TensorSpec (shape and dtype of one micro-batch)')
  return background.RunIsolated(
      lambda: _MeasureTimes(layer_params, input_specs, repeats, config))


def _MeasureTimes(layer_params, input_specs, repeats, config):
  """TimeCosts' body, run in its own thread (see background.RunIsolated)."""

  def _Sample(spec):
    if not isinstance(spec, tf.TensorSpec):
      spec = tf.TensorSpec(list(spec), tf.float32)
    if spec.dtype.is_floating:
      return tf.random.normal(spec.shape, dtype=spec.dtype)
    return tf.zeros(spec.shape, spec.dtype)

  costs = []
  with tf.Graph().as_default():
    rng_inputs = (input_specs.Transform(_Sample) if isinstance(
        input_specs, py_utils.NestedMap) else tuple(
            _Sample(s) for s in input_specs))
    args = (rng_inputs,) if isinstance(rng_inputs,
                                       py_utils.NestedMap) else rng_inputs
    layers, layer_args = [], []
    for p in layer_params:
      layer = p.Copy().Instantiate()
      layers.append(layer)
      layer_args.append(args)
      out = layer.FPropDefaultTheta(*args)
      args = out if isinstance(out, tuple) else (out,)
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for layer, largs in zip(layers, layer_args):
        values = sess.run(list(tf.nest.flatten(largs)))
        feeds = [tf.compat.v1.placeholder(v.dtype, v.shape) for v in values]
        fed_args = tf.nest.pack_sequence_as(largs, feeds)
        out = layer.FPropDefaultTheta(*fed_args)
        floats = [o for o in tf.nest.flatten(out) if o.dtype.is_floating]
        xs = [f for f in feeds if f.dtype.is_floating] + list(
            layer.vars.Flatten())
        target = tf.add_n([tf.reduce_sum(o) for o in floats]) if floats else (
            tf.constant(0.))
        grads = [g for g in tf.gradients(target, xs) if g is not None]
        fetch = grads or floats
        costs.append(run_time.RunSeconds(
            sess, fetch, dict(zip(feeds, values)), repeats=repeats))
  return costs


def LayerCosts(method, layer_params, input_shapes=None):
  """Per-layer costs by `method` (one of COST_METHODS)."""
  if method == 'uniform':
    return [1.0] * len(layer_params)
  if method == 'flops':
    return FlopsCosts(layer_params, input_shapes)
  if method == 'params':
    return ParamsCosts(layer_params)
  if method == 'time':
    return TimeCosts(layer_params, input_shapes)
  raise ValueError('unknown partition_cost %r; use one of %s' %
                   (method, ', '.join(COST_METHODS)))


def Report(layer_params, stage_sizes, costs=None, cost_name='cost',
           devices=None, counts=None):
  """A readable table: one row per stage with its layers, params and cost.

  The one stage table of the library: ``PipeliningLayer`` and Lingvo's GPipe
  layers on this executor (``gpipe.lingvo_adapter``) both print it.

  Args:
    layer_params: the layers' params, in order.
    stage_sizes: layers per stage.
    costs: optional per-layer costs.
    cost_name: what the costs are (for the header).
    devices: optional, each stage's device.
    counts: optional per-layer parameter counts (default: counted from the
      params).

  Returns:
    A multi-line string.
  """
  if counts is None:
    counts = [param_count.CountParams(p) for p in layer_params]
  total_cost = float(sum(costs)) if costs else 0.0
  lines = ['stage | layers | first .. last | device | params | %s | share' %
           cost_name]
  start = 0
  for k, size in enumerate(stage_sizes):
    names = [p.name for p in layer_params[start:start + size]]
    params = sum(counts[start:start + size])
    if costs:
      cost = float(sum(costs[start:start + size]))
      share = '%.1f%%' % (100.0 * cost / total_cost) if total_cost else '-'
      cost = '%.4g' % cost
    else:
      cost, share = '-', '-'
    lines.append('%5d | %6d | %s .. %s | %s | %s | %s | %s' %
                 (k, size, names[0], names[-1], devices[k] if devices else '-',
                  '{:,}'.format(params), cost, share))
    start += size
  lines.append('total | %6d | | | %s | %s |' %
               (len(layer_params), '{:,}'.format(sum(counts)),
                '%.4g' % total_cost if costs else '-'))
  return '\n'.join(lines)


def LayerKey(index):
  """The child (and variable scope) name of flat layer `index`."""
  return 'layer_%03d' % index


def CellKey(stage):
  """The child name of stage `stage`'s cell when stages are given as cells."""
  return 'cell_%d' % stage


Cut = collections.namedtuple(
    'Cut', ['layer_params', 'sizes', 'child_keys', 'costs', 'cost_name'])


def StageCut(p, measure_time=True):
  """Where a pipeline's layers go: the one cut of a PipeliningLayer's params.

  A pure function of the params (plus the layers' costs): the pipeline layer
  creates its children from it, and tools that must not build the model
  (``inspect_model``) print the same stages from it.

  Args:
    p: PipeliningLayer params: exactly one of `cell_tpl` (one layer per stage)
      and `layers` (cut into `num_stages` by `stage_sizes` or
      `partition_cost`).
    measure_time: with partition_cost 'time', run the layers to time them;
      False balances by 'params' instead (nothing runs, no weights are
      allocated).

  Returns:
    A Cut(layer_params, sizes, child_keys, costs, cost_name): the flat layer
    params, layers per stage, one child key per layer (its variable scope:
    keys do not depend on the cut, so a checkpoint fits any num_stages),
    per-layer costs (None when no cost was needed) and what they measure.

  Raises:
    ValueError: both or neither of cell_tpl and layers, num_stages that does
      not fit, or stage_sizes that do not add up; each says what to set.
  """
  if (p.cell_tpl is None) == (p.layers is None):
    raise ValueError('%s: set exactly one of cell_tpl (one layer per stage) '
                     'and layers (cut into num_stages)' % p.name)
  if p.cell_tpl is not None:
    if p.num_stages not in (None, len(p.cell_tpl)):
      raise ValueError('%s: num_stages=%d but cell_tpl has %d stages' %
                       (p.name, p.num_stages, len(p.cell_tpl)))
    num = len(p.cell_tpl)
    return Cut(layer_params=list(p.cell_tpl), sizes=[1] * num,
               child_keys=[CellKey(k) for k in range(num)], costs=None,
               cost_name='cost')
  layer_params = list(p.layers)
  if p.num_stages is None:
    raise ValueError('%s: `layers` needs num_stages' % p.name)
  CheckStageCount(len(layer_params), p.num_stages)
  costs, cost_name = None, 'cost'
  if p.stage_sizes is not None:
    sizes = list(p.stage_sizes)
    if (len(sizes) != p.num_stages or sum(sizes) != len(layer_params) or
        min(sizes) < 1):
      raise ValueError(
          '%s: stage_sizes %s must be %d positive numbers summing to %d '
          'layers' % (p.name, sizes, p.num_stages, len(layer_params)))
  else:
    cost_name = p.partition_cost
    if cost_name == 'time' and not measure_time:
      cost_name = 'params'
    costs = LayerCosts(cost_name, layer_params, p.input_shapes)
    sizes = PartitionByCost(costs, p.num_stages)
  return Cut(layer_params=layer_params, sizes=sizes,
             child_keys=[LayerKey(i) for i in range(len(layer_params))],
             costs=costs, cost_name=cost_name)
