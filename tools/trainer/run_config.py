"""The trainer's run configuration, settled once and passed on as data.

A run is decided in one place, in this order:

1. the registered model's params for each dataset ('Train', 'Test'), with
   ``--model_params_override`` and the pipeline shape (``--num_stages``,
   ``--num_micro_batches``, ``--schedule``) applied;
2. the placement (virtual CPUs, local worker processes or a cluster spec),
   sized by the pipeline's stages;
3. the stage devices written into those params.

Everything after that (the training loop, evaluation, decoding) reads the
resulting ``RunConfig`` (every setting of ``settings.Settings``, and the
above); nothing rebuilds the params or goes back to the flags.
"""

import dataclasses
import os
from typing import Optional

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import precision
from gpipe.runtime import cluster_spec as cluster_spec_lib
from lingvo.core import hyperparams
from tools.trainer import model_select
from tools.trainer import placement as placement_lib
from tools.trainer import planned
from tools.trainer import settings as settings_lib


class LogdirError(ValueError):
  """--logdir is missing or cannot be written."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(settings_lib.Settings):
  """What one trainer invocation does, where, and with which params.

  Every setting (``settings.Settings``: the flags, with what a plan decided)
  and what the run settled from them:

  Attributes:
    logdir: (a setting) here the absolute run directory (None for
      inspect_model).
    placement: a placement.Placement: stage devices, the session target and
      worker liveness. For inspect_model the planned one (nothing started,
      its devices need not exist), or None when the flags name no devices.
    train: the model params with the Train() input, stage devices set.
    test: the model params with the Test() input, stage devices set (None
      for inspect_model).
    planned_examples_per_second: the examples/s a plan (--plan) predicted
      for this run, which the training loop sets beside what it measures;
      None without a plan, or once the run is no longer the plan's (an
      elastic move).
  """
  placement: Optional[placement_lib.Placement]
  train: hyperparams.Params
  test: Optional[hyperparams.Params]
  planned_examples_per_second: Optional[float] = None


def PrepareLogdir(logdir, mode):
  """Creates logdir, checks that files can be written; its absolute path."""
  if not logdir:
    raise LogdirError('--logdir is required for --mode=%s' % mode)
  if not os.path.isabs(logdir) and os.environ.get('BUILD_WORKING_DIRECTORY'):
    # `bazel run` starts binaries in their runfiles: relative paths mean the
    # user's directory.
    logdir = os.path.join(os.environ['BUILD_WORKING_DIRECTORY'], logdir)
  probe = os.path.join(logdir, '.write_test_%d' % os.getpid())
  try:
    os.makedirs(logdir, exist_ok=True)
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise LogdirError(
        '--logdir=%s is not writable (%s: %s): choose a directory you can '
        'create and write to' % (logdir, type(e).__name__, e.strerror or e))
  return os.path.abspath(logdir)


def _ModelParams(asked, dataset, plan, input_seed, decoding=False):
  """The model params for `dataset` with the settings `asked` applied."""
  cfg = model_select.ModelParams(asked.model, dataset,
                                 asked.model_params_override)
  # The task's layers compute in fprop_dtype; variables stay float32.
  precision.SetFPropDtype(cfg.task, asked.fprop_dtype)
  model_select.SetPipelineShape(cfg, asked.num_stages,
                                asked.num_micro_batches, asked.schedule)
  if asked.xla:
    model_select.SetCompile(cfg, 'xla')
  if decoding:
    model_select.SetDecoding(cfg, asked.pipelined_decode,
                             asked.decode_micro_batches)
  if plan is not None:
    planned.Apply(cfg, plan)
  if input_seed is not None and cfg.input is not None and 'seed' in cfg.input:
    cfg.input.seed = input_seed
  return cfg


def _SetDevices(train, test, placement, data_parallel, loop_stages):
  """Lays out the pipelines of train (and test) on the placement's devices.

  Evaluation and decoding run one pipeline, on the first replica's devices.
  """
  model_select.SetStageDevices(
      train, placement.devices, keep_explicit=not placement.distributed,
      loop=loop_stages and placement.distributed,
      data_parallel=data_parallel, exact=placement.exact)
  if test is not None:
    model_select.SetStageDevices(
        test, placement.devices[:len(placement.devices) // data_parallel],
        keep_explicit=not placement.distributed,
        loop=loop_stages and placement.distributed, exact=placement.exact)


def _PlanLayout(train, where, data_parallel, loop_stages):
  """--mode=inspect_model: the layout on the devices the flags describe.

  Local worker processes are planned, not started; a cluster is planned
  with --devices_per_task and asked for its devices without it;
  --device_type=gpu without either plans GPUs of this process (which need
  not have any: nothing runs). Otherwise the pipelines keep their own
  (default) devices.

  Returns:
    The planned placement.Placement, or None.
  """
  described = where['worker_processes'] or cluster_spec_lib.Resolve(
      where['cluster_spec'], environ=where['environ'], slurm=False)
  local_gpus = not described and where['device_type'] == 'gpu'
  if not described and not local_gpus:
    if where.get('device_type') == 'tpu':
      # What Placement refuses with a cluster: said here too, before the
      # model is built for CPUs.
      placement_lib.RefuseTpu(0, None, where['connect_timeout_secs'], True)
    return None
  # Local GPUs are planned as many as the layout uses (a V uses K/2).
  needed = (max([model_select.DevicesPerReplica(pp)
                 for _, pp in model_select.FindPipelines(train)] or [1])
            if local_gpus else model_select.MaxStages(train))
  placement = placement_lib.Placement(
      needed * data_parallel,
      plan_only=bool(where['worker_processes'] or where['devices_per_task'] or
                     local_gpus),
      **where)
  _SetDevices(train, None, placement, data_parallel, loop_stages)
  return placement


def Settle(asked, plan=None, input_seed=None, environ=None, workers=None):
  """Decides the run: params, placement, stage devices (see module doc).

  Args:
    asked: the settings.Settings of the run (the flags, and what a plan
      decided: data_parallel, fprop_dtype, loop_stages).
    plan: a gpipe.plan.choice.Plan applied to the pipeline (--plan), or
      None.
    input_seed: the input order seed, when given on the command line.
    environ: the environment TF_CONFIG is read from (default os.environ).
    workers: running local workers for --worker_processes
      (``placement.Placement``'s `workers`), or None to start them.

  Returns:
    A RunConfig. With worker_processes the workers are running: the caller
    stops them with ``run.placement.Stop()``.

  Raises:
    ValueError: a setting, or a combination of them, that cannot run; the
      message names the flag and what to use.
  """
  try:
    precision.ParseFPropDtype(asked.fprop_dtype)
  except ValueError as e:
    raise ValueError('--%s' % e) from None
  train = _ModelParams(asked, 'Train', plan, input_seed)
  model_select.CheckDataParallel(train, asked.data_parallel)
  if asked.max_worker_restarts < 0:
    raise ValueError('--max_worker_restarts=%d: give a count >= 0' %
                     asked.max_worker_restarts)
  if asked.max_worker_restarts and not (
      asked.worker_processes or cluster_spec_lib.Resolve(
          asked.cluster_spec, environ=environ, slurm=False)):
    raise ValueError(
        '--max_worker_restarts=%d: there are no workers to restart; the '
        'stages run on devices of this process. Use --worker_processes=N '
        '(restarted by the trainer) or a running cluster (--cluster_spec or '
        'TF_CONFIG: servers restarted by their supervisor, waited for up to '
        '--worker_wait_secs)' % asked.max_worker_restarts)
  if asked.worker_wait_secs < 0:
    raise ValueError('--worker_wait_secs=%g: give seconds >= 0' %
                     asked.worker_wait_secs)
  where = dict(
      worker_processes=asked.worker_processes,
      cluster_spec=asked.cluster_spec,
      step_timeout_secs=asked.step_timeout_secs, pin_cores=asked.pin_cores,
      device_type=asked.device_type, devices_per_task=asked.devices_per_task,
      connect_timeout_secs=asked.connect_timeout_secs, environ=environ,
      session_graph_optimizer=asked.session_graph_optimizer,
      compiled=bool(asked.xla))
  settings = asked.Values()
  if asked.mode == 'inspect_model':
    placement = _PlanLayout(train, where, asked.data_parallel,
                            asked.loop_stages)
    settings.update(logdir=None)
    return RunConfig(placement=placement, train=train, test=None, **settings)
  settings.update(logdir=PrepareLogdir(asked.logdir, asked.mode))
  test = _ModelParams(asked, 'Test', plan, input_seed, decoding=True)
  placement = placement_lib.Placement(
      model_select.MaxStages(train) * asked.data_parallel,
      log_dir=os.path.join(settings['logdir'], 'workers'),
      worker_wait_secs=asked.worker_wait_secs, workers=workers, **where)
  try:
    _SetDevices(train, test, placement, asked.data_parallel,
                asked.loop_stages)
    if placement.remote is not None:
      # Errors about a lost server name the stages it holds.
      placement.remote.SetStages(train)
  except BaseException:
    placement.Stop()
    raise
  planned = plan.predicted.get('examples_per_second') if plan else None
  return RunConfig(placement=placement, train=train, test=test,
                   planned_examples_per_second=planned, **settings)
