"""Workers started the way a user starts them: detached, by a launcher.

``StartDetached`` runs a short-lived launcher process (standing in for ssh,
nohup or a batch system) that starts ``python -m gpipe.worker`` processes in
their own sessions, waits until each serves and exits: the workers are no
longer children of anything in the test, as on another host.
"""

import json
import subprocess
import sys

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
  while True:
    reason = liveness.Probe(w['address'], 5.0)
    if reason is None:
      break
    if p.poll() is not None or time.time() > deadline:
      for other in procs:
        other.kill()
      print(json.dumps({'failed': w['address'], 'code': p.poll(),
                        'reason': reason}))
      sys.exit(1)
    time.sleep(0.1)
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

