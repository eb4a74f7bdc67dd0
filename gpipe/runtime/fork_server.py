"""The fork server (``python -m gpipe.runtime.fork_server [MODULE ...]``).

Started by ``gpipe.runtime.forked_workers`` in a session of its own. It
imports TensorFlow, Lingvo's custom ops and the worker binary once (and the
modules named on its command line, e.g. the trainer's), says so on stdout,
then answers one JSON request per line on stdin:

* ``{"op": "start", "argv": [...], "log": path or null, "core": int or null,
  "env": {...}, "cwd": path, "launcher": pid, "netns": name or null}``:
  forks a worker (in that network namespace, if named), ``{"pid": N}``.
  With ``"main": "MODULE"`` the fork runs that module as ``python -m
  MODULE argv...`` would (a program, e.g. the trainer) instead of a worker,
  ``"err"`` its stderr if not ``log``; with ``"server": true`` the program
  also gets a fork server of its own, forked from this one (its local
  workers then start without importing anything either);
* ``{"op": "poll", "pid": N}``: ``{"code": null}`` while it runs, else its
  exit code (-N: killed by signal N). A fork is reaped only here, so its
  process id stays its own until its launcher has read how it ended.

A request it cannot serve (a failed fork) gets ``{"error": why}``. Its
environment (TensorFlow's log level among it) is the launcher's
(``gpipe.runtime.child_env``).

It exits when its stdin closes (its launcher has exited). A fork detaches
(``setsid``), takes the launcher's environment and working directory of the
moment, its core and its log file; a worker serves
``gpipe.runtime.worker.main`` until it is killed or its launcher exits, a
program runs to its end and exits as the interpreter would (non-daemon
threads joined, exit functions run, its exit code; a KeyboardInterrupt
ends it by SIGINT), or is killed when its server exits (its launcher
has). A fork's set-up failing (a namespace or directory gone) is in its
log.
"""

import importlib
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import traceback
import types

from gpipe.runtime import netns


def _Reply(out, **message):
  out.write(json.dumps(message) + '\n')
  out.flush()


def _StandardStreams():
  """sys.stdout and sys.stderr of a fresh interpreter, on descriptors 1, 2.

  The server's own start-up streams (sys.__stdout__, sys.__stderr__): made
  for the same PYTHON* variables as the program's (forked_workers starts a
  server per import-time environment), not written to by the server, and
  the ones logging handlers made at import hold.
  """
  sys.stdout = sys.__stdout__
  sys.stderr = sys.__stderr__


def _DieWithParent(parent):
  """SIGKILL this process when `parent` (the forking server) exits.

  The server exits when its launcher does (its request pipe closes), so a
  program ends with whoever started it, as a child in its process group
  would on a supervisor's kill.
  """
  import ctypes  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
  if os.getppid() != parent:  # It exited before the line above.
    os._exit(1)  # pylint: disable=protected-access


def _Detach(request, requests, replies):
  """In a fork: its own session, descriptors, directory and environment.

  Its output files come first: a failure after them (a namespace or a
  directory gone) is in its log, not lost in the server's stderr.
  """
  os.close(replies.fileno())  # The server's pipes.
  if requests.fileno() != 0:
    os.close(requests.fileno())
  os.setsid()
  log = request.get('log') or os.devnull
  out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  err = out
  if request.get('err') and request['err'] != log:
    err = os.open(request['err'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                  0o644)
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)  # Also closes a request pipe on descriptor 0.
  os.dup2(out, 1)
  os.dup2(err, 2)
  for fd in {out, err, null}:
    os.close(fd)
  if request.get('netns'):
    netns.Join(request['netns'])
  os.chdir(request.get('cwd') or '/')
  os.environ.clear()
  os.environ.update(request.get('env') or {})
  if request.get('core') is not None:
    os.sched_setaffinity(0, {int(request['core'])})


def _ExitStatus(e):
  """The exit code of SystemExit `e`, printing a message code as Python."""
  if e.code is None:
    return 0
  if isinstance(e.code, int):
    return e.code
  print(e.code, file=sys.stderr)
  return 1


