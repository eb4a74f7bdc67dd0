"""A registered model's pipeline, as the planner measures and applies it.

The planner measures a model's pipeline layers on inputs of the shapes and
dtypes they get in training. Those come from the model itself: the task is
built in a scratch graph on one batch of its own input, and the pipeline's
``FProp`` is stopped as it starts, recording its inputs, its loss layer's
targets and the loss layer (the task may add ``loss_tpl`` when it is
built). A model whose input cannot be read here (a tfds data set that is not
prepared) falls back to the pipeline's ``input_shapes`` (integer ids for
names ending in ``_ids`` / ``_labels``, float32 otherwise), which is enough
for the translation models, whose loss is their last layer.

``OptimizerCosts`` reads the optimizer's slots and update traffic from the
task's params.
"""

import collections
from unittest import mock

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import executor
from gpipe.runtime import background
from lingvo import compat as tf
from lingvo.core import py_utils
from tools.trainer import model_select

# Optimizers by class name: (float32 slots per parameter, bytes the update
# reads and writes per parameter byte).
OPTIMIZERS = {
    'SGD': (0, 3.0),
    'Momentum': (1, 5.0),
    'RMSProp': (2, 7.0),
    'Adagrad': (1, 5.0),
    'Adam': (2, 7.0),
    'AdamW': (2, 7.0),
}
DEFAULT_OPTIMIZER = (2, 7.0)

Pipeline = collections.namedtuple(
    'Pipeline', ['path', 'params', 'input_specs', 'loss', 'batch'])


class _Stop(Exception):
  """Raised at the start of the pipeline's FProp, once its inputs are seen."""


def _Specs(nest):
  return tf.nest.map_structure(
      lambda t: None if t is None else tf.TensorSpec(t.shape, t.dtype), nest)


def OnlyPipeline(cfg, model):
  """(path, params) of the model's one pipeline; a ValueError otherwise."""
  found = model_select.FindPipelines(cfg)
  if len(found) != 1:
    raise ValueError(
        'the planner plans a model with one gpipe PipeliningLayer; %s has %d'
        '%s' % (model, len(found), ' (%s)' % ', '.join(p for p, _ in found)
                if found else ''))
  path, p = found[0]
  if p.layers is None:
    raise ValueError('%s: the pipeline at %s is given as explicit stages '
                     '(cell_tpl); the planner cuts a flat layers list' %
                     (model, path))
  return path, p


def _FromInput(cfg):
  """(input specs, target specs, loss params, batch) from the model's input."""
  seen = {}

  def Hook(layer, theta, inputs, targets):
    del theta
    seen.update(inputs=_Specs(tuple(inputs)), targets=_Specs(targets),
                loss=layer.params.loss_tpl,
                batch=py_utils.GetShape(tf.nest.flatten(inputs)[0])[
                    layer.params.batch_dim])
    raise _Stop()

  def Run():
    with tf.Graph().as_default():
      model = cfg.Instantiate()
      task = model.GetTask()
      with mock.patch.object(executor.PipelineExecutor, '_RunPipeline',
                             Hook):
        try:
          task.FPropDefaultTheta()
        except _Stop:
          pass
    return seen

  seen = background.RunIsolated(Run)
  if not seen:
    raise ValueError('the model never ran its pipeline in FProp')
  loss = None
  if seen['loss'] is not None:
    loss = (seen['loss'], seen['targets'])
  return seen['inputs'], loss, int(seen['batch'])


def _FromInputShapes(p, batch):
  """Input specs from the pipeline's ``input_shapes`` (no data needed)."""
  if not p.input_shapes:
    raise ValueError('no input_shapes in the pipeline params to fall back on')

  def Spec(name, shape):
    dims = [int(d) for d in (shape.ToTensorShape().as_list() if hasattr(
        shape, 'ToTensorShape') else list(shape))]
    dims[p.batch_dim] = batch
    dtype = tf.int32 if name.endswith(('_ids', '_labels')) else tf.float32
    return tf.TensorSpec(dims, dtype)

  specs = []
  for x in p.input_shapes:
    if isinstance(x, dict):
      specs.append(py_utils.NestedMap(
          {k: Spec(k, v) for k, v in x.items()}))
    else:
      specs.append(Spec('', x))
  return tuple(specs)


def Describe(model, override=''):
  """The model's Pipeline: its params, input specs, loss layer and batch.

  Args:
    model: a registered model name.
    override: --model_params_override text.

  Returns:
    A Pipeline (input specs for the whole batch).
  """
  cfg = model_select.ModelParams(model, 'Train', override)
  path, p = OnlyPipeline(cfg, model)
  # One device for every stage: the model is built only to see its inputs.
  model_select.SetStageDevices(cfg, ['/device:CPU:0'], loop=True)
  try:
    specs, loss, batch = _FromInput(cfg)
  except (ValueError, OSError, tf.errors.OpError) as e:
    batch = cfg.input.batch_size
    try:
      specs, loss = _FromInputShapes(p, batch), None
    except ValueError as e2:
      raise ValueError('%s: cannot read its input (%s) nor fall back on its '
                       'input_shapes (%s)' % (model, e, e2)) from None
  return Pipeline(path=path, params=p, input_specs=specs, loss=loss,
                  batch=batch)


def OptimizerCosts(cfg):
  """(slots, update traffic) of the task's optimizer (OPTIMIZERS)."""
  try:
    name = cfg.task.train.optimizer.cls.__name__
  except AttributeError:
    return DEFAULT_OPTIMIZER
  return OPTIMIZERS.get(name, DEFAULT_OPTIMIZER)
