"""R replicas x K stages laid out on the cores of one TPU slice (pure Python).

Only the layout is here: nothing in the library runs a stage on a TPU core
yet (docs/TPU.md says what that takes). This module answers the question a
TPU runner asks first: which core of the slice runs stage k of replica r.

The model of a slice is TensorFlow's own (``tf.tpu.experimental.Topology``):

* a mesh of chips at integer coordinates (x, y, z), each linked by ICI to
  the chips one step away along one axis (a mesh; the wrap-around links of
  a torus are not counted, so a distance here is an upper bound there);
* ``cores_per_chip`` TPU cores on each chip (the fourth coordinate);
* hosts (TensorFlow tasks), each with its TPU devices by ordinal, and each
  device's (x, y, z, core): ``device_coordinates[task][ordinal]``.

That is what ``tpu.initialize_system()`` returns on a real slice (a
serialized TopologyProto), so a real slice's layout comes from its own
topology (``Slice.FromTopology``); ``Grid`` and ``NAMED`` build slices of the
same shape for planning and tests, with an assumed device order (ordinals
chip by chip within a host, x fastest).

``Layout`` puts replica r on the r-th run of D cores along one path through
the slice, and the replica's K stages on those D cores by the schedule's
placement rule (gpipe.runtime.layout.StagePlacement: one stage per core, a V,
or round-robin for looped and interleaved schedules). The path

* takes the hosts one after another, so a replica stays on one host when it
  has room (each host feeds only its own cores: a replica on one host is fed
  by one host) and replicas spread across hosts;
* within a host, walks its chips as a snake (boustrophedon), both cores of a
  chip before the next chip, so neighbouring stages are on one chip or one
  ICI hop apart;
* enters each host at the chip nearest to where the previous host's walk
  ended, so a pipeline that spans hosts crosses between neighbouring chips.

``Layout`` refuses shapes that do not fit: R x D must equal the slice's
cores (as gpipe.runtime.layout does for a cluster's devices), and the
message names the counts and the shapes that would fit.
"""

import collections
import itertools

from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import layout

# TensorFlow's job for the TPU hosts of a slice (device strings like
# '/job:worker/replica:0/task:0/device:TPU:3').
JOB = cluster_spec_lib.JOB


class SliceError(ValueError):
  """A slice description that is not a TPU slice this model handles."""


class Slice(
    collections.namedtuple('Slice', ['name', 'mesh_shape',
                                     'device_coordinates'])):
  """A TPU slice: its mesh and where each host's devices sit in it.

  Attributes:
    name: for reports, e.g. 'v3-8' or '2x2x4 chips x 1 core'.
    mesh_shape: (x, y, z, cores_per_chip), as Topology.mesh_shape.
    device_coordinates: per task (host), per TPU device ordinal, its
      (x, y, z, core): Topology.device_coordinates as nested tuples.
  """

  __slots__ = ()

  @property
  def num_tasks(self):
    return len(self.device_coordinates)

  @property
  def cores_per_task(self):
    return len(self.device_coordinates[0]) if self.device_coordinates else 0

  @property
  def num_cores(self):
    return sum(len(devices) for devices in self.device_coordinates)

  @property
  def cores_per_chip(self):
    return self.mesh_shape[3]

  @classmethod
  def FromTopology(cls, topology, name=None):
    """The Slice of a tf.tpu.experimental.Topology (or anything like one).

    Args:
      topology: has .mesh_shape (4 ints) and .device_coordinates
        ([tasks, devices, 4] ints), e.g. the Topology built from what
        tpu.initialize_system() returns.
      name: for reports (default: the mesh shape in words).

    Returns:
      A checked Slice.
    """
    mesh = tuple(int(v) for v in topology.mesh_shape)
    coords = tuple(tuple(tuple(int(v) for v in core) for core in task)
                   for task in topology.device_coordinates)
    return Check(cls(name or _MeshName(mesh), mesh, coords))


def _MeshName(mesh):
  x, y, z, cores = mesh
  return '%dx%dx%d chips x %d core(s)' % (x, y, z, cores)


def _Box(shape):
  """Every coordinate of a box of `shape`, x fastest."""
  return [tuple(reversed(c)) for c in itertools.product(
      *[range(n) for n in reversed(shape)])]


