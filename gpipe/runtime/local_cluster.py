"""Local TensorFlow worker processes, one per pipeline stage.

Virtual CPU devices in one process share one thread pool, so they cannot run
stages at the same time. Separate worker processes (each optionally pinned to
its own core with ``taskset``) can: this is how a CPU machine, or several
hosts, run a real pipeline. ``LocalCluster`` starts K ``gpipe.worker``
processes on free localhost ports (forks of one process that imported
TensorFlow once, ``gpipe.runtime.forked_workers``), waits until they serve,
gives the device strings of their devices and the session target, checks
that they are alive, and stops them (also at interpreter exit). Its workers
exit with the process that started them.

With ``memory_cap_bytes`` each worker runs under that memory cap (its own
cgroup, ``gpipe.runtime.memory_cap``): a stand-in for a device's memory. A
worker the cap kills is reported as such (``WorkerMemoryCapError``: which
worker, its cap, its peak, and to cut the model into more stages), and
``Call`` turns a session run that such a death would leave waiting into
that error.
"""

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

from gpipe.runtime import background
from gpipe.runtime import child_env
from gpipe.runtime import cluster_spec
from gpipe.runtime import forked_workers
from gpipe.runtime import liveness
from gpipe.runtime import memory_cap as memory_cap_lib

JOB = cluster_spec.JOB
# How long one check of a starting worker may take: a refused connection
# (not listening yet) returns at once, a listening worker answers in
# milliseconds.
_PROBE_SECS = 5.0


def _MiB(num_bytes):
  """'512 MiB' (as gpipe.measure.memory.FormatMiB, which sits a layer up)."""
  return '%.0f MiB' % (num_bytes / 2.0**20)


class _LogName:
  """A forked worker's log: its path (`name`), nothing to close here."""

  def __init__(self, path):
    self.name = path


