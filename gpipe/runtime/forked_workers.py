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
``KMP_*``, ``OPENBLAS_*``, ``GOTO_*``, ``PYTHON*``, ``LD_*``, ``MALLOC_*``,
``GLIBC_*``, ``GPIPE_*``, the locale's, ``TZ``, ``TMPDIR``) are those of the
launcher when its fork server started: a later start with other values gets
a fork server of its own.

A program (``StartProgram``) forked from a server that preloaded its
imports runs as ``python -m`` would run it, in a session of its own, and is
killed when that server exits, which it does when the launcher does.
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
_IMPORT_TIME_PREFIXES = ('TF_', 'OMP_', 'MKL_', 'KMP_', 'OPENBLAS_', 'GOTO_',
                         'PYTHON', 'LD_', 'MALLOC_', 'GLIBC_', 'GPIPE_',
                         'LANG', 'LC_', 'TZ', 'TMPDIR')

_lock = threading.Lock()
# (import-time environment's key, preloaded modules) -> _Server.
_servers = {}
_failed = []  # Why the fork server could not start, said once.
_failed_programs = {}  # Server key -> why its server could not start.


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
  _failed_programs.clear()


def _SearchPath(value):
  """PYTHONPATH's entries in order, each once (as sys.path gets them)."""
  seen = []
  for entry in value.split(os.pathsep):
    if entry and entry not in seen:
      seen.append(entry)
  return os.pathsep.join(seen)


def ImportTimeKeyText(env):
  """The variables of `env` read at import time, as one text."""
  return json.dumps(sorted(
      (k, _SearchPath(v) if k == 'PYTHONPATH' else v)
      for k, v in env.items() if k.startswith(_IMPORT_TIME_PREFIXES)))


def InheritServer(answers_fd, requests_fd, key):
  """Makes a fork server's pipes this process's for workers (see StartProgram).

  Called by the fork server in a program it forked with a fork server of its
  own: the program's workers are then forks of that one.

  Args:
    answers_fd: the descriptor its answers come on.
    requests_fd: the descriptor to write requests to.
    key: ImportTimeKeyText of the environment the server imported with.
  """
  _servers[(key, ())] = _Server(pipes=(answers_fd, requests_fd))


class _Server:
  """One fork server: its process and its request pipe, one at a time.

  Attributes:
    proc: its subprocess.Popen; None for a server inherited from the fork
      server that forked this process (InheritServer).
    broken: why it can no longer be asked, or None.
  """

  def __init__(self, env=None, preload=(), pipes=None):
    """Starts a fork server, or wraps an inherited one's pipes.

    Args:
      env: its environment (a new server).
      preload: modules it imports besides the worker's (a new server).
      pipes: (answers, requests) descriptors of an inherited server.

    Raises:
      ForkServerError: a new server did not start.
    """
    self._lock = threading.Lock()
    self.broken = None
    if pipes:
      self.proc = None
      self._answers = os.fdopen(pipes[0], 'r')
      self._requests = os.fdopen(pipes[1], 'w')
      return
    try:
      self.proc = subprocess.Popen(
          [sys.executable, '-m', 'gpipe.runtime.fork_server'] + list(preload),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL, env=env, cwd=child_env.ROOT, text=True,
          bufsize=1, start_new_session=True)
    except OSError as e:
      raise ForkServerError('the workers\' fork server did not start: %s' %
                            e) from None
    self._answers, self._requests = self.proc.stdout, self.proc.stdin
    reply = self._Read(START_SECS)
    if not reply.get('ready'):
      self._Break()
      raise ForkServerError('the workers\' fork server did not start: %s' %
                            reply.get('error', reply))

  def Serving(self):
    """Whether it can still be asked."""
    return not self.broken and (self.proc is None or self.proc.poll() is None)

  def _Read(self, timeout):
    """Its next answer (a dict); {'error': why} if there is none."""
    if not _Readable(self._answers.fileno(), timeout):
      return {'error': 'no answer in %.0f s' % timeout, 'here': True}
    line = self._answers.readline()
    if not line:
      return {'error': 'it exited with code %s' % (
          self.proc.poll() if self.proc else 'unknown'), 'here': True}
    try:
      reply = json.loads(line)
    except ValueError:
      reply = None
    return reply if isinstance(reply, dict) else {
        'error': 'it answered %r' % line[:200], 'here': True}

  def _Break(self):
    """Ends this server (its answers can no longer be matched to requests)."""
    self.broken = self.broken or 'stopped'
    if self.proc is None:  # Inherited: it exits when its requests end.
      for f in (self._requests, self._answers):
        try:
          f.close()
        except OSError:
          pass
      return
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
        self._requests.write(json.dumps(request) + '\n')
        self._requests.flush()
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


