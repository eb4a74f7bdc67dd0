"""Selecting a registered model and adjusting its params for this run.

``--model=family.ClassName`` names a class registered with Lingvo's
``model_registry`` in ``params/family.py``. This module imports the params
modules, builds the model params for a dataset ('Train', 'Test'), applies
``--model_params_override`` (Lingvo's text format, ``a.b=1; c=2``) and finds
the ``gpipe.pipeline.PipeliningLayer`` params inside the model's params tree,
so the trainer can set the number of stages, micro-batches and devices.
"""

import ast
import difflib
import importlib
import pkgutil

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from gpipe.schedules import registry as schedule_registry
from gpipe.runtime import layout
from lingvo import model_registry
from lingvo.core import hyperparams


class UnknownModelError(ValueError):
  """--model names no registered model."""


_IMPORT_ERRORS = {}


def ImportParamsModules():
  """Imports every module of the `params` package (registering its models).

  A module that fails to import is remembered (ImportErrors()) instead of
  hiding every other model.
  """
  import params  # pylint: disable=g-import-not-at-top
  for info in pkgutil.iter_modules(params.__path__):
    name = 'params.' + info.name
    if name in _IMPORT_ERRORS:
      continue
    try:
      importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except
      _IMPORT_ERRORS[name] = '%s: %s' % (type(e).__name__, e)


def ImportErrors():
  """{params module: error} of the modules that failed to import."""
  return dict(_IMPORT_ERRORS)


def _Registered():
  """{registry key: model params class} (Lingvo's registry)."""
  # pylint: disable=protected-access
  return model_registry._ModelRegistryHelper.GetAllRegisteredClasses()


def RegisteredNames():
  """Sorted registry keys ('family.ClassName') of all registered models."""
  ImportParamsModules()
  return sorted(_Registered())


def ModelParamsObject(name):
  """The registered model-params object called `name`.

  Args:
    name: 'family.ClassName'.

  Returns:
    An instance of the registered `SingleTaskModelParams` subclass.

  Raises:
    UnknownModelError: no such model; the message lists the closest names.
  """
  names = RegisteredNames()
  classes = _Registered()
  if name not in classes:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.4)
    if not close:
      # Match on the class name alone (the family may be the typo).
      short = {n.split('.')[-1]: n for n in names}
      close = [
          short[s] for s in difflib.get_close_matches(
              name.split('.')[-1], list(short), n=5, cutoff=0.4)
      ]
    msg = 'unknown model %r.' % name
    if close:
      msg += ' Did you mean: %s?' % ', '.join(close)
    msg += (' Models are registered as family.ClassName from params/'
            'family.py; registered: %s.' % ', '.join(names))
    errors = ImportErrors()
    family = 'params.' + name.split('.')[0]
    if family in errors:
      msg += ' Note: %s failed to import: %s' % (family, errors[family])
    raise UnknownModelError(msg)
  return classes[name]()


def ModelParams(name, dataset='Train', override=''):
  """The full model params of `name` with the input of `dataset`.

  Args:
    name: 'family.ClassName'.
    dataset: the model-params method giving the input ('Train', 'Test').
    override: Lingvo params text, lines or ';'-separated 'a.b=value'.

  Returns:
    A SingleTaskModel `hyperparams.Params`.
  """
  obj = ModelParamsObject(name)
  cfg = obj.Model()
  cfg.input = obj.GetDatasetParams(dataset)
  if override:
    ApplyOverride(cfg, override)
  return cfg


