"""The trainer's run configuration, settled once and passed on as data.

A run is decided in one place, in this order:

1. the registered model's params for each dataset ('Train', 'Test'), with
   ``--model_params_override`` and the pipeline shape (``--num_stages``,
   ``--num_micro_batches``, ``--schedule``) applied;
2. the placement (virtual CPUs, local worker processes or a cluster spec),
   sized by the pipeline's stages;
3. the stage devices written into those params.

Everything after that (the training loop, evaluation, decoding) reads the
resulting ``RunConfig``; nothing rebuilds the params or goes back to the flags.
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


class LogdirError(ValueError):
  """--logdir is missing or cannot be written."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What one trainer invocation does, where, and with which params.

  Attributes:
    model: the registered model name, 'family.ClassName'.
    mode: 'train', 'eval', 'decode', 'train_and_eval' or 'inspect_model'.
    logdir: the absolute run directory (None for inspect_model).
    placement: a placement.Placement: stage devices, the session target and
      worker liveness. For inspect_model the planned one (nothing started,
      its devices need not exist), or None when the flags name no devices.
    train: the model params with the Train() input, stage devices set.
    test: the model params with the Test() input, stage devices set.
    seed: the graph-level random seed.
    max_steps: train to this global step (None: p.train.max_steps).
    checkpoint_every_n_steps: checkpoint period.
    log_every_n_steps: console line and summary period.
    trace_every_n_steps: traced-step period (0: never).
    eval_after_train: in train mode, evaluate on Test() at the end.
    decode_max_batches: decode at most this many batches (None: all).
    fprop_dtype: the layers' compute dtype, 'float32' or 'bfloat16'.
    data_parallel: R, data-parallel replicas of the training pipeline(s).
    max_worker_restarts: how often a lost worker may be replaced (local
      workers restarted, servers of a running cluster waited for) and
      training resumed from the newest checkpoint.
  """
  model: str
  mode: str
  logdir: Optional[str]
  placement: Optional[placement_lib.Placement]
  train: hyperparams.Params
  test: Optional[hyperparams.Params]
  seed: int = 1234
  max_steps: Optional[int] = None
  checkpoint_every_n_steps: int = 100
  log_every_n_steps: int = 10
  trace_every_n_steps: int = 100
  eval_after_train: bool = True
  decode_max_batches: Optional[int] = None
  fprop_dtype: str = 'float32'
  data_parallel: int = 1
  max_worker_restarts: int = 0


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


def _ModelParams(model, dataset, override, num_stages, num_micro_batches,
                 schedule, input_seed, fprop_dtype, plan=None, xla=False,
                 decode_micro_batches=None, pipelined_decode=None):
  cfg = model_select.ModelParams(model, dataset, override)
  # The task's layers compute in fprop_dtype; variables stay float32.
  precision.SetFPropDtype(cfg.task, fprop_dtype)
  model_select.SetPipelineShape(cfg, num_stages, num_micro_batches, schedule)
  if xla:
    model_select.SetCompile(cfg, 'xla')
  model_select.SetDecoding(cfg, pipelined_decode, decode_micro_batches)
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


def Settle(model, mode, logdir=None, override='', num_stages=None,
           num_micro_batches=None, schedule=None, input_seed=None,
           xla=False, worker_processes=0,
           cluster_spec='', pin_cores=False, loop_stages=False,
           step_timeout_secs=300, fprop_dtype='float32', data_parallel=1,
           max_worker_restarts=0, device_type='auto', devices_per_task=0,
           connect_timeout_secs=10.0, environ=None, worker_wait_secs=300,
           decode_micro_batches=None, pipelined_decode=None, plan=None,
           session_graph_optimizer=False, **settings):
  """Decides the run: params, placement, stage devices (see module doc).

  Args:
    model: the registered model name.
    mode: the trainer mode.
    logdir: the run directory (created; not needed for inspect_model).
    override: --model_params_override text.
    num_stages: override K of every pipeline (None: keep).
    num_micro_batches: override M (None: keep).
    schedule: override the pipeline schedule (None: keep).
    xla: compile every pipeline's stage functions with XLA
      (compile='xla'; False: keep the params').
    input_seed: the input order seed, when given on the command line.
    worker_processes: start this many local worker processes (0: none).
    cluster_spec: running workers, 'worker=host:port,...', a JSON cluster
      dict or TF_CONFIG JSON ('' for none: TF_CONFIG in the environment,
      if set).
    pin_cores: pin local worker i to core i.
    loop_stages: with fewer workers than stages, stage k on worker k mod D.
    fprop_dtype: 'float32' or 'bfloat16' (mixed precision, gpipe.precision);
      anything else is a ValueError saying what to use.
    step_timeout_secs: the longest a session run may take.
    data_parallel: R replicas of the training pipeline on R x K devices
      (evaluation and decoding run one pipeline, on the first replica's).
    max_worker_restarts: restarts of lost workers (needs worker_processes,
      or a running cluster whose servers a supervisor restarts).
    device_type: 'auto', 'cpu', 'gpu' or 'tpu': the devices stages run on.
    devices_per_task: use the first N devices of each task (0: all); with
      worker_processes, each local worker's virtual CPUs; for inspect_model
      with a cluster, the devices each task is planned to have (no
      connection is made).
    connect_timeout_secs: the longest each check of a running worker takes.
    environ: the environment TF_CONFIG is read from (default os.environ).
    worker_wait_secs: with a running cluster, how long a restart waits for
      lost servers to serve again.
    decode_micro_batches: M, lanes of pipelined decoding (None: the
      task's default).
    pipelined_decode: True/False: decode through the pipeline stages or
      unpipelined (None: the task's default).
    plan: a gpipe.plan.choice.Plan applied to the pipeline (--plan), or
      None.
    session_graph_optimizer: run Grappler over the session's graph.
    **settings: the other RunConfig fields (seed, max_steps, periods...).

  Returns:
    A RunConfig. With worker_processes the workers are running: the caller
    stops them with ``run.placement.Stop()``.
  """
  try:
    precision.ParseFPropDtype(fprop_dtype)
  except ValueError as e:
    raise ValueError('--%s' % e) from None
  shape = (override, num_stages, num_micro_batches, schedule, input_seed,
           fprop_dtype, plan, xla)
  train = _ModelParams(model, 'Train', *shape)
  settings['fprop_dtype'] = fprop_dtype
  model_select.CheckDataParallel(train, data_parallel)
  if max_worker_restarts < 0:
    raise ValueError('--max_worker_restarts=%d: give a count >= 0' %
                     max_worker_restarts)
  if max_worker_restarts and not (worker_processes or cluster_spec_lib.Resolve(
      cluster_spec, environ=environ, slurm=False)):
    raise ValueError(
        '--max_worker_restarts=%d: there are no workers to restart; the '
        'stages run on devices of this process. Use --worker_processes=N '
        '(restarted by the trainer) or a running cluster (--cluster_spec or '
        'TF_CONFIG: servers restarted by their supervisor, waited for up to '
        '--worker_wait_secs)' % max_worker_restarts)
  if worker_wait_secs < 0:
    raise ValueError('--worker_wait_secs=%g: give seconds >= 0' %
                     worker_wait_secs)
  settings.update(data_parallel=data_parallel,
                  max_worker_restarts=max_worker_restarts)
  where = dict(worker_processes=worker_processes, cluster_spec=cluster_spec,
               step_timeout_secs=step_timeout_secs, pin_cores=pin_cores,
               device_type=device_type, devices_per_task=devices_per_task,
               connect_timeout_secs=connect_timeout_secs, environ=environ,
               session_graph_optimizer=session_graph_optimizer)
  if mode == 'inspect_model':
    placement = _PlanLayout(train, where, data_parallel, loop_stages)
    return RunConfig(model=model, mode=mode, logdir=None, placement=placement,
                     train=train, test=None, **settings)
  logdir = PrepareLogdir(logdir, mode)
  test = _ModelParams(model, 'Test', *shape,
                      decode_micro_batches=decode_micro_batches,
                      pipelined_decode=pipelined_decode)
  placement = placement_lib.Placement(
      model_select.MaxStages(train) * data_parallel,
      log_dir=os.path.join(logdir, 'workers'),
      worker_wait_secs=worker_wait_secs, **where)
  try:
    _SetDevices(train, test, placement, data_parallel, loop_stages)
    if placement.remote is not None:
      # Errors about a lost server name the stages it holds.
      placement.remote.SetStages(train)
  except BaseException:
    placement.Stop()
    raise
  return RunConfig(model=model, mode=mode, logdir=logdir, placement=placement,
                   train=train, test=test, **settings)
