"""A TensorFlow worker process for pipeline stages (``python -m gpipe.worker``).

Starts one ``tf.distribute.Server`` task of a cluster and serves until killed.
Lingvo is imported first so that its custom ops (e.g. ``AssertSameDim0``) are
registered in this process: a stage function that uses them would otherwise
fail with "Op type not registered". The parent watches the process; the worker
also exits by itself when its parent dies (it polls the parent pid), so a
crashed trainer never leaves servers behind.
"""

import argparse
import json
import os
import sys
import threading
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import py_utils  # pylint: disable=unused-import  # registers ops


def _ExitWhenOrphaned(parent_pid):
  while True:
    if os.getppid() != parent_pid:
      os._exit(0)  # pylint: disable=protected-access
    time.sleep(0.5)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--cluster', required=True,
                      help='JSON {"worker": ["host:port", ...]}')
  parser.add_argument('--job', default='worker')
  parser.add_argument('--task', type=int, required=True)
  parser.add_argument('--intra_op_threads', type=int, default=1)
  parser.add_argument('--inter_op_threads', type=int, default=2)
  parser.add_argument('--cpu_devices', type=int, default=1,
                      help='virtual CPU devices in this worker')
  args = parser.parse_args(argv)
  threading.Thread(
      target=_ExitWhenOrphaned, args=(os.getppid(),), daemon=True).start()
  config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=args.intra_op_threads,
      inter_op_parallelism_threads=args.inter_op_threads,
      device_count={'CPU': args.cpu_devices})
  server = tf.distribute.Server(
      tf.train.ClusterSpec(json.loads(args.cluster)),
      job_name=args.job,
      task_index=args.task,
      config=config,
      start=True)
  print('gpipe worker %s:%d serving at %s' % (args.job, args.task,
                                              server.target), flush=True)
  server.join()


if __name__ == '__main__':
  sys.exit(main())