def ApplyOverride(cfg, text):
  """Applies overrides like 'task.train.learning_rate=0.1; task.x=2'.

  Each ';' or newline separated item is 'dotted.name=value' or Lingvo's own
  'dotted.name : value'; values are parsed as Lingvo's Params.FromText does
  (by the type of the current value), except that a param that is None takes
  the value as a Python literal, or else as a string (a path).

  Args:
    cfg: params to change in place.
    text: the overrides.

  Raises:
    ValueError: an unknown param name or a malformed value, named.
  """
  for item in text.replace(';', '\n').split('\n'):
    item = item.strip()
    if not item:
      continue
    cut = min([i for i in (item.find('='), item.find(':')) if i > 0] or [-1])
    if cut < 0:
      raise ValueError('--model_params_override: %r is not "name=value"' %
                       item)
    name, value = item[:cut].strip(), item[cut + 1:].strip()
    try:
      old = cfg.Get(name)
    except AttributeError as e:
      raise ValueError(
          '--model_params_override: the model params have no %r (%s); names '
          'are dotted paths from the model params root, e.g. '
          'task.train.learning_rate' % (name, e)) from e
    if old is None and not value.startswith(_LINGVO_TYPED_TEXTS):
      # Lingvo's text format types a value by the param's current one: a
      # param that is None stays None, or fails, for most texts (e.g. a path
      # as in input.data_dir=/data/tfds). Read it as a Python literal, or
      # else as a string.
      cfg.Set(**{name: _Literal(value)})
      continue
    try:
      cfg.FromText('%s : %s' % (name, value))
    except (AttributeError, ValueError, TypeError) as e:
      raise ValueError('--model_params_override: cannot set %s to %r: %s' %
                       (name, value, e)) from e


# Values that Lingvo's text format reads for a param that is None: a class
# ('type/module/Name'), a proto, or Lingvo's own spelling of None.
_LINGVO_TYPED_TEXTS = ('type/', 'proto/', 'NoneType')


def _Literal(text):
  """`text` as a Python literal (None, a number, list, quoted string...).

  Args:
    text: an override's value.

  Returns:
    The literal, or `text` itself when it is not one (e.g. a path).
  """
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def FindPipelines(params, path=''):
  """Every PipeliningLayer params inside `params`, depth first.

  Args:
    params: a hyperparams.Params tree.
    path: the dotted path of `params` (for messages).

  Returns:
    A list of (dotted path, PipeliningLayer params). Params are returned by
    reference: changing them changes the tree.
  """
  found = []
  if isinstance(params, hyperparams.Params):
    cls = getattr(params, 'cls', None) if 'cls' in params else None
    if isinstance(cls, type) and issubclass(cls, pipeline.PipeliningLayer):
      return [(path, params)]
    for key, value in params.IterParams():
      found.extend(FindPipelines(value, path + '.' + key if path else key))
  elif isinstance(params, (list, tuple)):
    for i, value in enumerate(params):
      found.extend(FindPipelines(value, '%s[%d]' % (path, i)))
  return found


def NumStages(pipeline_params):
  """K of a PipeliningLayer params (cell_tpl length or num_stages)."""
  if pipeline_params.cell_tpl is not None:
    return len(pipeline_params.cell_tpl)
  return pipeline_params.num_stages


def SetPipelineShape(cfg, num_stages=None, num_micro_batches=None,
                     schedule=None):
  """Overrides K, M and the schedule of every pipeline in `cfg`.

  Args:
    cfg: model params (changed in place).
    num_stages: new K, or None to keep.
    num_micro_batches: new M, or None to keep (clears micro_batch_size).
    schedule: a gpipe.schedules.registry.Names() name, or None to keep.

  Returns:
    The list of (path, pipeline params) found.

  Raises:
    ValueError: an override was asked for but the model has no pipeline, or
      a cell_tpl pipeline's stage count cannot change.
  """
  found = FindPipelines(cfg)
  if (num_stages or num_micro_batches or schedule) and not found:
    raise ValueError(
        '--num_stages/--num_micro_batches/--schedule: this model has no '
        'gpipe PipeliningLayer in its params, so there is nothing to '
        'pipeline')
  if schedule:
    schedule_registry.Get(schedule)  # A clear error for an unknown name.
  for path, pp in found:
    if num_stages:
      if pp.cell_tpl is not None and len(pp.cell_tpl) != num_stages:
        raise ValueError(
            '--num_stages=%d: the pipeline at %s is given as %d explicit '
            'stages (cell_tpl), which cannot be re-cut; build it from a flat '
            '`layers` list instead' % (num_stages, path, len(pp.cell_tpl)))
      if pp.layers is not None:
        pp.num_stages = num_stages
        pp.stage_sizes = None
    if num_micro_batches:
      pp.num_micro_batches = num_micro_batches
      pp.micro_batch_size = None
    if schedule:
      pp.schedule = schedule
  return found


