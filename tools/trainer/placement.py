"""Where the pipeline's stages run, and the session that drives them.

Three ways, by flags:

* default: one process with K virtual CPU devices (``/device:CPU:k``). They
  share one thread pool, so stages do not overlap: right for tests and small
  models, not for speed. ``--device_type=gpu`` (or ``auto`` on a host with
  GPUs) uses this process's GPUs instead.
* ``--worker_processes=N``: N local TensorFlow worker processes
  (``gpipe.runtime.local_cluster.LocalCluster``), each with
  ``--devices_per_task`` virtual CPUs (default 1); the session talks to
  worker 0. Workers are checked between steps.
* a cluster of running ``python -m gpipe.worker`` servers, e.g. on other
  hosts: ``--cluster_spec`` (``worker=host:port,...``, a JSON cluster dict or
  TF_CONFIG JSON) or ``TF_CONFIG`` in the environment. The trainer checks
  every task and asks it for its devices first (gpipe.runtime.devices), and
  uses ``--device_type`` devices of each (the first ``--devices_per_task``).
  The trainer does not restart these servers: after a loss it waits for
  them to serve again (``tools.trainer.remote_tasks``).

``--device_type=tpu`` stops at once, saying what TPUs the run has: a stage
runs on a TPU core only inside a compiled TPU computation, which is not
built (docs/TPU.md).

Stages are laid out on the devices task by task (gpipe.runtime.layout):
neighbouring stages on one task first, replicas across tasks. Each step runs
with a timeout, so a lost worker fails the step with an error instead of
blocking forever.
"""

import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import xla
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import devices as devices_lib
from gpipe.runtime import layout
from gpipe.runtime import local_cluster
from gpipe.runtime import session_cluster as session_cluster_lib
from lingvo import compat as tf
from lingvo.core import cluster_factory
from tools.trainer import remote_tasks


def ParseClusterSpec(text):
  """{'worker': [host:port, ...]} from 'worker=host:port,host:port'.

  Args:
    text: the --cluster_spec flag ('job=addr,addr' jobs separated by '@').

  Returns:
    A dict for tf.train.ClusterSpec.

  Raises:
    ValueError: a malformed spec, with an example of a good one
      (gpipe.runtime.cluster_spec.ParseJobs).
  """
  return cluster_spec_lib.ParseJobs(text)


def _LocalDeviceType(device_type):
  """The device type of stages in this process ('CPU' or 'GPU')."""
  gpus = tf.config.list_physical_devices('GPU')
  if device_type == 'gpu' and not gpus:
    raise ValueError('--device_type=gpu: this process sees no GPU '
                     '(tf.config.list_physical_devices is empty); use '
                     '--device_type=auto or cpu, or run where GPUs are')
  return 'GPU' if gpus and device_type in ('auto', 'gpu') else 'CPU'


def RefuseTpu(worker_processes, description, connect_timeout_secs,
               plan_only):
  """Raises devices.TpuNotBuiltError, saying what this run has of TPUs.

  Before any worker starts and any graph is built: within the seconds a
  running cluster takes to list its devices (each check bounded by
  connect_timeout_secs).
  """
  if worker_processes:
    raise devices_lib.TpuNotBuilt(
        '--worker_processes=%d starts local worker processes, whose devices '
        'are CPUs' % worker_processes)
  if description is not None and plan_only:
    raise devices_lib.TpuNotBuilt(
        'planning for %s (not contacted: --devices_per_task)' %
        description.Spec())
  if description is not None:
    found, has_tpus = devices_lib.TpuFound(
        devices_lib.Discover(description, connect_timeout_secs), description)
    raise devices_lib.TpuNotBuilt(found, has_tpus)
  tpus = tf.config.list_physical_devices('TPU')
  if tpus:
    raise devices_lib.TpuNotBuilt(
        'this process lists %d TPU device(s)' % len(tpus), has_tpus=True)
  raise devices_lib.TpuNotBuilt(
      "no TPU system found: this process lists no TPU device "
      "(tf.config.list_physical_devices('TPU') is empty), and no "
      '--cluster_spec or TF_CONFIG names the worker of a TPU host')


class WorkerRestartError(RuntimeError):
  """Lost local workers could not be replaced by fresh ones."""


