"""A TensorFlow worker task for pipeline stages (``python -m gpipe.worker``).

Serves one task of the job ``worker`` with all of this host's devices (its
GPUs or TPU cores; ``--cpu_devices`` virtual CPUs stand in for them on a CPU
host) until it is killed, across any number of trainer sessions: a trainer
that restarts connects to the same workers. Which task it is comes from, by
precedence:

1. ``--cluster_spec`` (``worker=host:port,...``, a JSON cluster dict or
   TF_CONFIG JSON) with ``--task=i``; the older ``--cluster`` JSON flag
   (with ``--job``) works too;
2. ``TF_CONFIG`` in the environment, TensorFlow's multi-worker convention::

     TF_CONFIG='{"cluster": {"worker": ["h1:2222", "h2:2222"]},
                 "task": {"type": "worker", "index": 1}}' \\
         python -m gpipe.worker

3. Slurm's environment under ``srun`` (every task of the step a worker,
   ports ``--slurm_port_base`` + i on each node).

It prints its address and devices, flushed, when it serves. Lingvo is
imported first so that its custom ops (e.g. ``AssertSameDim0``) are
registered in this process: a stage function that uses them would otherwise
fail with "Op type not registered". With ``--exit_with_parent`` (what
``LocalCluster`` passes) it also exits when its parent process dies, so a
crashed trainer leaves no servers behind; without it, a worker started by
ssh, nohup or a batch system keeps serving on its own.
"""

import argparse
import json
import os
import select
import sys
import threading
import time

# Read before the slow imports below: a parent that dies while they run
# must still be noticed (getppid() would already name the reaper).
_PARENT_PID = os.getppid()

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.compat import tf_internal
from gpipe.runtime import cluster_spec as cluster_spec_lib
from lingvo import compat as tf
# Lingvo's custom-op library (x_ops.so): registers its ops, all that a stage
# function needs of Lingvo in this process (py_utils would register the same
# ops and import much more: half a second of every worker's start).
from lingvo.core import ops  # pylint: disable=unused-import


def _ExitWhenOrphaned(parent_pid):
  while True:
    if os.getppid() != parent_pid:
      os._exit(0)  # pylint: disable=protected-access
    time.sleep(0.5)


def _ExitWhenGone(pid):
  """Exits when process `pid` has ended (a forked worker's launcher)."""
  try:
    watch = os.pidfd_open(pid)
  except ProcessLookupError:
    os._exit(0)  # pylint: disable=protected-access
  except (AttributeError, OSError):
    watch = None  # No pidfd here: poll.
  while watch is None:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      os._exit(0)  # pylint: disable=protected-access
    except PermissionError:
      pass
    time.sleep(0.5)
  poller = select.poll()  # Not select(): descriptors above 1023 too.
  poller.register(watch, select.POLLIN)
  poller.poll()  # Readable once the process has ended.
  os._exit(0)  # pylint: disable=protected-access


def _Parser():
  parser = argparse.ArgumentParser(
      prog='python -m gpipe.worker',
      description='Serves one worker task of a TensorFlow cluster for '
      'pipeline stages (see gpipe/runtime/worker.py).')
  parser.add_argument(
      '--cluster_spec', default='',
      help="the cluster: 'worker=host:port,host:port', a JSON cluster dict "
      'or TF_CONFIG JSON (default: $TF_CONFIG, else Slurm under srun)')
  parser.add_argument('--task', type=int, default=None,
                      help="this worker's task index in the cluster")
  parser.add_argument('--cluster', default='',
                      help='older form: JSON {"worker": ["host:port", ...]} '
                      '(with --task and --job)')
  parser.add_argument('--job', default=cluster_spec_lib.JOB,
                      help='with --cluster: the job this task belongs to')
  parser.add_argument('--intra_op_threads', type=int, default=1)
  parser.add_argument('--inter_op_threads', type=int, default=2)
  parser.add_argument('--cpu_devices', type=int, default=1,
                      help='virtual CPU devices in this worker (stand-ins '
                      "for a host's GPUs)")
  parser.add_argument('--slurm_port_base', type=int,
                      default=cluster_spec_lib.SLURM_PORT_BASE,
                      help='under srun: the port of the first task on a node')
  parser.add_argument('--exit_with_parent', action='store_true',
                      help='exit when the parent process dies (for workers '
                      'a trainer starts itself)')
  return parser