def SetCompile(cfg, compile):  # pylint: disable=redefined-builtin
  """Sets ``compile`` (gpipe/xla.py) of every pipeline in `cfg` (--xla).

  Args:
    cfg: model params (changed in place).
    compile: 'xla' or 'xla_where_possible' (None: uncompiled).

  Raises:
    ValueError: the model has no pipeline.
  """
  found = FindPipelines(cfg)
  if not found:
    raise ValueError(
        '--xla: this model has no gpipe PipeliningLayer in its params, so '
        'there are no stage functions to compile; drop the flag')
  for _, pp in found:
    pp.compile = compile


def SetDecoding(cfg, pipelined=None, num_lanes=None):
  """Sets how the model's task decodes: pipelined in lanes or unpipelined.

  Args:
    cfg: model params (changed in place).
    pipelined: True/False for the task's `pipelined_decode`, or None to
      keep it.
    num_lanes: M for the task's `decode_micro_batches`, or None to keep.

  Raises:
    ValueError: a setting was given but the task has no pipelined decoder.
  """
  if pipelined is None and num_lanes is None:
    return
  task = cfg.task
  if 'pipelined_decode' not in task or 'decode_micro_batches' not in task:
    raise ValueError(
        '--pipelined_decode/--decode_micro_batches: the task of this model '
        '(%s) has no pipelined decoder; the Transformer task '
        '(tasks/mt/model.py, mt.* models) has one. Drop the flags' %
        task.cls.__name__)
  if pipelined is not None:
    task.pipelined_decode = pipelined
  if num_lanes is not None:
    if num_lanes < 1:
      raise ValueError('--decode_micro_batches=%d: give a number of lanes '
                       '>= 1' % num_lanes)
    task.decode_micro_batches = num_lanes


def SetStageDevices(cfg, devices, keep_explicit=False, loop=False,
                    data_parallel=1, exact=False):
  """Lays out every pipeline in `cfg` on `devices` (PipelineLayout).

  Args:
    cfg: model params (changed in place).
    devices: device strings, task by task; at least the devices one
      pipeline needs (any number with `loop`); with data_parallel=R, R
      equal groups of them, one per replica.
    keep_explicit: leave pipelines whose params already name devices alone
      (not with data_parallel > 1: the replicas need the devices given).
    loop: place stage k on devices[k % D]: with fewer devices than stages a
      device holds several stages (run breadth-first, a smaller bubble).
    data_parallel: R, data-parallel replicas of each pipeline: replica r runs
      on the r-th of R equal groups of `devices` (p.replica_devices).
    exact: every device must be used (a cluster's devices): R x D must equal
      len(devices); otherwise a single pipeline uses the first D.

  Raises:
    ValueError: the devices do not fit (see PipelineLayout).
  """
  for path, pp in FindPipelines(cfg):
    if (keep_explicit and data_parallel == 1 and
        (pp.stage_devices or pp.replica_devices)):
      continue
    replicas = PipelineLayout(path, pp, devices, data_parallel, loop, exact)
    if data_parallel > 1:
      pp.replica_devices = replicas
      pp.stage_devices = list(replicas[0])
    else:
      pp.stage_devices = replicas[0]


def PlacementRule(pipeline_params):
  """The placement rule of the pipeline's schedule (its registry entry)."""
  return schedule_registry.Get(pipeline_params.schedule).placement


def DevicesPerReplica(pipeline_params):
  """The devices one pipeline needs: K, or K/2 for a V ('zb_v')."""
  return layout.DevicesPerReplica(NumStages(pipeline_params),
                                  PlacementRule(pipeline_params))