def LaidOutDevices(worker_processes=0, cluster_spec='', device_type='auto',
                   devices_per_task=0, connect_timeout_secs=10.0,
                   environ=None):
  """The devices a Placement of these flags lays stages on, none started.

  This is Placement itself, so a plan is made for the devices the run will
  have: local worker processes and a cluster with devices_per_task are
  planned as for --mode=inspect_model (nothing is started or contacted); a
  running cluster without it is asked for its devices (Discover), as the
  run will.

  Args:
    worker_processes: local worker processes (0: none).
    cluster_spec: running workers, any form of cluster_spec.Parse ('':
      TF_CONFIG in `environ`, if set).
    device_type: 'auto', 'cpu', 'gpu' or 'tpu'.
    devices_per_task: the first N devices of each task (0: all); with
      worker_processes, each worker's virtual CPUs.
    connect_timeout_secs: the longest each check of a running worker takes.
    environ: the environment to read TF_CONFIG from (default os.environ).

  Returns:
    The device strings, task by task: the layout uses every one of them.
    None when the stages run on virtual CPUs of this process, which are
    made as many as the layout needs.

  Raises:
    ValueError: conflicting or impossible flags, named.
    gpipe.runtime.devices.DiscoveryError: a worker that cannot be used.
  """
  placement = Placement(
      1, worker_processes=worker_processes, cluster_spec=cluster_spec,
      device_type=device_type, devices_per_task=devices_per_task,
      connect_timeout_secs=connect_timeout_secs, environ=environ,
      plan_only=bool(worker_processes or devices_per_task))
  return list(placement.devices) if placement.exact else None


def WorkerArgs(pin_cores=False, log_dir=None, devices_per_task=0):
  """The local_cluster.LocalCluster arguments of --worker_processes."""
  return dict(pin_cores=pin_cores, log_dir=log_dir,
              cpu_devices=max(1, devices_per_task))


def StartLocalWorkers(num, pin_cores=False, log_dir=None,
                      devices_per_task=0):
  """`num` local workers as a run with --worker_processes=num starts them.

  For ``Placement(workers=...)``: several runs on the same workers.

  Returns:
    A running local_cluster.LocalCluster (the caller stops it).
  """
  return local_cluster.LocalCluster(
      num, **WorkerArgs(pin_cores, log_dir, devices_per_task))


