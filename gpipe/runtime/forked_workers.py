"""Local workers forked from a process that has imported TensorFlow once.

A worker started as a fresh interpreter imports TensorFlow and Lingvo's ops
before it can serve: about 3 CPU-seconds each. Sixteen local workers spent
50 CPU-seconds of a 2-core machine before the pipeline's first step, and a
worker restarted after a loss paid it again. Here one fork server
(``gpipe.runtime.fork_server``, a fresh interpreter in a session of its own)
imports them once, the first time a worker is started; every worker is a
fork of it and serves within a fraction of a second::

    launcher ──pipe──> fork server (imports TensorFlow, Lingvo's ops once)
                         ├─fork─> worker 0  (setsid, its core, its log)
                         ├─fork─> worker 1
                         └─fork─> worker 1' (a restart: no import again)

The fork server holds no TensorFlow runtime (no session, no server, no
device): each worker builds its own after the fork, as a fresh process
would. A forked worker behaves as one started by command line: its own
session, its own core with ``pin_cores``, its log file, the launcher's
environment of the moment, the same flags; it exits when the launcher dies
(it watches the launcher's process; the fork server exits when its request
pipe closes). The launcher holds a pidfd of each worker: it kills the
worker it started even if the fork server is gone, and a worker's exit code
comes from the fork server, which reaps a worker only when asked (so its
process id cannot be reused meanwhile).

Variables read at import or load time (``TF_*``, ``OMP_*``, ``MKL_*``,
``KMP_*``, ``PYTHON*``, ``LD_*``, ``MALLOC_*``, ``GLIBC_*``) are those of the
launcher when its fork server started: a later start with other values gets a fork server of its own.
``LocalCluster`` starts workers with a memory cap as commands (a cgroup
charges pages to whoever touched them first: the fork server's imported
pages would not count against a forked worker's cap), and every worker as
a command when ``GPIPE_FORK_WORKERS=0`` is set or the fork server cannot
start (it says why, once).
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from gpipe.runtime import child_env

# The environment variable that turns forking off (0: every worker is a
# fresh interpreter, the command line `python -m gpipe.worker`).
ENV = 'GPIPE_FORK_WORKERS'
# How long the fork server may take to import TensorFlow and Lingvo.
START_SECS = 180.0
# How long one answer of a started fork server may take.
ANSWER_SECS = 60.0
_IMPORT_TIME_PREFIXES = ('TF_', 'OMP_', 'MKL_', 'KMP_', 'PYTHON', 'LD_',
                         'MALLOC_', 'GLIBC_')

_lock = threading.Lock()
_servers = {}  # Import-time environment -> _Server.
_failed = []  # Why the fork server could not start, said once.


class ForkServerError(RuntimeError):
  """The fork server could not start or answer."""


def _PidfdsWork():
  try:
    os.close(os.pidfd_open(os.getpid()))
    return hasattr(signal, 'pidfd_send_signal')
  except (AttributeError, OSError):  # Old kernel, or a seccomp profile.
    return False


def Supported():
  """Whether workers can be forked here (not turned off; Linux pidfds)."""
  if os.environ.get(ENV, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return False
  return _PidfdsWork()


def Enabled():
  """Whether workers are forked here: Supported() and no failed server."""
  return not _failed and Supported()


def _Readable(fd, timeout):
  """Whether `fd` is readable within `timeout` seconds (None: no limit)."""
  poller = select.poll()  # Not select(): descriptors above 1023 too.
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def _ForgetServers():
  """In a forked child of a launcher: its servers are the parent's."""
  global _lock
  _lock = threading.Lock()
  _servers.clear()


def _ImportTimeKey(env):
  return tuple(sorted((k, v) for k, v in env.items()
                      if k.startswith(_IMPORT_TIME_PREFIXES)))