def _Worker(request, requests, replies):
  """In the forked child: becomes the worker; never returns."""
  code = 1
  try:
    _Detach(request, requests, replies)
    try:
      with open('/proc/self/comm', 'w') as f:
        f.write('gpipe-worker')
    except OSError:
      pass
    from gpipe.runtime import worker  # pylint: disable=g-import-not-at-top
    code = worker.main(request['argv'],
                       launcher_pid=request.get('launcher')) or 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def _Program(request, requests, replies, own_server, server):
  """In the forked child: runs `python -m main argv...`; never returns.

  Args:
    request: the start request.
    requests: the server's request pipe (closed here).
    replies: the server's reply pipe (closed here).
    own_server: None, or the descriptors (answers, requests) of the fork
      server forked for this program's workers.
    server: the forking server's pid (the program dies with it).
  """
  code = 1
  interrupted = False
  try:
    _DieWithParent(server)
    _Detach(request, requests, replies)
    try:
      with open('/proc/self/comm', 'w') as f:
        f.write(request['main'].split('.')[-1][:15])
    except OSError:
      pass
    if own_server:
      from gpipe.runtime import forked_workers  # pylint: disable=g-import-not-at-top
      forked_workers.InheritServer(own_server[0], own_server[1], _KEY)
    _StandardStreams()
    numpy = sys.modules.get('numpy')
    if numpy is not None:  # A fresh interpreter's state differs each time.
      numpy.random.seed()
    tempfile.tempdir = None  # Found again from this environment's TMPDIR.
    sys.path[0] = os.getcwd()  # As `python -m` puts it.
    sys.argv = [request['main']] + list(request.get('argv') or [])
    try:
      run_globals = runpy.run_module(request['main'], run_name='__main__',
                                     alter_sys=True)
      code = 0
      # What exit functions and threads see from here, as in a fresh
      # interpreter: the program's module as __main__, its file as argv[0].
      main_module = types.ModuleType('__main__')
      main_module.__dict__.update(run_globals)
      sys.modules['__main__'] = main_module
      sys.argv[0] = run_globals.get('__file__') or sys.argv[0]
    except SystemExit as e:
      code = _ExitStatus(e)
    except KeyboardInterrupt:
      sys.excepthook(*sys.exc_info())
      interrupted = True
    except BaseException:  # pylint: disable=broad-except
      sys.excepthook(*sys.exc_info())
    # As the interpreter's exit: non-daemon threads, then exit functions
    # (also when the first is interrupted).
    try:
      threading._shutdown()  # pylint: disable=protected-access
    except KeyboardInterrupt:
      interrupted = True
    except BaseException:  # pylint: disable=broad-except
      sys.excepthook(*sys.exc_info())
    import atexit  # pylint: disable=g-import-not-at-top
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
    if interrupted:
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)  # pylint: disable=protected-access


def _ForkSubServer(requests, replies, namespace=None):
  """Forks a detached fork server for a program to be forked next.

  Returns:
    The program's ends of its pipes (answers, requests): the caller closes
    them after forking the program.
  """
  requests_r, requests_w = os.pipe()
  answers_r, answers_w = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      if os.fork() == 0:  # Detached: nobody has to reap it.
        os.close(replies.fileno())
        if requests.fileno() != 0:
          os.close(requests.fileno())
        os.close(requests_w)
        os.close(answers_r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # The parent server's requests.
        os.close(null)
        if namespace:  # Its workers serve where the program connects.
          netns.Join(namespace)
        Serve(os.fdopen(requests_r, 'r'), os.fdopen(answers_w, 'w'))
    finally:
      os._exit(0)  # pylint: disable=protected-access
  os.waitpid(pid, 0)
  os.close(requests_r)
  os.close(answers_w)
  return answers_r, requests_w


def _ExitCode(status):
  if os.WIFSIGNALED(status):
    return -os.WTERMSIG(status)
  return os.WEXITSTATUS(status)


def Serve(requests, replies):
  """Answers requests until `requests` ends."""
  for line in iter(requests.readline, ''):
    try:
      request = json.loads(line)
      if request['op'] == 'start':
        own_server = None
        if request.get('main') and request.get('server'):
          own_server = _ForkSubServer(requests, replies,
                                      request.get('netns'))
        try:
          server = os.getpid()
          pid = os.fork()
          if pid == 0:
            if request.get('main'):
              _Program(request, requests, replies, own_server, server)
            _Worker(request, requests, replies)
        finally:
          for fd in own_server or ():
            os.close(fd)
        _Reply(replies, pid=pid)
      elif request['op'] == 'poll':
        # Asked once, when the fork has ended (its launcher keeps the
        # code): reaped only now, so its pid was not reused before.
        try:
          done, status = os.waitpid(int(request['pid']), os.WNOHANG)
        except ChildProcessError:
          done, status = 1, 255 << 8  # Not ours, or reaped before.
        _Reply(replies, code=_ExitCode(status) if done else None)
      else:
        _Reply(replies, error='unknown op %r' % request['op'])
    except (OSError, ValueError, KeyError, TypeError) as e:
      _Reply(replies, error='%s: %s' % (type(e).__name__, e))


# The key of the environment this server imported with (forked_workers
# compares it with a program's before its workers use the inherited server).
_KEY = ''


def main(argv=None):
  global _KEY
  # Nothing else may write to the reply pipe: descriptor 1 (C++ code's
  # output too) and sys.stdout go to stderr from here on.
  replies = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  try:
    # pylint: disable=g-import-not-at-top,unused-import
    from gpipe.runtime import forked_workers
    from gpipe.runtime import worker
    for name in (sys.argv[1:] if argv is None else argv):
      importlib.import_module(name)
    _KEY = forked_workers.ImportTimeKeyText(os.environ)
  except BaseException as e:  # pylint: disable=broad-except
    _Reply(replies, error='%s: %s' % (type(e).__name__, e))
    return 1
  _Reply(replies, ready=True)
  Serve(sys.stdin, replies)
  return 0


if __name__ == '__main__':
  sys.exit(main())
