"""Local TensorFlow worker processes, one per pipeline stage.

Virtual CPU devices in one process share one thread pool, so they cannot run
stages at the same time. Separate worker processes (each optionally pinned to
its own core with ``taskset``) can: this is how a CPU machine, or several
hosts, run a real pipeline. ``LocalCluster`` starts K ``gpipe.worker``
processes on free localhost ports, waits until they serve, gives the device
strings of their devices and the session target, checks that they are alive,
and stops them (also at interpreter exit). Its workers exit with the process
that started them.
"""

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import time

from gpipe.runtime import cluster_spec

JOB = cluster_spec.JOB


def FreePort():
  """A TCP port of localhost that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _Serving(port):
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.settimeout(0.2)
    return s.connect_ex(('localhost', port)) == 0


def StageDevice(task, job=JOB, index=0):
  """The canonical string of CPU `index` of worker `task` (see DeviceName)."""
  return cluster_spec.DeviceName(task, 'CPU', index, job)


class WorkerDiedError(RuntimeError):
  """A worker process of the pipeline exited."""


class LocalCluster:
  """K local TensorFlow worker processes."""

  def __init__(self, num_workers, pin_cores=False, intra_op_threads=1,
               inter_op_threads=2, log_dir=None, start_timeout=60.0,
               cpu_devices=1):
    """Starts the workers and waits until each one serves.

    Args:
      num_workers: K, one worker (one stage) each.
      pin_cores: pin worker i to core i % num_cores with `taskset`, so each
        stage is one core (what a one-core "device" means on a CPU box).
      intra_op_threads: threads per op in each worker.
      inter_op_threads: ops run concurrently in each worker.
      log_dir: where worker i writes worker_i.log (default: discarded).
      start_timeout: seconds to wait for the workers to serve.
      cpu_devices: virtual CPU devices per worker (device:CPU:0..n-1), which
        share the worker's threads.
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
    deadline = time.time() + start_timeout
    for i, port in enumerate(self.ports):
      while not _Serving(port):
        self.CheckAlive()
        if time.time() > deadline:
          self.Stop()
          raise RuntimeError('worker %d did not start serving on port %d '
                             'within %.0f s' % (i, port, start_timeout))
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
    """Raises WorkerDiedError if any worker has exited."""
    for i, proc in enumerate(self._procs):
      code = proc.poll()
      if code is not None:
        raise WorkerDiedError(
            'pipeline worker %d (pid %d, %s) exited with code %d' %
            (i, proc.pid, self.cluster_def[JOB][i], code))

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

  def Stop(self):
    """Kills the workers (idempotent)."""
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()
    for proc in self._procs:
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        pass
    for log in self._logs:
      if hasattr(log, 'close'):
        log.close()
    self._logs = []

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Stop()