class _Server:
  """One fork server: its process and its request pipe, one at a time."""

  def __init__(self, env):
    self._lock = threading.Lock()
    self.broken = None
    try:
      self.proc = subprocess.Popen(
          [sys.executable, '-m', 'gpipe.runtime.fork_server'],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL, env=env, cwd=child_env.ROOT, text=True,
          bufsize=1, start_new_session=True)
    except OSError as e:
      raise ForkServerError('the workers\' fork server did not start: %s' %
                            e) from None
    reply = self._Read(START_SECS)
    if not reply.get('ready'):
      self._Break()
      raise ForkServerError('the workers\' fork server did not start: %s' %
                            reply.get('error', reply))

  def _Read(self, timeout):
    """Its next answer (a dict); {'error': why} if there is none."""
    if not _Readable(self.proc.stdout.fileno(), timeout):
      return {'error': 'no answer in %.0f s' % timeout, 'here': True}
    line = self.proc.stdout.readline()
    if not line:
      return {'error': 'it exited with code %s' % self.proc.poll(),
              'here': True}
    try:
      reply = json.loads(line)
    except ValueError:
      reply = None
    return reply if isinstance(reply, dict) else {
        'error': 'it answered %r' % line[:200], 'here': True}

  def _Break(self):
    """Ends this server (its answers can no longer be matched to requests)."""
    self.broken = self.broken or 'stopped'
    try:
      self.proc.kill()
      self.proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
      pass

  def Ask(self, **request):
    """The fork server's answer to `request`; ForkServerError if none."""
    with self._lock:
      if self.broken:
        raise ForkServerError('the workers\' fork server is gone (%s)' %
                              self.broken)
      try:
        self.proc.stdin.write(json.dumps(request) + '\n')
        self.proc.stdin.flush()
        reply = self._Read(ANSWER_SECS)
      except (OSError, ValueError) as e:
        reply = {'error': str(e), 'here': True}
      except BaseException:
        # Interrupted between request and answer: a later request would
        # read this one's answer.
        self.broken = 'interrupted while it answered'
        self._Break()
        raise
      # A failure here, or of anything but a fork, ends the server.
      if 'error' in reply and (reply.get('here') or request['op'] != 'start'):
        self.broken = reply['error']
        self._Break()
    if 'error' in reply:
      raise ForkServerError('the workers\' fork server: %s' % reply['error'])
    return reply


def _ServerFor():
  """The fork server for this environment, started on first use."""
  env = child_env.Environment()
  key = _ImportTimeKey(env)
  with _lock:
    server = _servers.get(key)
    if server is None or server.broken or server.proc.poll() is not None:
      server = _servers[key] = _Server(env)
    return server


class ForkedWorker:
  """A forked worker process, with the subprocess.Popen calls it needs.

  Attributes:
    pid: the worker's process id.
    returncode: None while it runs, then its exit code (-N: killed by
      signal N), as subprocess.Popen's; 255 when its fork server died
      before saying.
    args: its flags.
  """

  def __init__(self, argv, log_path=None, core=None):
    """Forks a worker of the fork server.

    Args:
      argv: the worker's flags (`python -m gpipe.worker`'s).
      log_path: its stdout and stderr (default: discarded).
      core: the CPU core to pin it to (default: not pinned).

    Raises:
      ForkServerError: the fork server could not start or fork.
    """
    self.args = list(argv)
    self.returncode = None
    self._lock = threading.Lock()
    self._server = _ServerFor()
    reply = self._server.Ask(
        op='start', argv=self.args,
        log=os.path.abspath(log_path) if log_path else None, core=core,
        env=child_env.Environment(), cwd=os.getcwd(), launcher=os.getpid())
    if not isinstance(reply.get('pid'), int):
      raise ForkServerError('the workers\' fork server answered %r' % reply)
    self.pid = reply['pid']
    try:
      # Not reaped before a poll asks: the pid is still this worker's.
      self._pidfd = os.pidfd_open(self.pid)
    except OSError as e:
      os.kill(self.pid, signal.SIGKILL)
      raise ForkServerError('no pidfd for worker %d: %s' %
                            (self.pid, e)) from None

  def __del__(self):
    if getattr(self, 'returncode', 0) is None:
      try:
        os.close(self._pidfd)
      except (AttributeError, OSError):
        pass

  def _Ended(self, timeout=0.0):
    return _Readable(self._pidfd, timeout)

  def poll(self):
    with self._lock:
      if self.returncode is None and self._Ended():
        try:
          code = self._server.Ask(op='poll', pid=self.pid)['code']
        except ForkServerError:
          code = 255  # Ended; how, only its reaped fork server knew.
        if code is not None:
          self.returncode = code
          os.close(self._pidfd)
      return self.returncode

  def wait(self, timeout=None):
    """Its exit code; subprocess.TimeoutExpired if it runs past `timeout`."""
    deadline = None if timeout is None else time.time() + timeout
    while self.poll() is None:
      left = None if deadline is None else deadline - time.time()
      if left is not None and left <= 0:
        raise subprocess.TimeoutExpired(self.args, timeout)
      with self._lock:
        if self.returncode is None:
          self._Ended(0.2 if left is None else min(left, 0.2))
    return self.returncode

  def send_signal(self, sig):
    with self._lock:
      if self.returncode is None:
        try:
          signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
          pass  # Ended, not yet asked about.

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def terminate(self):
    self.send_signal(signal.SIGTERM)


def Start(argv, log_path=None, core=None):
  """A ForkedWorker serving `argv` (see ForkedWorker).

  Raises:
    ForkServerError: no fork server here; Enabled() is False from now on,
      and the error says why (the caller starts a command instead).
  """
  try:
    return ForkedWorker(argv, log_path=log_path, core=core)
  except ForkServerError as e:
    if not _failed:
      _failed.append(str(e))
      print('gpipe: %s; local workers start as commands instead' % e,
            file=sys.stderr, flush=True)
    raise


if hasattr(os, 'register_at_fork'):
  os.register_at_fork(after_in_child=_ForgetServers)