def FreePort():
  """A TCP port of localhost that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def StageDevice(task, job=JOB, index=0):
  """The canonical string of CPU `index` of worker `task` (see DeviceName)."""
  return cluster_spec.DeviceName(task, 'CPU', index, job)


class WorkerDiedError(RuntimeError):
  """A worker process of the pipeline exited.

  Attributes:
    task: the worker's task index (0: the sessions' master), or None.
  """

  def __init__(self, message, task=None):
    super().__init__(message)
    self.task = task


class WorkerMemoryCapError(WorkerDiedError):
  """A worker process was killed by its memory cap."""


class LocalCluster:
  """K local TensorFlow worker processes."""

  def __init__(self, num_workers, pin_cores=False, intra_op_threads=1,
               inter_op_threads=2, log_dir=None, start_timeout=None,
               cpu_devices=1, memory_cap_bytes=None):
    """Starts the workers and waits until each one serves.

    Args:
      num_workers: K, one worker (one stage) each.
      pin_cores: pin worker i to core i % num_cores (of the cores this
        process may use) with `taskset`, so each
        stage is one core (what a one-core "device" means on a CPU box).
      intra_op_threads: threads per op in each worker.
      inter_op_threads: ops run concurrently in each worker.
      log_dir: where worker i writes worker_i.log (default: discarded).
      start_timeout: seconds to wait for the workers to serve (default: 60
        plus 15 per worker: every worker imports TensorFlow and Lingvo at
        once, so on a busy machine they take the longer the more there are;
        a worker that exits is reported at once).
      cpu_devices: virtual CPU devices per worker (device:CPU:0..n-1), which
        share the worker's threads.
      memory_cap_bytes: if set, each worker's memory cap (Linux cgroup v1,
        see gpipe.runtime.memory_cap; raises its MemoryCapError where that
        is not available).
    """
    if num_workers < 1:
      raise ValueError('a local cluster needs >= 1 worker, got %d' %
                       num_workers)
    self.num_workers = num_workers
    self.cpu_devices = cpu_devices
    self.ports = [FreePort() for _ in range(num_workers)]
    self.cluster_def = {JOB: ['localhost:%d' % p for p in self.ports]}
    self._replaced = {}
    self._procs = []
    self._logs = []
    self.memory_cap_bytes = memory_cap_bytes
    self._caps = []
    self._options = dict(pin_cores=pin_cores, intra_op_threads=intra_op_threads,
                         inter_op_threads=inter_op_threads, log_dir=log_dir,
                         cpu_devices=cpu_devices)
    if pin_cores and shutil.which('taskset') is None:
      raise RuntimeError('pin_cores needs the `taskset` command (util-linux)')
    for i in range(num_workers):
      try:
        proc, log, cap = self._Start(i, 'worker_%d.log' % i)
      except memory_cap_lib.MemoryCapError:
        self.Stop()
        raise
      self._procs.append(proc)
      self._logs.append(log)
      if cap is not None:
        self._caps.append(cap)
    atexit.register(self.Stop)
    if start_timeout is None:
      start_timeout = 60.0 + 15.0 * num_workers
    self._AwaitServing(list(range(num_workers)), start_timeout)

  def _Start(self, i, log_name):
    """Starts the process of worker `i`; (process, log file, memory cap).

    The process is a fork of the workers' fork server (a ForkedProcess, see
    gpipe.runtime.forked_workers), or a `python -m gpipe.runtime.worker`
    command (a subprocess.Popen) under a memory cap or with forking off.
    """
    opts = self._options
    taskset = shutil.which('taskset') if opts['pin_cores'] else None
    # The cores this process may use (a container's cpuset), in order.
    cores = sorted(os.sched_getaffinity(0)) or [0]
    core = cores[i % len(cores)]
    env = child_env.Environment()
    flags = [
        '--cluster', json.dumps(self.cluster_def), '--task', str(i),
        '--exit_with_parent',
        '--intra_op_threads', str(opts['intra_op_threads']),
        '--inter_op_threads', str(opts['inter_op_threads']),
        '--cpu_devices', str(opts['cpu_devices'])
    ]
    log_path = (os.path.join(opts['log_dir'], log_name)
                if opts['log_dir'] else None)
    if log_path:
      os.makedirs(opts['log_dir'], exist_ok=True)
    if not self.memory_cap_bytes and forked_workers.Enabled():
      # A fork of the process that imported TensorFlow once (a memory cap
      # needs a fresh process: see gpipe.runtime.forked_workers).
      try:
        proc = forked_workers.Start(
            flags, log_path=log_path,
            core=core if opts['pin_cores'] else None)
        return (proc, _LogName(log_path) if log_path else subprocess.DEVNULL,
                None)
      except forked_workers.ForkServerError:
        pass  # It said why: a command instead.
    cmd = [sys.executable, '-m', 'gpipe.runtime.worker'] + flags
    if taskset:
      cmd = [taskset, '-c', str(core)] + cmd
    cap = None
    if self.memory_cap_bytes:
      cap = memory_cap_lib.MemoryCap(
          'gpipe_worker_%d_%d_%d_%d' % (os.getpid(), id(self), i,
                                        self._replaced.get(i, 0)),
          self.memory_cap_bytes)
      cmd = cap.Command(cmd)
    if log_path:
      log = open(log_path, 'w')
    else:
      log = subprocess.DEVNULL
    # Each worker in its own session: with Linux's autogroup scheduling a
    # session shares one CPU share, so K workers in the launcher's session
    # got no more CPU than one on a busy machine.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return proc, log, cap

  def _AwaitServing(self, workers, start_timeout, on_failure=None):
    """Waits until each of `workers` serves.

    Args:
      workers: task indices.
      start_timeout: seconds.
      on_failure: called before raising (default: Stop, every worker).
    """
    on_failure = on_failure or self.Stop
    deadline = time.time() + start_timeout
    for i in workers:
      address = self.cluster_def[JOB][i]
      while True:
        reason = liveness.Probe(address, _PROBE_SECS)
        if reason is None:
          break
        try:
          # While starting all, any one's exit is reported at once.
          self.CheckAlive(None if len(workers) == self.num_workers else [i])
        except WorkerDiedError:
          on_failure()
          raise
        if time.time() > deadline:
          # Named before on_failure (Stop forgets the logs).
          log = getattr(self._logs[i], 'name', None)
          on_failure()
          raise RuntimeError('worker %d did not start serving at %s within '
                             '%.0f s (%s)%s' % (
                                 i, address, start_timeout, reason,
                                 '; its log: %s' % log if log else ''))
        time.sleep(0.2)

  def ReplaceWorker(self, i, start_timeout=None):
    """Starts a fresh process for worker `i` at a new port, the others kept.

    The other workers keep the cluster description they were started with,
    which names worker i's old port: only sessions that carry a cluster of
    their own (gpipe.runtime.session_cluster) reach the replacement. Its
    log is worker_<i>.replaced_<n>.log.

    Args:
      i: the worker's task index.
      start_timeout: seconds to wait for it to serve (default 75).

    Raises:
      WorkerDiedError: it exited while starting.
      RuntimeError: it did not serve in time.
    """
    old = self._procs[i]
    if old.poll() is None:
      old.kill()
      old.wait()
    if self._caps:
      self._caps[i].Remove()
    if hasattr(self._logs[i], 'close'):
      self._logs[i].close()
    self._replaced[i] = self._replaced.get(i, 0) + 1
    self.ports[i] = FreePort()
    self.cluster_def[JOB][i] = 'localhost:%d' % self.ports[i]
    proc, log, cap = self._Start(i, 'worker_%d.replaced_%d.log' %
                                 (i, self._replaced[i]))
    self._procs[i], self._logs[i] = proc, log
    if cap is not None:
      self._caps[i] = cap
    self._AwaitServing([i], 75.0 if start_timeout is None else start_timeout,
                       on_failure=proc.kill)

  @property
  def target(self):
    """The session target (worker 0's gRPC address)."""
    return 'grpc://localhost:%d' % self.ports[0]

  @property
  def task_devices(self):
    """Each worker's device strings (its CPUs), in task order."""
    return [[StageDevice(i, index=c) for c in range(self.cpu_devices)]
            for i in range(self.num_workers)]

  @property
  def devices(self):
    """Every worker's device strings, task by task."""
    return [d for task in self.task_devices for d in task]

  def ClusterSpecDict(self):
    return dict(self.cluster_def)

  def ClusterSpec(self):
    """The workers as the trainer's --cluster_spec, 'worker=h:p,h:p'."""
    return '%s=%s' % (JOB, ','.join(self.cluster_def[JOB]))

  def CheckAlive(self, workers=None):
    """Raises WorkerDiedError if any worker (of `workers`) has exited.

    WorkerMemoryCapError (a WorkerDiedError) if its memory cap killed it.

    Args:
      workers: the task indices to check (default: every worker).
    """
    for i, proc in enumerate(self._procs):
      if workers is not None and i not in workers:
        continue
      code = proc.poll()
      if code is None:
        continue
      where = 'pipeline worker %d (pid %d, %s)' % (i, proc.pid,
                                                   self.cluster_def[JOB][i])
      if self._caps and self._caps[i].OomKills():
        raise WorkerMemoryCapError(
            '%s was killed by its memory cap of %s (peak %s): the weights '
            'and activations of its stages do not fit. Cut the model into '
            'more stages on more workers (a larger K), or raise the cap' %
            (where, _MiB(self.memory_cap_bytes),
             _MiB(self._caps[i].PeakBytes() or self.memory_cap_bytes)),
            task=i)
      raise WorkerDiedError('%s exited with code %d' % (where, code), task=i)

  def Call(self, fn, poll_secs=0.2, grace_secs=2.0):
    """Returns fn() (session work on the workers), failing at once if one dies.

    fn runs in a thread of its own while the workers are checked. A worker
    that exits before fn returns (e.g. killed by its memory cap) raises its
    WorkerDiedError (WorkerMemoryCapError) here at once, even where fn would
    wait forever: a session whose master (worker 0) died waits for it to
    serve again. The other workers are stopped; the abandoned run's thread
    ends with the process.

    Args:
      fn: a function of no arguments.
      poll_secs: how often the workers are checked.
      grace_secs: after fn raised, how long to look for a worker's exit (it
        can be seen a moment after the RPC to it failed).

    Returns:
      What fn returns.
    """
    call = background.BackgroundCall(fn)
    while not call.Wait(poll_secs):
      try:
        self.CheckAlive()
      except WorkerDiedError:
        self._Kill()
        raise
    if call.error is not None:
      deadline = time.time() + grace_secs
      while True:
        try:
          self.CheckAlive()
        except WorkerDiedError as e:
          raise e from call.error
        if time.time() >= deadline:
          raise call.error
        time.sleep(poll_secs / 4)
    return call.Result()

  def CloseSession(self, session, wait_secs=10.0):
    """Closes a session on the workers without waiting on a dead master.

    A session whose master (worker 0) died would wait for it forever in
    ``close()``, also when it is garbage-collected. The close runs in a
    daemon thread that holds the session, so such a session is never
    closed, nor collected, in the caller's thread.

    Args:
      session: a tf.compat.v1.Session on this cluster's target.
      wait_secs: how long to wait for a live master to close it.
    """
    thread = threading.Thread(target=session.close, daemon=True)
    thread.start()
    thread.join(wait_secs)

  def MemoryPeakBytes(self):
    """Each worker's peak memory as its cap counts it (None without cap)."""
    if not self._caps:
      return [None] * self.num_workers
    return [cap.PeakBytes() for cap in self._caps]

  @property
  def pids(self):
    return [p.pid for p in self._procs]

  def PeakRssBytes(self):
    """Each worker's peak resident memory so far (VmHWM; None if gone)."""
    peaks = []
    for proc in self._procs:
      try:
        with open('/proc/%d/status' % proc.pid) as f:
          kb = [line.split()[1] for line in f if line.startswith('VmHWM:')]
        peaks.append(int(kb[0]) * 1024 if kb else None)
      except OSError:
        peaks.append(None)
    return peaks

  def KillWorker(self, i):
    """Kills worker `i` if it still runs (a worker given up on: wedged).

    Returns:
      Whether it was running.
    """
    proc = self._procs[i]
    if proc.poll() is not None:
      return False
    proc.kill()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass  # In uninterruptible sleep: it goes when the kernel lets it.
    if self._caps:
      self._caps[i].Remove()
    return True

  def _Kill(self):
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()

  def Stop(self):
    """Kills the workers and removes their memory caps (idempotent)."""
    self._Kill()
    for proc in self._procs:
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        pass
    for cap in self._caps:
      cap.Remove()
    for log in self._logs:
      if hasattr(log, 'close'):
        log.close()
    self._logs = []

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Stop()