def Grid(chips, cores_per_chip, chips_per_host, name=None):
  """A slice of `chips` (x, y, z) whose hosts each hold a block of chips.

  Hosts are numbered over the grid of blocks, x fastest; a host's device
  ordinals go chip by chip (x fastest), the cores of a chip consecutive.
  That order is this function's assumption: a real slice's comes from its
  topology (Slice.FromTopology).

  Args:
    chips: (x, y, z) chips of the slice.
    cores_per_chip: TPU devices TensorFlow lists per chip.
    chips_per_host: (x, y, z) chips of each host's block; must divide
      `chips` along every axis.
    name: for reports (default: the shape in words).

  Returns:
    A Slice.

  Raises:
    SliceError: a block that does not tile the slice, or a non-positive
      size.
  """
  chips, block = tuple(chips), tuple(chips_per_host)
  if (len(chips) != 3 or len(block) != 3 or min(chips + block) < 1 or
      cores_per_chip < 1):
    raise SliceError(
        'a slice is (x, y, z) chips of >= 1 each with >= 1 core(s) per chip '
        'and (x, y, z) chips per host: got chips=%s, cores_per_chip=%s, '
        'chips_per_host=%s' % (chips, cores_per_chip, block))
  if any(c % b for c, b in zip(chips, block)):
    raise SliceError(
        'hosts of %s chips do not tile a slice of %s chips: every axis of the '
        'slice must be a multiple of the host block' %
        ('x'.join(map(str, block)), 'x'.join(map(str, chips))))
  hosts = [c // b for c, b in zip(chips, block)]
  coordinates = []
  for origin in _Box(hosts):
    task = []
    for offset in _Box(block):
      chip = [o * b + f for o, b, f in zip(origin, block, offset)]
      task.extend(tuple(chip) + (core,) for core in range(cores_per_chip))
    coordinates.append(tuple(task))
  mesh = chips + (cores_per_chip,)
  return Check(Slice(name or _MeshName(mesh), mesh, tuple(coordinates)))


# Slices by their accelerator type, in this model. Chips, TPU devices per chip
# (as TensorFlow lists them: v2/v3 chips show 2 cores; a v4 chip shows 1, its
# two TensorCores run as one "megacore") and chips per host (4). The device
# order within a host is Grid's assumption; on a real slice use the topology
# tpu.initialize_system() returns.
NAMED = {
    'v2-8': ((2, 2, 1), 2, (2, 2, 1)),
    'v3-8': ((2, 2, 1), 2, (2, 2, 1)),
    'v3-32': ((4, 4, 1), 2, (2, 2, 1)),
    'v4-8': ((2, 2, 1), 1, (2, 2, 1)),
    'v4-32': ((2, 2, 4), 1, (2, 2, 1)),
}


def Named(name):
  """The Slice of an accelerator type in NAMED, e.g. 'v3-8'.

  Raises:
    SliceError: an unknown name (the known ones are listed).
  """
  if name not in NAMED:
    raise SliceError(
        'unknown TPU slice %r: this model knows %s; describe another with '
        'tpu_layout.Grid(chips, cores_per_chip, chips_per_host) or use the '
        "slice's own topology (Slice.FromTopology)" %
        (name, ', '.join(sorted(NAMED))))
  chips, cores, block = NAMED[name]
  return Grid(chips, cores, block, name=name)


def Check(tpu_slice):
  """`tpu_slice` if it is a slice this model handles, else SliceError.

  Every device sits inside the mesh at a coordinate of its own, every
  coordinate of the mesh has a device, every host has the same number of
  devices, and the cores of one chip are on one host.
  """
  mesh = tuple(tpu_slice.mesh_shape)
  if len(mesh) != 4 or min(mesh) < 1:
    raise SliceError('%s: mesh_shape %s is not 4 positive sizes (x, y, z, '
                     'cores per chip)' % (tpu_slice.name, mesh))
  if not tpu_slice.device_coordinates:
    raise SliceError('%s: no host lists a TPU device' % tpu_slice.name)
  counts = {len(devices) for devices in tpu_slice.device_coordinates}
  if len(counts) != 1 or 0 in counts:
    raise SliceError(
        '%s: hosts list different numbers of TPU devices (%s): a slice has '
        'the same on every host' % (
            tpu_slice.name, ', '.join(
                'task %d: %d' % (t, len(d))
                for t, d in enumerate(tpu_slice.device_coordinates))))
  where = {}
  chip_task = {}
  for task, devices in enumerate(tpu_slice.device_coordinates):
    for ordinal, coord in enumerate(devices):
      coord = tuple(coord)
      if len(coord) != 4 or any(not 0 <= c < m for c, m in zip(coord, mesh)):
        raise SliceError('%s: task %d TPU:%d is at %s, outside the mesh %s' %
                         (tpu_slice.name, task, ordinal, coord, mesh))
      if coord in where:
        raise SliceError('%s: task %d TPU:%d and task %d TPU:%d are both at '
                         '%s' % ((tpu_slice.name,) + where[coord] +
                                 (task, ordinal, coord)))
      where[coord] = (task, ordinal)
      if chip_task.setdefault(coord[:3], task) != task:
        raise SliceError(
            '%s: the cores of chip %s are on tasks %d and %d: this model '
            'expects a chip on one host' % (tpu_slice.name, coord[:3],
                                            chip_task[coord[:3]], task))
  total = mesh[0] * mesh[1] * mesh[2] * mesh[3]
  if len(where) != total:
    raise SliceError(
        '%s: %d TPU device(s) listed for a mesh of %d cores (%s): a slice '
        'with missing chips is not handled' %
        (tpu_slice.name, len(where), total, 'x'.join(map(str, mesh))))
  return tpu_slice


def _Snake(shape):
  """A walk through a box of `shape` (fastest axis first), one step apart.

  The walk over the faster axes, forwards then backwards, once per value of
  the slowest axis: consecutive coordinates differ by one along one axis.
  """
  if len(shape) == 1:
    return [(i,) for i in range(shape[0])]
  inner = _Snake(shape[:-1])
  walk = []
  for s in range(shape[-1]):
    walk.extend(c + (s,) for c in (inner if s % 2 == 0 else inner[::-1]))
  return walk


def _Distance(a, b):
  """ICI hops between chips a and b (x, y, z) in a mesh."""
  return sum(abs(i - j) for i, j in zip(a, b))


def _HostWalks(chips):
  """Every snake through the box of `chips`: each start corner, axis order.

  Args:
    chips: a host's chips, (x, y, z) each.

  Returns:
    Lists of the chips in walk order; one (x fastest, from the lowest
    corner) if the chips are not a full box.
  """
  low = [min(c[i] for c in chips) for i in range(3)]
  high = [max(c[i] for c in chips) for i in range(3)]
  size = [h - l + 1 for l, h in zip(low, high)]
  if size[0] * size[1] * size[2] != len(set(chips)):
    return [sorted(set(chips), key=lambda c: (c[2], c[1], c[0]))]
  walks = []
  for axes in itertools.permutations(range(3)):
    for flips in itertools.product((False, True), repeat=3):
      walk = []
      for step in _Snake([size[a] for a in axes]):
        chip = [0, 0, 0]
        for along, a in zip(step, axes):
          chip[a] = along
        walk.append(tuple(
            low[i] + (size[i] - 1 - chip[i] if flips[i] else chip[i])
            for i in range(3)))
      if walk not in walks:
        walks.append(walk)
  return walks


def _HostOrder(task_chips):
  """The tasks in the order the path visits them.

  Hosts whose blocks tile the slice are visited as a snake over the grid of
  blocks, so consecutive hosts are neighbours; otherwise in task order.
  """
  origins = {t: tuple(min(c[i] for c in chips) for i in range(3))
             for t, chips in task_chips.items()}
  axes_values = [sorted({o[i] for o in origins.values()}) for i in range(3)]
  grid = [len(v) for v in axes_values]
  if grid[0] * grid[1] * grid[2] != len(origins) or len(
      set(origins.values())) != len(origins):
    return sorted(task_chips)
  by_cell = {tuple(axes_values[i].index(o[i]) for i in range(3)): t
             for t, o in origins.items()}
  return [by_cell[cell] for cell in _Snake(grid)]


def CorePath(tpu_slice):
  """Every core of the slice in the order replicas take them.

  Args:
    tpu_slice: a Slice.

  Returns:
    A list of (x, y, z, core) coordinates: host by host (a snake over the
    hosts' blocks), within a host its chips as a snake entered next to the
    previous host's last chip, the cores of each chip consecutive.
  """
  Check(tpu_slice)
  task_chips = collections.OrderedDict()
  for task, devices in enumerate(tpu_slice.device_coordinates):
    chips = task_chips.setdefault(task, [])
    for coord in devices:
      if tuple(coord[:3]) not in chips:
        chips.append(tuple(coord[:3]))
  order = _HostOrder(task_chips)
  path_chips = []
  for i, task in enumerate(order):
    following = task_chips[order[i + 1]] if i + 1 < len(order) else None

    def Cost(walk, following=following):
      # First: enter next to where the walk so far ended; then: end next
      # to the following host; then the lowest first steps, z slowest (one
      # answer whatever the order of the candidates).
      enter = _Distance(path_chips[-1], walk[0]) if path_chips else 0
      leave = (min(_Distance(walk[-1], c) for c in following)
               if following else 0)
      return (enter, leave, [chip[::-1] for chip in walk[:2]])

    path_chips.extend(min(_HostWalks(task_chips[task]), key=Cost))
  return [chip + (core,) for chip in path_chips
          for core in range(tpu_slice.cores_per_chip)]


class SliceLayout(
    collections.namedtuple('SliceLayout', [
        'slice', 'num_stages', 'stage_cores', 'core_assignment'])):
  """Where each stage of each replica runs on a slice (Layout's result).

  Attributes:
    slice: the Slice.
    num_stages: K.
    stage_cores: K logical core indices: stage k runs on logical core
      stage_cores[k] of its replica (tpu.core(stage_cores[k]) inside a
      replicated TPU computation; the same in every replica).
    core_assignment: R x D (x, y, z, core) coordinates: replica r's logical
      core d. This is what tf.tpu.experimental.DeviceAssignment(topology,
      core_assignment) takes, with num_cores_per_replica = D.
  """

  __slots__ = ()

  @property
  def num_replicas(self):
    return len(self.core_assignment)

  @property
  def cores_per_replica(self):
    return len(self.core_assignment[0])

  def _Where(self):
    where = {}
    for task, devices in enumerate(self.slice.device_coordinates):
      for ordinal, coord in enumerate(devices):
        where[tuple(coord)] = (task, ordinal)
    return where

  def StageCoordinates(self, replica):
    """K (x, y, z, core): where each stage of `replica` runs."""
    cores = self.core_assignment[replica]
    return [cores[d] for d in self.stage_cores]

  def StageDevices(self, replica, job=JOB):
    """K device strings of `replica`'s stages, as TensorFlow names them.

    E.g. '/job:worker/replica:0/task:1/device:TPU:3': the host (task) and
    TPU device ordinal at each stage's coordinates.
    """
    where = self._Where()
    return [cluster_spec_lib.DeviceName(where[c][0], 'TPU', where[c][1], job)
            for c in self.StageCoordinates(replica)]

  def ReplicaTasks(self, replica):
    """The hosts (tasks) that `replica`'s cores are on, in path order."""
    where = self._Where()
    return list(dict.fromkeys(where[c][0]
                              for c in self.core_assignment[replica]))

  def HandOvers(self, replica):
    """Counts of `replica`'s stage-to-stage hand-overs by what they cross.

    Returns:
      A dict: 'core' (the next stage on the same core), 'chip' (another
      core of the same chip), 'ici' (ICI hops between chips, summed over
      the hand-overs that leave the chip), 'between_hosts' (hand-overs
      whose two cores are on different hosts; still ICI within a slice).
    """
    where = self._Where()
    stages = self.StageCoordinates(replica)
    counts = {'core': 0, 'chip': 0, 'ici': 0, 'between_hosts': 0}
    for a, b in zip(stages, stages[1:]):
      if a == b:
        counts['core'] += 1
      elif a[:3] == b[:3]:
        counts['chip'] += 1
      else:
        counts['ici'] += _Distance(a[:3], b[:3])
      if where[a][0] != where[b][0]:
        counts['between_hosts'] += 1
    return counts


def Layout(tpu_slice, num_replicas, num_stages,
           placement=layout.ONE_PER_DEVICE, loop=False):
  """R replicas x K stages on the cores of `tpu_slice` (see the module doc).

  Args:
    tpu_slice: a Slice (Named, Grid or Slice.FromTopology).
    num_replicas: R.
    num_stages: K.
    placement: the schedule's placement rule (gpipe.runtime.layout's ANY,
      ONE_PER_DEVICE, ROUND_ROBIN or V_SHAPE).
    loop: several stages per core, round-robin (looped stages: stage s on
      core s mod D).

  Returns:
    A SliceLayout.

  Raises:
    SliceError: a slice this model does not handle.
    gpipe.runtime.layout.LayoutError: R x D differs from the slice's cores,
      or the placement does not fit K stages on D cores; the message names
      the counts and what would fit.
  """
  path = CorePath(tpu_slice)
  r, k, n = num_replicas, num_stages, len(path)
  if r < 1 or k < 1:
    raise layout.LayoutError('need R >= 1 replicas and K >= 1 stages, got '
                             'R=%d, K=%d' % (r, k))
  d = layout.DevicesPerReplica(k, placement, n, loop, r)
  if r * d != n:
    raise layout.LayoutError(
        '%d replica(s) x %d core(s) each (%d stages%s) = %d cores, but slice '
        '%s has %d (%d host(s) x %d): a replicated TPU computation runs '
        'every replica on the same number of cores, and every core is used, '
        'so R x D must equal %d%s' % (
            r, d, k, ', two per core in a V' if placement == layout.V_SHAPE
            else '', r * d, tpu_slice.name, n, tpu_slice.num_tasks,
            tpu_slice.cores_per_task, n, layout.FitsNote(n, r, k, placement)))
  stage_cores = layout.StagePlacement(k, d, placement, loop)
  assignment = [path[i * d:(i + 1) * d] for i in range(r)]
  return SliceLayout(tpu_slice, k, stage_cores, assignment)


def Describe(slice_layout):
  """Report lines: the slice, then each replica's stages on hosts and cores.

  Args:
    slice_layout: a SliceLayout.

  Returns:
    Lines like 'slice v3-8: 2x2x1 chips x 2 core(s), 1 host(s) x 8 cores;
    1 replica(s) x 8 stages on 8 core(s) each' and
    '  replica 0: stages 0-7 on task 0 (TPU:0, TPU:1, TPU:2, TPU:3, TPU:6,
    TPU:7, TPU:4, TPU:5); hand-overs: 4 within a chip, 3 ICI hop(s), 0
    between hosts'.
  """
  s = slice_layout.slice
  x, y, z, cores = s.mesh_shape
  lines = ['slice %s: %dx%dx%d chips x %d core(s), %d host(s) x %d cores; '
           '%d replica(s) x %d stages on %d core(s) each' % (
               s.name, x, y, z, cores, s.num_tasks, s.cores_per_task,
               slice_layout.num_replicas, slice_layout.num_stages,
               slice_layout.cores_per_replica)]
  for r in range(slice_layout.num_replicas):
    counts = slice_layout.HandOvers(r)
    parts = ['%d within a chip' % counts['chip'],
             '%d ICI hop(s)' % counts['ici'],
             '%d between hosts' % counts['between_hosts']]
    if counts['core']:
      parts.insert(0, '%d on the same core' % counts['core'])
    lines.append('  replica %d: %s; hand-overs: %s' % (
        r, _Runs(slice_layout.StageDevices(r)), ', '.join(parts)))
  return lines


def _Runs(stage_devices):
  """'stages 0-3 on task 0 (TPU:0, TPU:1, TPU:2, TPU:3), stages 4-7 ...'."""
  runs = []  # [task, first stage, [short device names]]
  for s, name in enumerate(stage_devices):
    task, device_type, index = layout.ParseDevice(name)
    if not runs or runs[-1][0] != task:
      runs.append([task, s, []])
    runs[-1][2].append('%s:%d' % (device_type, index))
  return ', '.join(
      '%s on task %d (%s)' % (
          'stage %d' % first if len(names) == 1 else
          'stages %d-%d' % (first, first + len(names) - 1), task,
          ', '.join(names)) for task, first, names in runs)