def _ServerFor(env, preload=()):
  """The fork server for `env` and `preload`, started on first use."""
  key = (ImportTimeKeyText(env), tuple(preload))
  with _lock:
    server = _servers.get(key)
    if server is None or not server.Serving():
      if key in _failed_programs:
        raise ForkServerError(_failed_programs[key])
      try:
        server = _servers[key] = _Server(env, preload)
      except ForkServerError as e:
        if preload:  # Not tried again for every program.
          _failed_programs[key] = str(e)
        raise
    return server


class ForkedProcess:
  """A forked worker or program, with the subprocess.Popen calls it needs.

  Attributes:
    pid: its process id.
    returncode: None while it runs, then its exit code (-N: killed by
      signal N), as subprocess.Popen's; 255 when its fork server died
      before saying.
    args: its flags.
  """

  def __init__(self, argv, log_path=None, core=None, main=None,
               err_path=None, env=None, cwd=None, preload=(),
               own_server=False, netns=None):
    """Forks a worker, or a program, of the fork server.

    Args:
      argv: the worker's flags (`python -m gpipe.worker`'s), or the
        program's.
      log_path: its stdout, and stderr unless `err_path` (default:
        discarded).
      core: the CPU core to pin it to (default: not pinned).
      main: None for a worker, else the module the fork runs as
        `python -m main argv...` would.
      err_path: its stderr, if not `log_path`'s file.
      env: its environment (default: child_env.Environment()).
      cwd: its working directory (default: this process's).
      preload: modules its fork server imports before forking.
      own_server: a program gets a fork server of its own for its workers.
      netns: the network namespace (a name under /var/run/netns, or a
        path) the fork joins before it runs; default: the server's.

    Raises:
      ForkServerError: the fork server could not start or fork.
    """
    self.args = list(argv)
    self.returncode = None
    self._lock = threading.Lock()
    env = child_env.Environment() if env is None else dict(env)
    self._server = _ServerFor(env, preload)
    request = dict(
        op='start', argv=self.args,
        log=os.path.abspath(log_path) if log_path else None, core=core,
        env=env, cwd=os.path.abspath(cwd or os.getcwd()),
        launcher=os.getpid(), netns=netns)
    if main:
      request.update(main=main, server=bool(own_server),
                     err=os.path.abspath(err_path) if err_path else None)
    for path in (request['log'], request.get('err')):
      if path:  # As a Popen's: there when this returns (the fork truncates).
        with open(path, 'a'):
          pass
    reply = self._server.Ask(**request)
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


def Prestart(env=None):
  """Starts the fork server ``Start`` will use, in a background thread.

  Its imports (seconds) then overlap the caller's own work before its first
  worker (the planner describes the model meanwhile); a ``Start`` made
  before the server is ready waits for it, as it would for one it started.
  Nothing is said if it fails: the first ``Start`` tries again and says why.

  Args:
    env: the environment ``Start`` will be given (None: this process's).
  """
  if not Enabled():
    return

  def Run():
    try:
      _ServerFor(child_env.Environment(env))
    except ForkServerError:
      pass  # Start says why.

  threading.Thread(target=Run, name='fork server start', daemon=True).start()


def Start(argv, log_path=None, core=None, netns=None, env=None):
  """A ForkedProcess serving `argv` as a worker (see ForkedProcess).

  Raises:
    ForkServerError: no fork server here; Enabled() is False from now on,
      and the error says why (the caller starts a command instead).
  """
  try:
    return ForkedProcess(argv, log_path=log_path, core=core,
                         env=child_env.Environment(env), netns=netns)
  except ForkServerError as e:
    if not _failed:
      _failed.append(str(e))
      print('gpipe: %s; local workers start as commands instead' % e,
            file=sys.stderr, flush=True)
    raise


def StartProgram(main, argv, log_path, err_path=None, env=None, cwd=None,
                 preload=(), own_server=True, netns=None, core=None):
  """A ForkedProcess running `python -m main argv...` (see ForkedProcess).

  Its fork server imports `preload` (e.g. the trainer's modules) once; each
  program is then a fork of it, as a fresh interpreter would run it. With
  `own_server` the program's local workers come from a fork server of its
  own, itself a fork of that one: neither imports anything.

  Raises:
    ForkServerError: no fork server for these modules here (the caller
      starts a command instead); said again, at once, for every later start
      with the same modules and environment.
  """
  # A module preloaded and run would run as a second copy of itself.
  preload = tuple(m for m in preload if m != main)
  return ForkedProcess(argv, log_path=log_path, main=main, err_path=err_path,
                       env=env, cwd=cwd, preload=preload,
                       own_server=own_server, netns=netns, core=core)


if hasattr(os, 'register_at_fork'):
  os.register_at_fork(after_in_child=_ForgetServers)