def PipelineLayout(path, pp, devices, data_parallel=1, loop=False,
                   exact=False):
  """R lists of K stage devices for the pipeline at `path`.

  The layout is gpipe.runtime.layout's: replica r on the r-th run of D
  consecutive devices (neighbouring stages on one task first), stages
  placed as the schedule needs: 'zb_v' a V over K/2 devices (stage s on
  device min(s, K-1-s)), 'interleaved_1f1b' round-robin when there are fewer
  devices than stages.

  Args:
    path: the pipeline's dotted path (for messages).
    pp: its PipeliningLayer params.
    devices: device strings, task by task.
    data_parallel: R.
    loop: several stages per device, round-robin.
    exact: every device must be used.

  Returns:
    R lists of K device strings.

  Raises:
    ValueError: fewer devices than stages (without `loop`); with
      data_parallel (or exact), a device count that is not R x the devices
      one replica needs; the message names the counts and the flags to
      change.
  """
  k = NumStages(pp)
  rule = PlacementRule(pp)
  devices = list(devices)
  if data_parallel > 1:
    # The layout's own D (round-robin shares the devices among replicas).
    need = layout.DevicesPerReplica(k, rule, len(devices), loop,
                                    data_parallel)
    if not exact and not loop:
      # Virtual CPUs of this process come R x K: a V needs fewer.
      devices = devices[:data_parallel * need]
    per = len(devices) // data_parallel
    if len(devices) % data_parallel or (not loop and per != need):
      total = data_parallel * need
      raise ValueError(
          '--data_parallel=%d: the pipeline at %s needs %d device(s) per '
          'replica (%d stages%s), so R x K = %d workers/devices, but %d were '
          'given: set --worker_processes=%d (or --cluster_spec with %d '
          'servers), or change --data_parallel or --num_stages (devices: '
          '%s)' % (data_parallel, path, need, k,
                   ', two per device in a V' if rule == layout.V_SHAPE else '',
                   total, len(devices), total, total,
                   layout.CountByTask(devices)))
  elif rule == layout.V_SHAPE and (k % 2 or len(devices) < k // 2):
    raise ValueError(
        'the pipeline at %s runs schedule %r (two stages per device in a V) '
        'but has %d stages for %d devices/workers: use an even --num_stages '
        'of at most %d' % (path, pp.schedule, k, len(devices),
                           2 * len(devices)))
  elif (not loop and rule in (layout.ANY, layout.ONE_PER_DEVICE) and
        len(devices) < k):
    raise ValueError(
        'the pipeline at %s has %d stages but only %d devices/workers were '
        'given (%s): start as many workers as stages, pass '
        '--num_stages=%d, or --loop_stages to put several stages on each' %
        (path, k, len(devices), devices, len(devices)))
  elif not exact:
    devices = devices[:layout.DevicesPerReplica(k, rule, len(devices), loop)]
  try:
    return layout.Layout(devices, data_parallel, k, rule, loop)
  except layout.LayoutError as e:
    raise ValueError(
        'the pipeline at %s: %s. Change --data_parallel or --num_stages to '
        'fit, or use fewer devices (--devices_per_task, fewer workers)' %
        (path, e)) from None


def MaxStages(cfg):
  """The largest K of the pipelines in `cfg` (1 without any)."""
  return max([NumStages(pp) for _, pp in FindPipelines(cfg)] or [1])


def CheckDataParallel(cfg, data_parallel):
  """Raises a clear ValueError if `cfg` cannot run R data-parallel replicas.

  Args:
    cfg: model params.
    data_parallel: R (1: nothing to check).
  """
  if data_parallel < 1:
    raise ValueError('--data_parallel=%d: give the number of replicas, >= 1' %
                     data_parallel)
  if data_parallel > 1 and not FindPipelines(cfg):
    raise ValueError(
        '--data_parallel=%d: this model has no gpipe PipeliningLayer in its '
        'params, and data parallelism here runs R replicas of a pipeline. '
        'Use a pipelined model (see params/) or drop --data_parallel' %
        data_parallel)

