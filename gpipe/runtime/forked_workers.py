"""Local workers forked from a process that has imported TensorFlow once.

A worker started as a fresh interpreter imports TensorFlow and Lingvo's ops
before it can serve: about 3 CPU-seconds each. Sixteen local workers spent
50 CPU-seconds of a 2-core machine before the pipeline's first step, and a
worker restarted after a loss paid it again. Here one fork server (Python's
``multiprocessing`` 'forkserver' start method) imports them once, the first
time a worker is started; every worker is a fork of it and serves within a
fraction of a second::

    trainer ──starts──> fork server (imports TensorFlow, Lingvo's ops once)
                          ├─fork─> worker 0  (setsid, its core, its log)
                          ├─fork─> worker 1
                          └─fork─> worker 1' (a restart: no import again)

The fork server holds no TensorFlow runtime (no session, no server, no
device): each worker builds its own after the fork, as a fresh process
would. A worker forked this way behaves as one started by command line:
its own session (``setsid``), its own core with ``pin_cores``, its log file,
the launcher's environment of the moment, the same flags; it exits when the
launcher dies (it watches the launcher's process, not its parent; the fork
server exits once its last worker has). ``LocalCluster`` starts workers with a memory cap as commands (a
cgroup charges pages to whoever touched them first: the fork server's
imported pages would not count against a forked worker's cap), and every
worker as a command when ``GPIPE_FORK_WORKERS=0`` is set.
"""

import multiprocessing
import os
import subprocess
import sys

# The environment variable that turns forking off (0: every worker is a
# fresh interpreter, the command line `python -m gpipe.worker`).
ENV = 'GPIPE_FORK_WORKERS'
_PRELOAD = 'gpipe.runtime.worker_preload'
_context = None


def Enabled():
  """Whether workers are forked here (Linux's fork server, not turned off)."""
  if os.environ.get(ENV, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return False
  return 'forkserver' in multiprocessing.get_all_start_methods()


def _Context():
  global _context
  if _context is None:
    context = multiprocessing.get_context('forkserver')
    # The fork server's own start: the first worker waits for this import.
    context.set_forkserver_preload([_PRELOAD])
    _context = context
  return _context


def _Serve(argv, log_path, core, environ, launcher_pid):
  """The forked worker: detaches, redirects its output, then serves."""
  os.setsid()
  os.environ.clear()
  os.environ.update(environ)
  out = os.open(log_path or os.devnull,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  null = os.open(os.devnull, os.O_RDONLY)
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(null, 0)
  os.dup2(out, 1)
  os.dup2(out, 2)
  os.close(out)
  os.close(null)
  if core is not None:
    os.sched_setaffinity(0, {core})
  from gpipe.runtime import worker  # pylint: disable=g-import-not-at-top
  # Its parent is the fork server: it follows its launcher's end instead.
  code = worker.main(argv, launcher_pid=launcher_pid)
  sys.stdout.flush()
  sys.stderr.flush()
  sys.exit(code or 0)


class ForkedWorker:
  """A forked worker process, with the subprocess.Popen calls it needs.

  Attributes:
    pid: the worker's process id.
    returncode: None while it runs, then its exit code (-N: killed by
      signal N), as subprocess.Popen's.
  """

  def __init__(self, argv, log_path=None, core=None):
    """Forks a worker of the fork server and returns once it runs.

    Args:
      argv: the worker's flags (`python -m gpipe.worker`'s).
      log_path: its stdout and stderr (default: discarded).
      core: the CPU core to pin it to (default: not pinned).
    """
    self._process = _Context().Process(
        target=_Serve,
        args=(list(argv), log_path, core, dict(os.environ), os.getpid()),
        name='gpipe-worker', daemon=True)
    self._process.start()
    self.pid = self._process.pid
    self.returncode = None
    self.args = list(argv)

  def poll(self):
    if self.returncode is None:
      self.returncode = self._process.exitcode
    return self.returncode

  def wait(self, timeout=None):
    """Its exit code; subprocess.TimeoutExpired if it runs past `timeout`."""
    self._process.join(timeout)
    if self.poll() is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def kill(self):
    if self.poll() is None:
      try:
        self._process.kill()
      except (OSError, ValueError):
        pass  # Gone in between.

  def terminate(self):
    if self.poll() is None:
      try:
        self._process.terminate()
      except (OSError, ValueError):
        pass


def Start(argv, log_path=None, core=None):
  """A ForkedWorker serving `argv` (see ForkedWorker)."""
  return ForkedWorker(argv, log_path=log_path, core=core)

