"""Local TensorFlow worker processes, one per pipeline stage.

Virtual CPU devices in one process share one thread pool, so they cannot run
stages at the same time. Separate worker processes (each optionally pinned to
its own core with ``taskset``) can: this is how a CPU machine, or several
hosts, run a real pipeline. ``LocalCluster`` starts K ``gpipe.worker``
processes on free localhost ports, waits until they serve, gives the device
strings of their devices and the session target, checks that they are alive,
and stops them (also at interpreter exit). Its workers exit with the process
that started them.

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
from gpipe.runtime import cluster_spec
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


def FreePort():
  """A TCP port of localhost that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def StageDevice(task, job=JOB, index=0):
  """The canonical string of CPU `index` of worker `task` (see DeviceName)."""
  return cluster_spec.DeviceName(task, 'CPU', index, job)


class WorkerDiedError(RuntimeError):
  """A worker process of the pipeline exited."""


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
      pin_cores: pin worker i to core i % num_cores with `taskset`, so each
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
    self._procs = []
    self._logs = []
    self.memory_cap_bytes = memory_cap_bytes
    self._caps = []
    taskset = shutil.which('taskset') if pin_cores else None
    if pin_cores and taskset is None:
      raise RuntimeError('pin_cores needs the `taskset` command (util-linux)')
    ncores = os.cpu_count() or 1
    env = dict(os.environ)
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(
        [root] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    for i in range(num_workers):
      cmd = [
          sys.executable, '-m', 'gpipe.runtime.worker', '--cluster',
          json.dumps(self.cluster_def), '--task', str(i), '--exit_with_parent',
          '--intra_op_threads', str(intra_op_threads),
          '--inter_op_threads', str(inter_op_threads),
          '--cpu_devices', str(cpu_devices)
      ]
      if taskset:
        cmd = [taskset, '-c', str(i % ncores)] + cmd
      if memory_cap_bytes:
        try:
          cap = memory_cap_lib.MemoryCap(
              'gpipe_worker_%d_%d_%d' % (os.getpid(), id(self), i),
              memory_cap_bytes)
        except memory_cap_lib.MemoryCapError:
          self.Stop()
          raise
        self._caps.append(cap)
        cmd = cap.Command(cmd)
      if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log = open(os.path.join(log_dir, 'worker_%d.log' % i), 'w')
      else:
        log = subprocess.DEVNULL
      self._logs.append(log)
      # Each worker in its own session: with Linux's autogroup scheduling a
      # session shares one CPU share, so K workers in the launcher's session
      # got no more CPU than one on a busy machine.
      self._procs.append(
          subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                           stdin=subprocess.DEVNULL, start_new_session=True))
    atexit.register(self.Stop)
    if start_timeout is None:
      start_timeout = 60.0 + 15.0 * num_workers
    deadline = time.time() + start_timeout
    for i, address in enumerate(self.cluster_def[JOB]):
      while True:
        reason = liveness.Probe(address, _PROBE_SECS)
        if reason is None:
          break
        try:
          self.CheckAlive()
        except WorkerDiedError:
          self.Stop()
          raise
        if time.time() > deadline:
          self.Stop()
          raise RuntimeError('worker %d did not start serving at %s within '
                             '%.0f s (%s)%s' % (
                                 i, address, start_timeout, reason,
                                 '; its log: %s' % self._logs[i].name
                                 if log_dir else ''))
        time.sleep(0.2)

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

  def CheckAlive(self):
    """Raises WorkerDiedError if any worker has exited.

    WorkerMemoryCapError (a WorkerDiedError) if its memory cap killed it.
    """
    for i, proc in enumerate(self._procs):
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
             _MiB(self._caps[i].PeakBytes() or self.memory_cap_bytes)))
      raise WorkerDiedError('%s exited with code %d' % (where, code))

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
