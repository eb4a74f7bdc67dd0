"""Workers started the way a user starts them: detached, by a launcher.

``StartDetached`` runs a short-lived launcher process (standing in for ssh,
nohup or a batch system) that starts ``python -m gpipe.worker`` processes in
their own sessions, waits until each serves and exits: the workers are no
longer children of anything in the test, as on another host.

``StartForked`` starts the same workers as forks of the fork server of the
tests' trainers (``gpipe.runtime.forked_workers``, ``trainer_testlib.
PRELOAD``): for a test where what matters is that the workers are servers of
a cluster file that the trainer did not start, not how they were launched.
A command imports TensorFlow again (about 4 CPU-seconds each); a fork serves
in a fraction of a second.
"""

import json
import subprocess
import sys
import time

from gpipe.runtime import forked_workers
from gpipe.runtime import liveness
from tests import trainer_testlib

_LAUNCHER = r'''
import json, os, subprocess, sys, time
from gpipe.runtime import liveness
workers = json.loads(sys.argv[1])
procs = []
for w in workers:
  with open(w['log'], 'w') as log:
    procs.append(subprocess.Popen(
        w['cmd'], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=dict(os.environ, **w['env']),
        start_new_session=True))
deadline = time.time() + float(sys.argv[2])
for w, p in zip(workers, procs):
  reason = liveness.AwaitServing(w['address'], lambda: p.poll() is None,
                                 deadline)
  if reason is not None:
    for other in procs:
      other.kill()
    print(json.dumps({'failed': w['address'], 'code': p.poll(),
                      'reason': reason}))
    sys.exit(1)
print(json.dumps({'pids': [p.pid for p in procs]}))
'''


def WorkerCommand(*flags):
  """python -m gpipe.worker with `flags`."""
  return [sys.executable, '-m', 'gpipe.worker'] + list(flags)


def StartDetached(workers, timeout=120):
  """Starts workers through a launcher that exits once they serve.

  Args:
    workers: dicts with 'cmd' (a command), 'env' (extra environment),
      'address' (host:port it serves) and 'log' (its log file).
    timeout: seconds to wait for all of them to serve.

  Returns:
    The workers' process ids.

  Raises:
    RuntimeError: a worker exited or did not serve in time (its log is in
      the message).
  """
  done = subprocess.run(
      [sys.executable, '-c', _LAUNCHER, json.dumps(workers), str(timeout)],
      cwd=trainer_testlib.ROOT, env=trainer_testlib.Environment(),
      capture_output=True, text=True, timeout=timeout + 30)
  result = json.loads(done.stdout.strip().splitlines()[-1])
  if 'pids' not in result:
    failed = [w for w in workers if w['address'] == result['failed']][0]
    with open(failed['log']) as f:
      raise RuntimeError('worker %s did not serve: %s' % (result, f.read()))
  return result['pids']


def StartForked(workers, timeout=120):
  """Starts `WorkerCommand` workers as forks; returns once each serves.

  Each is a process of its own, in a session of its own, that exits with
  this process (see ``gpipe.runtime.forked_workers``); it is killed by pid
  like a detached one. Where forking is off or fails, `StartDetached`.
  Arguments, result and errors as `StartDetached`'s; each 'cmd' must be a
  `WorkerCommand`.
  """
  prefix = WorkerCommand()
  if not forked_workers.Enabled():
    return StartDetached(workers, timeout)
  procs = []
  for w in workers:
    if w['cmd'][:len(prefix)] != prefix:
      raise ValueError('not a WorkerCommand: %r' % (w['cmd'],))
    try:
      procs.append(forked_workers.ForkedProcess(
          w['cmd'][len(prefix):], log_path=w['log'],
          env=dict(trainer_testlib.Environment(), **w['env']),
          cwd=trainer_testlib.ROOT, preload=trainer_testlib.PRELOAD))
    except forked_workers.ForkServerError as e:
      print('cluster_testlib: %s; workers start detached' % e,
            file=sys.stderr)
      for proc in procs:
        proc.kill()
      return StartDetached(workers, timeout)
  deadline = time.time() + timeout
  for w, proc in zip(workers, procs):
    reason = liveness.AwaitServing(
        w['address'], lambda p=proc: p.poll() is None, deadline)
    if reason is not None:
      for other in procs:
        other.kill()
      with open(w['log']) as f:
        raise RuntimeError('worker %s did not serve (%s, exit code %s): %s'
                           % (w['address'], reason, proc.poll(), f.read()))
  return [proc.pid for proc in procs]
