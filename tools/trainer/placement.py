"""Where the pipeline's stages run, and the session that drives them.

Three ways, by flags:

* default: one process with K virtual CPU devices (``/device:CPU:k``). They
  share one thread pool, so stages do not overlap: right for tests and small
  models, not for speed.
* ``--worker_processes=K``: K local TensorFlow worker processes
  (``gpipe.local_cluster.LocalCluster``), stage k on worker k; the session
  talks to worker 0. Workers are checked between steps.
* ``--cluster_spec='worker=host:port,host:port'``: existing TensorFlow
  servers (``python -m gpipe.worker``), e.g. on other hosts. The trainer
  does not restart them: after a loss it waits for them to serve again
  (``tools.trainer.remote_tasks``).

Each step runs with a timeout, so a lost worker fails the step with an error
instead of blocking forever.
"""

import os

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import local_cluster
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
    ValueError: a malformed spec, with an example of a good one.
  """
  example = "e.g. --cluster_spec='worker=10.0.0.1:2222,10.0.0.2:2222'"
  jobs = {}
  for part in text.split('@'):
    if '=' not in part:
      raise ValueError('--cluster_spec=%r: expected job=host:port,...; %s' %
                       (text, example))
    job, addrs = part.split('=', 1)
    addrs = [a.strip() for a in addrs.split(',') if a.strip()]
    if not addrs or any(':' not in a for a in addrs):
      raise ValueError('--cluster_spec=%r: each address needs host:port; %s' %
                       (text, example))
    jobs[job.strip()] = addrs
  if 'worker' not in jobs:
    raise ValueError("--cluster_spec=%r: needs a 'worker' job; %s" %
                     (text, example))
  return jobs


class WorkerRestartError(RuntimeError):
  """Lost local workers could not be replaced by fresh ones."""


class Placement:
  """Stage devices, the session target/config, and worker liveness."""

  def __init__(self, num_stages, worker_processes=0, cluster_spec='',
               step_timeout_secs=300, log_dir=None, pin_cores=False,
               worker_wait_secs=300):
    """Sets up (and for worker_processes, starts) the devices.

    Args:
      num_stages: K, the stages of the model's pipeline(s).
      worker_processes: start this many local worker processes (0: none).
      cluster_spec: existing servers, see ParseClusterSpec ('' for none).
      step_timeout_secs: the longest a session run may take.
      log_dir: where local workers write their logs.
      pin_cores: pin local worker i to core i (taskset).
      worker_wait_secs: on Restart, how long to wait for lost servers of
        cluster_spec to serve again.
    """
    if worker_processes and cluster_spec:
      raise ValueError('give either --worker_processes or --cluster_spec, '
                       'not both')
    self.num_stages = num_stages
    self.step_timeout_ms = int(step_timeout_secs * 1000)
    self.cluster = None
    self.restarts = 0
    # The servers of cluster_spec (a RemoteTasks), or None.
    self.remote = None
    self.worker_wait_secs = worker_wait_secs
    self._worker_args = dict(pin_cores=pin_cores, log_dir=log_dir)
    if worker_processes:
      self.cluster = local_cluster.LocalCluster(worker_processes,
                                                **self._worker_args)
      self.devices = self.cluster.devices
      self.target = self.cluster.target
      self.num_cpus = 1
    elif cluster_spec:
      jobs = ParseClusterSpec(cluster_spec)
      workers = jobs['worker']
      self.devices = [
          local_cluster.StageDevice(i) for i in range(len(workers))
      ]
      self.target = 'grpc://' + workers[0]
      self.num_cpus = 1
      self.remote = remote_tasks.RemoteTasks(workers)
    else:
      self.devices = ['/device:CPU:%d' % k for k in range(num_stages)]
      self.target = ''
      self.num_cpus = num_stages
    self.distributed = bool(self.target)

  def SessionConfig(self):
    """The ConfigProto: virtual CPUs, soft placement and an op timeout."""
    config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        operation_timeout_in_ms=self.step_timeout_ms)
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

    With a cluster spec, first checks that its tasks reach each other
    (remote_tasks.RemoteTasks.Connect: TaskUnreachableError names a task
    that does not answer).
    """
    if self.remote is not None:
      self.remote.Connect(self.target)
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
    p.worker.name = '/job:worker' if self.distributed else '/job:localhost'
    p.worker.replicas = 1
    p.worker.cpus_per_replica = self.num_cpus
    p.worker.devices_per_split = self.num_cpus
    return cluster_factory.Cluster(p)

  def CheckAlive(self):
    """Raises local_cluster.WorkerDiedError if a local worker has exited."""
    if self.cluster is not None:
      self.cluster.CheckAlive()

  def Stop(self):
    if self.cluster is not None:
      self.cluster.Stop()

  def Restart(self):
    """Stops every local worker and starts fresh ones in their places.

    The devices (task i of job 'worker') stay the same; the ports and the
    session target change, so a new graph and session are needed. Worker
    logs of restart n go to <log_dir>/restart_<n>/. With a cluster spec,
    waits for its servers instead (WaitForRemoteTasks).

    Raises:
      WorkerRestartError: there are no local workers to restart, or the
        fresh workers did not start (the reason is in the message).
    """
    if self.cluster is None and self.remote is not None:
      self.WaitForRemoteTasks()
      return
    if self.cluster is None:
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
    """Waits up to worker_wait_secs until every server of the spec answers.

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
          'start the servers of --cluster_spec: start the lost ones again at '
          'the same addresses, then run the same command to resume from the '
          'newest checkpoint' % (self.remote.Explain(lost),
                                 self.worker_wait_secs))
    self.restarts += 1