class Placement:
  """Stage devices, the session target/config, and worker liveness."""

  def __init__(self, num_stages, worker_processes=0, cluster_spec='',
               step_timeout_secs=300, log_dir=None, pin_cores=False,
               device_type='auto', devices_per_task=0,
               connect_timeout_secs=10.0, plan_only=False, environ=None,
               worker_wait_secs=300, session_graph_optimizer=False,
               compiled=False, workers=None):
    """Sets up (and for worker_processes, starts) the devices.

    Args:
      num_stages: the devices in-process virtual CPUs provide (R x K).
      worker_processes: start this many local worker processes (0: none).
      cluster_spec: running workers, any form of
        gpipe.runtime.cluster_spec.Parse ('' for none: TF_CONFIG in
        `environ`, if set).
      step_timeout_secs: the longest a session run may take.
      log_dir: where local workers write their logs.
      pin_cores: pin local worker i to core i (taskset).
      device_type: 'auto', 'cpu', 'gpu' or 'tpu': the devices stages run on
        (auto: the accelerator every task has, else CPU).
      devices_per_task: use the first N devices of that type on each task
        (0: all); with worker_processes, each worker's virtual CPUs.
      connect_timeout_secs: the longest each check of a running worker may
        take.
      plan_only: do not start or ask workers: plan devices_per_task devices
        on each task (--mode=inspect_model); without a cluster and with
        device_type 'gpu', plan devices_per_task (default num_stages) GPUs
        in this process, which need not have any.
      environ: the environment to read TF_CONFIG from (default os.environ).
      worker_wait_secs: on Restart, how long to wait for lost servers of a
        running cluster to serve again.
      session_graph_optimizer: run Grappler over the session's graph (see
        SessionConfig).
      compiled: the stages are XLA-compiled (--xla): with Grappler on, the
        passes that rewrite compiled functions into ops XLA lacks are off
        (gpipe.xla.SessionConfig).
      workers: a running local_cluster.LocalCluster of worker_processes
        workers, started as ``StartLocalWorkers`` does, to use instead of
        starting them (several runs in one process, as the planner's timed
        runs: ``tools/trainer/timed_run.py``); ``Stop`` leaves it running
        and ``Restart`` is refused.

    Raises:
      ValueError: conflicting or impossible flags, named.
      gpipe.runtime.devices.TpuNotBuiltError: device_type 'tpu' (stages on
        TPU cores are not built), saying what TPUs the run has.
      gpipe.runtime.devices.DiscoveryError: a worker that cannot be used.
    """
    if worker_processes and cluster_spec:
      raise ValueError('give either --worker_processes or --cluster_spec, '
                       'not both')
    if device_type not in devices_lib.DEVICE_TYPES:
      raise ValueError('--device_type=%s: use one of %s' %
                       (device_type, ', '.join(devices_lib.DEVICE_TYPES)))
    if devices_per_task < 0:
      raise ValueError('--devices_per_task=%d: give a count >= 1 (or 0: all)'
                       % devices_per_task)
    if connect_timeout_secs <= 0:
      raise ValueError('--connect_timeout_secs=%s: give the seconds each '
                       'check of a worker may take, > 0' % connect_timeout_secs)
    self.num_stages = num_stages
    self.step_timeout_ms = int(step_timeout_secs * 1000)
    self.session_graph_optimizer = session_graph_optimizer
    self.compiled = compiled
    self.cluster = None
    self.restarts = 0
    # The servers of a running cluster (a RemoteTasks), or None.
    self.remote = None
    self.worker_wait_secs = worker_wait_secs
    self.description = None
    self.task_devices = None
    # --elastic: the servers sessions run on, numbered by the session (a
    # gpipe.runtime.session_cluster.SessionCluster), and the local workers
    # among them; None: the servers' own cluster (UseServers).
    self.session_cluster = None
    self.live_workers = None
    self._worker_args = WorkerArgs(pin_cores, log_dir, devices_per_task)
    self._borrowed = workers
    description = None if worker_processes else cluster_spec_lib.Resolve(
        cluster_spec, environ=environ, slurm=False)
    if device_type == 'tpu':
      RefuseTpu(worker_processes, description, connect_timeout_secs,
                 plan_only)
    if worker_processes:
      self._LocalWorkers(worker_processes, device_type, plan_only)
    elif description is not None:
      self._RunningCluster(description, device_type, devices_per_task,
                           connect_timeout_secs, plan_only)
    else:
      self._ThisProcess(num_stages, device_type, devices_per_task, plan_only)
    if self.task_devices is not None:
      self.devices = layout.Flatten(self.task_devices)
    self.distributed = bool(self.target)
    # Every device of a cluster (or of this process's GPUs) is used, so the
    # layout must fit them exactly; in-process CPUs are made to fit.
    self.exact = self.task_devices is not None or self.device_type != 'CPU'

  def _LocalWorkers(self, num, device_type, plan_only):
    """Starts (or plans) `num` local worker processes."""
    if device_type not in ('auto', 'cpu'):
      raise ValueError(
          '--device_type=%s with --worker_processes: local worker processes '
          'run on CPU; start a gpipe worker on each accelerator host '
          '(python -m gpipe.worker) and pass --cluster_spec or TF_CONFIG' %
          device_type)
    self.device_type = 'CPU'
    self.num_cpus = 1
    if plan_only:
      self.task_devices = devices_lib.PlannedDevices(
          num, 'cpu', self._worker_args['cpu_devices'])
      self.target = 'grpc://localhost'
      return
    if self._borrowed is not None:
      if self._borrowed.num_workers != num:
        raise ValueError('%d running local workers given for a run of %d' %
                         (self._borrowed.num_workers, num))
      self.cluster = self._borrowed
    else:
      self.cluster = local_cluster.LocalCluster(num, **self._worker_args)
    self.task_devices = self.cluster.task_devices
    self.target = self.cluster.target

  def _RunningCluster(self, description, device_type, devices_per_task,
                      connect_timeout_secs, plan_only):
    """Checks (or plans) the workers of `description` and their devices."""
    self.description = description
    self.num_cpus = 1
    if plan_only:
      if not devices_per_task:
        raise ValueError(
            'planning a layout for a cluster that is not running needs '
            '--devices_per_task (e.g. --devices_per_task=8 '
            '--device_type=gpu for hosts with 8 GPUs)')
      found = devices_lib.PlannedDevices(description.num_tasks, device_type,
                                         devices_per_task)
    else:
      found = devices_lib.Discover(description, connect_timeout_secs)
      self.remote = remote_tasks.RemoteTasks(description.workers)
    self.device_type = devices_lib.ChooseDeviceType(found, device_type)
    self.task_devices = devices_lib.SelectDevices(found, self.device_type,
                                                  devices_per_task)
    self.target = description.Target(0)

  def _ThisProcess(self, num_stages, device_type, devices_per_task,
                   plan_only=False):
    """num_stages virtual CPUs, or this process's GPUs (planned: any)."""
    self.target = ''
    if plan_only and device_type == 'gpu':
      # Planned GPUs are device names only: nothing runs on them, so this
      # process need not have them (--mode=inspect_model's GPU audit).
      self.device_type = 'GPU'
      self.devices = ['/device:GPU:%d' % g
                      for g in range(devices_per_task or num_stages)]
      self.num_cpus = 1
      return
    self.device_type = _LocalDeviceType(device_type)
    if self.device_type == 'CPU':
      self.devices = ['/device:CPU:%d' % k for k in range(num_stages)]
      self.num_cpus = num_stages
      return
    gpus = len(tf.config.list_physical_devices('GPU'))
    self.devices = ['/device:GPU:%d' % g
                    for g in range(min(gpus, devices_per_task or gpus))]
    self.num_cpus = 1

  def SessionConfig(self):
    """The ConfigProto: virtual CPUs, soft placement and an op timeout.

    Grappler's meta-optimizer is off for the session's graph unless
    session_graph_optimizer: a pipeline's session graph is mostly calls of
    stage functions, which each worker still optimizes when it
    instantiates them; on the session graph itself Grappler found little
    and its passes over the whole graph took a large share of the first
    step and of the master's memory (docs/BENCHMARKS.md, "Start-up"). The
    one rewrite of its that mattered there, Lingvo's norms' Pow(x, 2) to
    Square, the trainer builds itself (--square_norms).
    """
    config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        operation_timeout_in_ms=self.step_timeout_ms)
    if not self.session_graph_optimizer:
      config.graph_options.rewrite_options.disable_meta_optimizer = True
    elif self.compiled:
      xla.SessionConfig(config)
    if self.session_cluster is not None:
      self.session_cluster.Configure(config)
    if not self.distributed:
      config.device_count['CPU'] = self.num_cpus
    return config

  def RunOptions(self, trace=False):
    """RunOptions with the step timeout (and a full trace if asked)."""
    options = tf.compat.v1.RunOptions(timeout_in_ms=self.step_timeout_ms)
    if trace:
      options.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
    return options

  def NewSession(self, graph):
    """A session on the placement's target for `graph`.

    With a running cluster, first checks that its tasks reach each other
    (remote_tasks.RemoteTasks.Connect: TaskUnreachableError names a task
    that does not answer; it waits remote_tasks.CONNECT_WAIT_SECS for one,
    with --elastic on a running cluster at most --worker_wait_secs).
    """
    if self.remote is not None:
      lost_wait = None
      if self.elastic and self.cluster is None:
        # A task that does not answer is then a loss, which waits
        # --worker_wait_secs for it (elastic.Elastic.AfterLoss): not
        # waited for twice. A step that fails while every task answers is
        # retried as long as without --elastic.
        lost_wait = min(remote_tasks.CONNECT_WAIT_SECS,
                        self.worker_wait_secs)
      self.remote.Connect(self.target, gone=self._LocalWorkerExited,
                          lost_wait_secs=lost_wait)
    return tf.compat.v1.Session(
        self.target, graph=graph, config=self.SessionConfig())

  def LingvoCluster(self, do_eval=False):
    """The Lingvo cluster context to build a model in.

    Lingvo places the task's own ops (input, loss, optimizer) on its worker
    job's devices: '/job:localhost' in one process, '/job:worker' task 0
    with worker processes.
    """
    p = cluster_factory.Current().params.Copy()
    p.mode = 'sync'
    p.job = 'trainer_client'
    p.do_eval = do_eval
    if self.session_cluster is not None:
      p.worker.name = '/job:' + session_cluster_lib.JOB
    else:
      p.worker.name = '/job:worker' if self.distributed else '/job:localhost'
    p.worker.replicas = 1
    p.worker.cpus_per_replica = self.num_cpus
    p.worker.devices_per_split = self.num_cpus
    return cluster_factory.Cluster(p)

  def CheckAlive(self):
    """Raises local_cluster.WorkerDiedError if a local worker has exited."""
    if self.cluster is not None:
      self.cluster.CheckAlive(self.live_workers)

  def _LocalWorkerExited(self):
    """Whether a local worker of the run has exited (it cannot answer)."""
    try:
      self.CheckAlive()
    except local_cluster.WorkerDiedError:
      return True
    return False

  @property
  def elastic(self):
    """Whether sessions run on a session cluster (UseServers)."""
    return self.session_cluster is not None

  def UseServers(self, addresses, task_devices, task_names,
                 local_workers=None):
    """Runs the stages on these servers only, as tasks 0, 1, ... (--elastic).

    Sessions carry their own cluster of these addresses
    (gpipe.runtime.session_cluster), whatever cluster the servers were
    started with: the servers that still serve after one is lost, or one
    back at a new address. Each session's state is its own, so a step left
    running on an old session cannot touch the next one's.

    Args:
      addresses: 'host:port' of the servers, in the session's task order.
      task_devices: each server's devices as the session names them
        (SessionCluster.Rename).
      task_names: how messages name each server ('task 2').
      local_workers: with --worker_processes, the LocalCluster indices of
        the servers (only these are watched by CheckAlive).
    """
    self.session_cluster = session_cluster_lib.SessionCluster(addresses)
    self.target = self.session_cluster.target
    self.task_devices = [list(d) for d in task_devices]
    self.devices = layout.Flatten(self.task_devices)
    self.distributed = True
    self.exact = True
    self.live_workers = (list(local_workers) if local_workers is not None
                         else None)
    self.remote = remote_tasks.RemoteTasks(
        addresses, task_names=task_names,
        session_cluster=self.session_cluster)

  def Stop(self):
    """Stops the local workers it started (not those it was given)."""
    if self.cluster is not None and self.cluster is not self._borrowed:
      self.cluster.Stop()

  def Restart(self):
    """Stops every local worker and starts fresh ones in their places.

    The devices (task i of job 'worker') stay the same; the ports and the
    session target change, so a new graph and session are needed. Worker
    logs of restart n go to <log_dir>/restart_<n>/. With a running cluster,
    waits for its servers instead (WaitForRemoteTasks).

    Raises:
      WorkerRestartError: there are no local workers to restart, or the
        fresh workers did not start (the reason is in the message).
    """
    if self.cluster is None and self.remote is not None:
      self.WaitForRemoteTasks()
      return
    if self.cluster is None or self.cluster is self._borrowed:
      raise WorkerRestartError(
          'the trainer can only restart local worker processes it started '
          '(--worker_processes)')
    num = self.cluster.num_workers
    self.cluster.Stop()
    self.restarts += 1
    args = dict(self._worker_args)
    if args['log_dir']:
      args['log_dir'] = os.path.join(args['log_dir'],
                                     'restart_%d' % self.restarts)
    try:
      self.cluster = local_cluster.LocalCluster(num, **args)
    except (RuntimeError, OSError) as e:
      raise WorkerRestartError(
          'could not restart the %d local worker processes (restart %d): %s. '
          'Check the worker logs%s and the machine (memory, processes), '
          'then run the same command again to resume from the newest '
          'checkpoint' % (num, self.restarts, e, (' in %s' % args['log_dir'])
                          if args['log_dir'] else '')) from e
    self.target = self.cluster.target

  def WaitForRemoteTasks(self):
    """Waits up to worker_wait_secs until every server of the cluster answers.

    Their supervisor restarts lost servers at the same addresses; the
    devices and the session target stay the same, but a new graph and
    session are needed (a restarted server has none of the old state).

    Raises:
      WorkerRestartError: a server still does not answer after the wait;
        the message names it.
    """
    lost = self.remote.WaitServing(self.worker_wait_secs)
    if lost:
      raise WorkerRestartError(
          '%s after waiting %g s (--worker_wait_secs). The trainer does not '
          'start the servers of a running cluster: start the lost ones again '
          'at the same addresses, then run the same command to resume from '
          'the newest checkpoint' % (self.remote.Explain(lost),
                                     self.worker_wait_secs))
    self.restarts += 1
