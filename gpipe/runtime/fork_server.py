"""The workers' fork server (``python -m gpipe.runtime.fork_server``).

Started by ``gpipe.runtime.forked_workers`` in a session of its own. It
imports TensorFlow, Lingvo's custom ops and the worker binary once, says so
on stdout, then answers one JSON request per line on stdin:

* ``{"op": "start", "argv": [...], "log": path or null, "core": int or null,
  "env": {...}, "cwd": path, "launcher": pid}``: forks a worker,
  ``{"pid": N}``;
* ``{"op": "poll", "pid": N}``: ``{"code": null}`` while it runs, else its
  exit code (-N: killed by signal N). A worker is reaped only here, so its
  process id stays its own until its launcher has read how it ended.

A request it cannot serve (a failed fork) gets ``{"error": why}``. Its
environment (TensorFlow's log level among it) is the launcher's
(``gpipe.runtime.child_env``).

It exits when its stdin closes (its launcher has exited). A forked worker
detaches (``setsid``), takes the launcher's environment and working
directory of the moment, its core and its log file, and serves ``gpipe.runtime.worker.main`` until it is
killed or its launcher exits.
"""

import json
import os
import sys
import traceback


def _Reply(out, **message):
  out.write(json.dumps(message) + '\n')
  out.flush()


def _Worker(request, replies):
  """In the forked child: becomes the worker; never returns."""
  code = 1
  try:
    os.close(replies.fileno())  # The server's reply pipe.
    os.setsid()
    os.chdir(request.get('cwd') or '/')
    log = request.get('log') or os.devnull
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # Also closes the server's request pipe here.
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    os.environ.clear()
    os.environ.update(request.get('env') or {})
    if request.get('core') is not None:
      os.sched_setaffinity(0, {int(request['core'])})
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
        pid = os.fork()
        if pid == 0:
          _Worker(request, replies)
        _Reply(replies, pid=pid)
      elif request['op'] == 'poll':
        # Asked once, when the worker has ended (its launcher keeps the
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


def main():
  # Nothing else may write to the reply pipe: descriptor 1 (C++ code's
  # output too) and sys.stdout go to stderr from here on.
  replies = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  try:
    # pylint: disable=g-import-not-at-top,unused-import
    from gpipe.runtime import worker
  except BaseException as e:  # pylint: disable=broad-except
    _Reply(replies, error='%s: %s' % (type(e).__name__, e))
    return 1
  _Reply(replies, ready=True)
  Serve(sys.stdin, replies)
  return 0


if __name__ == '__main__':
  sys.exit(main())
