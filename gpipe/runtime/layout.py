"""R data-parallel replicas x K pipeline stages laid out on a cluster's devices.

A pure function of device strings (no TensorFlow): ``Layout`` takes the
devices in task order (task 0's devices, then task 1's, ...; a task is a
worker process, usually one per host) and gives each replica's stage
devices:

* neighbouring stages on the same task first: replica r takes the r-th run of
  D consecutive devices, so a stage hands its activations to the next one
  over the host's own link wherever the host has room (a pipeline crosses
  hosts only when it needs more devices than one host has);
* replicas across tasks: replica r+1 starts where replica r ended, so the R
  replicas fill the hosts one after another;
* within a replica the schedule's placement rule maps stages to its D
  devices: one stage per device (D = K; also for schedules that take any
  placement), a V (D = K/2; stage s on device min(s, K-1-s), as 'zb_v'),
  round-robin with fewer devices than stages (stage s on device s mod D, as
  'interleaved_1f1b') and for looped stages of any schedule.

Every device given is used: R x D must equal their number, else a
LayoutError names the counts. For 2 hosts x 4 GPUs, R=2 x K=4 puts replica 0
on host 0's GPUs and replica 1 on host 1's; R=1 x K=8 runs stages 0-3 on
host 0 and 4-7 on host 1 (one hand-over between hosts).
"""

import re

from gpipe.schedules import orders as schedule_orders
from gpipe.schedules import registry as schedule_registry

# The schedules' placement rules (gpipe.schedules.registry).
ANY = schedule_registry.ANY  # one stage per device here, unless looped
ONE_PER_DEVICE = schedule_registry.ONE_PER_DEVICE  # K = D
ROUND_ROBIN = schedule_registry.ROUND_ROBIN  # stage s on device s mod D
V_SHAPE = schedule_registry.V_SHAPE  # K = 2D, stage s on min(s, K-1-s)

_DEVICE = re.compile(r'^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?'
                     r'(?:/task:(?P<task>\d+))?/device:(?P<type>[A-Za-z_]+):'
                     r'(?P<index>\d+)$')


class LayoutError(ValueError):
  """The devices cannot hold R replicas of the pipeline; names the counts."""


def ParseDevice(name):
  """(task or None, device type, index) of a device string.

  Args:
    name: e.g. '/job:worker/replica:0/task:1/device:GPU:3' or
      '/device:CPU:0'.

  Returns:
    (1, 'GPU', 3); (None, 'CPU', 0) for a device without a task.

  Raises:
    LayoutError: not a full device string.
  """
  match = _DEVICE.match(name)
  if not match:
    raise LayoutError(
        '%r is not a device string like /job:worker/replica:0/task:0/'
        'device:GPU:0 or /device:CPU:0' % name)
  task = match.group('task')
  return (int(task) if task is not None else None, match.group('type'),
          int(match.group('index')))


def ShortName(name):
  """'task 1 GPU:3' (or 'CPU:0' without a task), for reports."""
  task, device_type, index = ParseDevice(name)
  short = '%s:%d' % (device_type, index)
  return short if task is None else 'task %d %s' % (task, short)


def Flatten(task_devices):
  """Task 0's devices, then task 1's, ... (the order Layout expects)."""
  return [d for devices in task_devices for d in devices]


