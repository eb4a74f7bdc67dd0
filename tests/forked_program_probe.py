"""A program for tests/forked_workers_test.py to fork (``python -m`` it).

``python -m tests.forked_program_probe OUT_DIR CODE [ACTION ...]`` writes
what it sees to OUT_DIR/seen.json (argv, working directory, the variable
PROBE_VALUE, a numpy random number), writes "out" to stdout and "err" to
stderr, and exits with CODE after its actions:

* ``thread``: starts a non-daemon thread that writes OUT_DIR/thread after
  half a second (the interpreter waits for it before exiting);
* ``atexit``: registers an exit function that writes OUT_DIR/atexit;
* ``interrupt``: raises KeyboardInterrupt;
* ``cluster``: starts a LocalCluster of 2 workers and records each worker's
  parent process, its command line and its network namespace, and this
  process's parent and namespace;
* ``sleep``: sleeps for ten minutes (until killed);
* ``late_stderr``: writes "late" to stderr without flushing it and kills
  itself (SIGKILL): only a line-buffered stderr has written it.
"""

import atexit
import json
import os
import signal
import sys
import threading
import time

import numpy as np
from tests import procfs


def _Write(path, text):
  with open(path, 'w') as f:
    f.write(text)


def main(argv):
  out_dir, code, actions = argv[1], int(argv[2]), argv[3:]
  seen = {'argv': argv[1:], 'cwd': os.getcwd(),
          'value': os.environ.get('PROBE_VALUE'),
          'random': float(np.random.uniform()),
          'parent': procfs.Parent(os.getpid())}
  print('out', flush=True)
  print('err', file=sys.stderr, flush=True)
  if 'thread' in actions:
    threading.Thread(target=lambda: (time.sleep(0.5), _Write(
        os.path.join(out_dir, 'thread'), 'done'))).start()
  if 'atexit' in actions:
    atexit.register(_Write, os.path.join(out_dir, 'atexit'), 'done')
  if 'cluster' in actions:
    from gpipe.runtime import local_cluster  # pylint: disable=g-import-not-at-top
    seen['netns'] = os.readlink('/proc/self/ns/net')
    with local_cluster.LocalCluster(2) as cluster:
      parents = [procfs.Parent(pid) for pid in cluster.pids]
      seen['worker_parents'] = parents
      seen['worker_parent_commands'] = [procfs.CommandLine(p)
                                        for p in parents]
      seen['worker_netns'] = [os.readlink('/proc/%d/ns/net' % pid)
                              for pid in cluster.pids]
  _Write(os.path.join(out_dir, 'seen.json'), json.dumps(seen))
  if 'sleep' in actions:
    time.sleep(600)
  if 'late_stderr' in actions:
    sys.stderr.write('late\n')
    os.kill(os.getpid(), signal.SIGKILL)
  if 'interrupt' in actions:
    raise KeyboardInterrupt()
  return code


if __name__ == '__main__':
  sys.exit(main(sys.argv))
