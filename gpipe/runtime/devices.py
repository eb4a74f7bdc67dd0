"""Asking a cluster of gpipe workers for their devices, within seconds.

``Discover`` checks each worker task in turn and returns its devices:

1. ``liveness.Probe`` within the timeout: an address where nothing
   listens, that cannot be reached, or where something other than a
   TensorFlow server listens is named at once instead of a session that
   waits for it forever;
2. a session to that address alone, with device filters that match no other
   task, lists the server's own devices: they name the job and task it
   serves, so a server of another job or task index is named too;
3. a session to worker 0, which masters the training sessions, lists the
   whole cluster's devices: every task must be there, as described.

``ChooseDeviceType`` picks the devices stages run on (``auto``: the
accelerator every task has, else CPU) and ``SelectDevices`` takes them from
each task (the first N with ``devices_per_task``). ``PlannedDevices`` gives
the device strings of a cluster that is not running, for planning.
"""

import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import layout
from gpipe.runtime import liveness
from lingvo import compat as tf

DEVICE_TYPES = ('auto', 'cpu', 'gpu', 'tpu')
# Accelerators in the order 'auto' prefers them when every task has both.
# What --device_type=auto looks for: GPUs. Not TPU cores: a stage runs on one
# only inside a compiled TPU computation, which is not built (TpuNotBuilt).
ACCELERATORS = ('GPU',)
# Matches no task: a server asked with it lists only its own devices.
_NO_REMOTE_TASK = '/job:gpipe_no_such_job'


class DiscoveryError(RuntimeError):
  """A worker task cannot be used; the message names its address."""


class TpuNotBuiltError(ValueError):
  """--device_type=tpu: what was found, and that TPU stages are not built."""


# Why every --device_type=tpu run stops, whatever it found (docs/TPU.md).
_TPU_NOT_BUILT = (
    'running stages on TPU cores is not built yet: the library neither '
    'initializes a TPU system (tpu.initialize_system) nor compiles the '
    'training step into a TPU computation (tpu.rewrite or tpu.replicate over '
    'the cores of a slice), the way a graph program runs on TPU cores; '
    'docs/TPU.md says what that takes. What runs today: --device_type=gpu '
    'on hosts with GPUs, or --device_type=cpu (--device_type=auto picks '
    'GPUs, else CPUs), in this process, on local --worker_processes or on a '
    'cluster (--cluster_spec or TF_CONFIG). gpipe.runtime.tpu_layout lays '
    'out stages on the cores of a slice for planning')


def TpuNotBuilt(found, has_tpus=False):
  """The error of a --device_type=tpu run, saying what it found.

  Args:
    found: what the run found, in words (no TPU device at ..., N TPU
      cores on ...).
    has_tpus: TPU cores were found (the run would still not use them).

  Returns:
    A TpuNotBuiltError to raise.
  """
  return TpuNotBuiltError('--device_type=tpu: %s%s%s' % (
      found, ', but ' if has_tpus else '; and even with TPU cores, ',
      _TPU_NOT_BUILT))


def TpuFound(task_devices, description=None):
  """What a cluster's tasks list of TPU devices, in words, for TpuNotBuilt.

  Args:
    task_devices: each task's device strings (Discover's result).
    description: the cluster_spec.ClusterDescription they come from (names
      the tasks' addresses), or None.

  Returns:
    (words, whether every task lists a TPU device).
  """
  missing = [t for t, names in enumerate(task_devices)
             if 'TPU' not in _Types(names)]
  if not missing:
    tpus = [n for names in task_devices for n in names
            if layout.ParseDevice(n)[1] == 'TPU']
    return ('the cluster lists %d TPU core(s) (%s)' %
            (len(tpus), layout.CountByTask(tpus))), True
  first = missing[0]
  where = ('worker task %d' % first if description is None else
           description.Name(first))
  return ('no TPU system found: worker task(s) %s%s list no TPU device (%s '
          'lists %s)' % (
              missing, '' if description is None else
              ' of %s' % description.source, where,
              ', '.join('%s:%d' % layout.ParseDevice(n)[1:]
                        for n in task_devices[first]) or 'no devices')), False


def _ListDevices(target, timeout_secs, device_filters=()):
  """The device names a session to `target` lists (OpError on failure)."""
  config = tf.compat.v1.ConfigProto(
      operation_timeout_in_ms=int(timeout_secs * 1000),
      device_filters=list(device_filters))
  with tf.compat.v1.Session(target, graph=tf.Graph(), config=config) as sess:
    return [d.name for d in sess.list_devices()]


def _StartHint(description, task):
  return ('start it with: python -m gpipe.worker --cluster_spec=%s --task=%d '
          '(or TF_CONFIG with "task": {"type": "worker", "index": %d})' %
          (description.Spec(), task, task))