def _ServerSpec(args):
  """(jobs dict for tf.train.ClusterSpec, job, task, where it came from)."""
  if args.cluster:
    # The older flags: any job, served as given.
    try:
      jobs = json.loads(args.cluster)
    except ValueError as e:
      raise cluster_spec_lib.ClusterSpecError(
          '--cluster is not valid JSON (%s): %r' % (e, args.cluster)) from None
    tasks = jobs.get(args.job) if isinstance(jobs, dict) else None
    if args.task is None or not tasks or not 0 <= args.task < len(tasks):
      raise cluster_spec_lib.ClusterSpecError(
          '--cluster=%s --job=%s --task=%s: the job has no such task (it '
          'lists %r)' % (args.cluster, args.job, args.task, tasks))
    return jobs, args.job, args.task, '--cluster'
  description = cluster_spec_lib.Resolve(
      args.cluster_spec, args.task, port_base=args.slurm_port_base,
      require_worker=True)
  if description is None:
    raise cluster_spec_lib.ClusterSpecError(
        'no cluster given: pass --cluster_spec=worker=host:port,... and '
        '--task=i, or set TF_CONFIG, or start the workers with srun; %s' %
        cluster_spec_lib.EXAMPLE)
  # Only the worker job: a master contacts every task of its cluster, so a
  # chief or evaluator task that serves nothing would stall every session.
  return (description.Dict(), cluster_spec_lib.JOB, description.task,
          description.source)


def LocalDeviceNames(config):
  """This process's devices under `config`, short names.

  Args:
    config: the server's ConfigProto (its CPU device count).

  Returns:
    ['CPU:0', 'CPU:1', 'GPU:0', ...].
  """
  names = []
  for device in tf_internal.LocalDevices(config):
    parts = device.name.split(':')
    names.append('%s:%s' % (parts[-2], parts[-1]))
  return names


def main(argv=None, launcher_pid=None):
  """Serves the worker task the flags or the environment describe.

  Args:
    argv: the flags (default: sys.argv[1:]).
    launcher_pid: with --exit_with_parent, the process whose end it
      follows (default: its parent; a forked worker's parent is the fork
      server, so it names its launcher, gpipe.runtime.forked_workers).

  Returns:
    2 for a cluster description that cannot be used, 1 when the server
    cannot start; otherwise it serves until killed.
  """
  args = _Parser().parse_args(argv)
  try:
    jobs, job, task, source = _ServerSpec(args)
  except cluster_spec_lib.ClusterSpecError as e:
    print('gpipe.worker: error: %s' % e, file=sys.stderr, flush=True)
    return 2
  if args.exit_with_parent:
    if launcher_pid:
      watch = threading.Thread(target=_ExitWhenGone, args=(launcher_pid,),
                               daemon=True)
    else:
      watch = threading.Thread(target=_ExitWhenOrphaned, args=(_PARENT_PID,),
                               daemon=True)
    watch.start()
  config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=args.intra_op_threads,
      inter_op_parallelism_threads=args.inter_op_threads,
      device_count={'CPU': args.cpu_devices})
  address = jobs[job][task]
  try:
    server = tf.distribute.Server(
        tf.train.ClusterSpec(jobs), job_name=job, task_index=task,
        config=config, start=True)
  except (tf.errors.OpError, RuntimeError, ValueError) as e:
    print('gpipe.worker: error: could not serve %s task %d at %s (from %s): '
          '%s. Is the port in use, or is %s not an address of this host?' %
          (job, task, address, source, str(e).strip().splitlines()[0],
           address.rpartition(':')[0]), file=sys.stderr, flush=True)
    return 1
  print('gpipe worker %s:%d serving at %s (%s of %d from %s) devices: %s' %
        (job, task, server.target, address, len(jobs[job]), source,
         ', '.join(LocalDeviceNames(config))), flush=True)
  server.join()


if __name__ == '__main__':
  sys.exit(main())