def DevicesPerReplica(num_stages, placement=ONE_PER_DEVICE, num_devices=None,
                      loop=False, num_replicas=1):
  """D, the devices one replica's pipeline runs on.

  Args:
    num_stages: K.
    placement: the schedule's placement rule (ANY, ONE_PER_DEVICE,
      ROUND_ROBIN or V_SHAPE).
    num_devices: the devices available to all replicas (needed for
      round-robin placements, which use all of them).
    loop: several stages per device, round-robin (stage s on s mod D).
    num_replicas: R.

  Returns:
    K for one stage per device, K/2 for a V, and for round-robin placements
    the available devices' share of one replica.
  """
  if placement == V_SHAPE:
    return num_stages // 2
  if num_devices is not None and (
      loop or (placement == ROUND_ROBIN and
               num_devices < num_stages * num_replicas)):
    return max(1, num_devices // num_replicas)
  return num_stages


def StagePlacement(num_stages, num_devices, placement=ONE_PER_DEVICE,
                   loop=False):
  """Which of a replica's D devices each of the K stages runs on.

  Args:
    num_stages: K.
    num_devices: D, the replica's devices.
    placement: the schedule's placement rule (V_SHAPE: a V; ROUND_ROBIN with
      D < K: round-robin; otherwise one stage per device).
    loop: round-robin whatever the rule (looped stages).

  Returns:
    K device indices in 0..D-1.

  Raises:
    LayoutError: the placement does not fit K stages on D devices.
  """
  k, d = num_stages, num_devices
  if placement == V_SHAPE:
    if k % 2 or d != k // 2:
      raise LayoutError(
          'a V puts two stages per device: K=%d stages need an even K and '
          'K/2 devices, got %d device(s)' % (k, d))
    return schedule_orders.VPlacement(k)
  if placement == ROUND_ROBIN and d < k and k % d:
    raise LayoutError(
        'round-robin puts the same number of stages on each device: K=%d '
        'stages do not go evenly over %d devices; use --num_stages=%d or %d'
        % (k, d, k - k % d, k + d - k % d))
  if loop or (placement == ROUND_ROBIN and d < k):
    return schedule_orders.RoundRobinPlacement(k, d)
  if d != k:
    raise LayoutError('one stage per device: K=%d stages need %d devices, got '
                      '%d' % (k, k, d))
  return list(range(k))


def Layout(devices, num_replicas, num_stages, placement=ONE_PER_DEVICE,
           loop=False):
  """R lists of K stage devices on `devices` (see the module doc).

  Args:
    devices: every device to use, task by task (Flatten of per-task lists).
    num_replicas: R.
    num_stages: K.
    placement: the schedule's placement rule (ANY, ONE_PER_DEVICE,
      ROUND_ROBIN or V_SHAPE): decides the placement in a replica.
    loop: several stages per device, round-robin.

  Returns:
    A list of R lists of K device strings: replica r's stage devices.

  Raises:
    LayoutError: R x D differs from the number of devices, naming the counts
      and what would fit.
  """
  devices = list(devices)
  r, k, n = num_replicas, num_stages, len(devices)
  if r < 1 or k < 1:
    raise LayoutError('need R >= 1 replicas and K >= 1 stages, got R=%d, '
                      'K=%d' % (r, k))
  d = DevicesPerReplica(k, placement, n, loop, r)
  if r * d != n:
    how = ('two stages per device in a V' if placement == V_SHAPE else
           'stages round-robin' if d != k else 'one stage per device')
    raise LayoutError(
        '%d replica(s) x %d device(s) each (%d stages, %s) = %d devices, but '
        '%d device(s) are there (%s): every device is used, so R x D must '
        'equal %d%s' % (r, d, k, how, r * d, n, CountByTask(devices), n,
                        FitsNote(n, r, k, placement)))
  where = StagePlacement(k, d, placement, loop)
  return [[devices[i * d + j] for j in where] for i in range(r)]


def FitsNote(n, r, k, placement):
  """'; R=2 x K=4 or R=1 x K=8 would fit' for n devices ('' if neither)."""
  per_device = 2 if placement == V_SHAPE else 1  # stages per device
  d = max(1, k // per_device)
  fits = []
  if n % d == 0 and n // d != r:
    fits.append('R=%d x K=%d' % (n // d, k))
  if n % r == 0 and n // r * per_device != k:
    fits.append('R=%d x K=%d' % (r, n // r * per_device))
  return '; %s would fit' % ' or '.join(fits) if fits else ''


def CountByTask(devices):
  """'2 task(s) x 4 GPU', or '4 GPU on task 0, 2 GPU on task 1', for reports.

  Args:
    devices: device strings.

  Returns:
    How many devices of which type each task has, in words.
  """
  counts = {}
  for name in devices:
    task, device_type, _ = ParseDevice(name)
    key = (task, device_type)
    counts[key] = counts.get(key, 0) + 1
  values = set(counts.values())
  types = sorted({t for _, t in counts})
  if len(values) == 1 and len(types) == 1:
    tasks = len(counts)
    if list(counts)[0][0] is None:
      return '%d %s in this process' % (len(devices), types[0])
    return '%d task(s) x %d %s' % (tasks, values.pop(), types[0])
  return ', '.join('%d %s on task %s' % (c, t, 'local' if task is None else
                                          task)
                   for (task, t), c in sorted(counts.items(),
                                              key=lambda kv: str(kv[0])))


def HandOvers(stage_devices):
  """How many stage-to-stage hand-overs cross from one task to another."""
  tasks = [ParseDevice(d)[0] for d in stage_devices]
  return sum(1 for a, b in zip(tasks, tasks[1:]) if a != b)


def _Runs(stage_devices):
  """'stages 0-3 on task 0 (GPU:0, GPU:1, GPU:2, GPU:3), stage 4 on ...'."""
  runs = []  # [task, first stage, [short device names]]
  for s, name in enumerate(stage_devices):
    task, device_type, index = ParseDevice(name)
    if not runs or runs[-1][0] != task:
      runs.append([task, s, []])
    runs[-1][2].append('%s:%d' % (device_type, index))
  parts = []
  for task, first, names in runs:
    last = first + len(names) - 1
    parts.append('%s %s on %s (%s)' % (
        'stage' if first == last else 'stages',
        first if first == last else '%d-%d' % (first, last),
        'this process' if task is None else 'task %d' % task,
        ', '.join(names)))
  return ', '.join(parts)


def Describe(replica_devices):
  """Report lines for a layout: each replica's stages on tasks and devices.

  Args:
    replica_devices: R lists of K device strings (Layout's result).

  Returns:
    A list of lines, e.g.
    'layout: 1 replica(s) x 8 stages on 8 devices (2 task(s) x 4 GPU); ...',
    '  replica 0: stages 0-3 on task 0 (GPU:0, GPU:1, GPU:2, GPU:3), stages
    4-7 on task 1 (GPU:0, GPU:1, GPU:2, GPU:3); 1 hand-over(s) between
    tasks'. No lines when a stage has no full device string (a default or
    short device name).
  """
  if not replica_devices or not all(
      stages and all(_DEVICE.match(d or '') for d in stages)
      for stages in replica_devices):
    return []
  used = list(dict.fromkeys(Flatten(replica_devices)))
  lines = ['layout: %d replica(s) x %d stages on %d devices (%s); '
           'neighbouring stages on one task first, replicas across tasks' %
           (len(replica_devices), len(replica_devices[0]), len(used),
            CountByTask(used))]
  for r, stages in enumerate(replica_devices):
    lines.append('  replica %d: %s; %d hand-over(s) between tasks' %
                 (r, _Runs(stages), HandOvers(stages)))
  return lines