def _OwnDevices(description, task, timeout_secs):
  """The devices of the server at task `task`'s address; checks who it is."""
  address = description.workers[task]
  where = '%s from %s' % (description.Name(task), description.source)
  reason = liveness.Probe(address, timeout_secs)
  if reason:
    raise DiscoveryError('%s does not answer (%s). Is the worker running and '
                         'the address right? If not, %s' %
                         (where, reason, _StartHint(description, task)))
  try:
    names = _ListDevices(description.Target(task), timeout_secs,
                         [_NO_REMOTE_TASK])
  except tf.errors.OpError as e:
    raise DiscoveryError(
        '%s answers as a TensorFlow server but did not list its devices '
        'within %.0f s (%s: %s): if it is stuck, stop it and %s' %
        (where, timeout_secs, type(e).__name__,
         e.message.strip().splitlines()[0][:200],
         _StartHint(description, task))) from None
  own = '/job:%s/replica:0/task:%d/' % (cluster_spec_lib.JOB, task)
  if not names or not all(n.startswith(own) for n in names):
    served = sorted({n.rsplit('/device:', 1)[0] for n in names})
    raise DiscoveryError(
        'the server at %s is not %s: it serves %s; %s' %
        (address, where, ', '.join(served) or 'no devices',
         _StartHint(description, task)))
  return names


def Discover(description, timeout_secs=10.0):
  """Every worker task's devices, checked (see the module doc).

  Args:
    description: a cluster_spec.ClusterDescription.
    timeout_secs: the longest each check may take.

  Returns:
    A list with each task's device strings, in task order (all types).

  Raises:
    DiscoveryError: a task is unreachable, not a TensorFlow server, serves
      another job or task, or worker 0's cluster differs from the
      description; the message names the task and its address.
  """
  task_devices = [_OwnDevices(description, t, timeout_secs)
                  for t in range(description.num_tasks)]
  start = time.time()
  try:
    names = _ListDevices(description.Target(0), timeout_secs)
  except tf.errors.OpError as e:
    raise DiscoveryError(
        '%s could not list the devices of every task within %.0f s (%s), '
        'although each task answers on its own: it was probably started '
        'with another cluster description than %s (%s). Start every worker '
        'with the same one' %
        (description.Name(0), time.time() - start, type(e).__name__,
         description.source, description.Spec())) from None
  tasks = sorted({layout.ParseDevice(n)[0] for n in names
                  if n.startswith('/job:%s/' % cluster_spec_lib.JOB)})
  if tasks != list(range(description.num_tasks)):
    raise DiscoveryError(
        '%s serves a cluster with worker tasks %s, but %s lists %d (%s): '
        'start every worker with the same cluster description' %
        (description.Name(0), tasks, description.source,
         description.num_tasks, description.Spec()))
  return task_devices


def _Types(names):
  return {layout.ParseDevice(n)[1] for n in names}


def ChooseDeviceType(task_devices, device_type='auto'):
  """The device type stages run on: 'CPU', 'GPU' or 'TPU'.

  Args:
    task_devices: each task's device strings.
    device_type: 'auto' (the accelerator every task has, else CPU), 'cpu',
      'gpu' or 'tpu'.

  Returns:
    The upper-case device type.

  Raises:
    DiscoveryError: a task has no device of the type asked for (named).
  """
  if device_type not in DEVICE_TYPES:
    raise ValueError('--device_type=%s: use one of %s' %
                     (device_type, ', '.join(DEVICE_TYPES)))
  if device_type == 'auto':
    for accelerator in ACCELERATORS:
      if task_devices and all(accelerator in _Types(names)
                              for names in task_devices):
        return accelerator
    return 'CPU'
  wanted = device_type.upper()
  missing = [t for t, names in enumerate(task_devices)
             if wanted not in _Types(names)]
  if missing:
    raise DiscoveryError(
        '--device_type=%s: worker task(s) %s have no %s device (task %d has '
        '%s); use --device_type=auto or start those workers on hosts with '
        '%ss' % (device_type, missing, wanted, missing[0],
                 ', '.join(layout.ShortName(n)
                           for n in task_devices[missing[0]]), wanted))
  return wanted


def SelectDevices(task_devices, device_type, devices_per_task=0):
  """Each task's devices of `device_type`, in index order.

  Args:
    task_devices: each task's device strings (any types).
    device_type: 'CPU', 'GPU' or 'TPU'.
    devices_per_task: use only the first N of each task (0: all).

  Returns:
    A list with each task's chosen device strings.

  Raises:
    DiscoveryError: a task has fewer than devices_per_task such devices.
  """
  chosen = []
  for t, names in enumerate(task_devices):
    of_type = sorted((n for n in names
                      if layout.ParseDevice(n)[1] == device_type),
                     key=lambda n: layout.ParseDevice(n)[2])
    if devices_per_task:
      if len(of_type) < devices_per_task:
        raise DiscoveryError(
            '--devices_per_task=%d: worker task %d has only %d %s device(s)'
            % (devices_per_task, t, len(of_type), device_type))
      of_type = of_type[:devices_per_task]
    chosen.append(of_type)
  return chosen


def PlannedDevices(num_tasks, device_type, devices_per_task):
  """The device strings of a cluster that is not running (for planning).

  Args:
    num_tasks: worker tasks.
    device_type: 'auto', 'cpu', 'gpu' or 'tpu' ('auto' plans CPUs).
    devices_per_task: devices of that type on each task.

  Returns:
    A list with each task's device strings.
  """
  kind = 'CPU' if device_type == 'auto' else device_type.upper()
  return [[cluster_spec_lib.DeviceName(t, kind, i)
           for i in range(devices_per_task)] for t in range(num_tasks)]
