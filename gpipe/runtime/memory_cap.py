"""A memory cap per local worker process: a Linux cgroup (v1) of its own.

A worker started under a ``MemoryCap`` runs in a new child cgroup of this
process's memory cgroup with ``memory.limit_in_bytes`` (and, where the
kernel counts swap, ``memory.memsw.limit_in_bytes``) set to the cap: what a
device's memory is to its stages. The kernel's OOM killer ends the worker
when its resident memory (weights, activations, TensorFlow's own) cannot
stay under the cap; ``OomKills`` then says so, so that the caller can tell
a worker killed by its cap from one that died of something else.

An address-space limit (``RLIMIT_AS``) would not do: TensorFlow reserves
large virtual ranges it never touches. The memory controller counts the
pages a process really uses.

Needs the cgroup v1 memory controller mounted read-write (usually at
``/sys/fs/cgroup/memory``) and the right to create cgroups under this
process's own (root, or a delegated subtree).
"""

import os
import time

_MOUNTS = '/proc/mounts'
_OWN_CGROUP = '/proc/self/cgroup'


class MemoryCapError(RuntimeError):
  """The memory cap cannot be set up on this host."""


def _MemoryMount():
  """Where the cgroup v1 memory controller is mounted, or None."""
  try:
    with open(_MOUNTS) as f:
      for line in f:
        fields = line.split()
        if (len(fields) >= 4 and fields[2] == 'cgroup' and
            'memory' in fields[3].split(',')):
          return fields[1]
  except OSError:
    pass
  return None


def _OwnMemoryCgroup():
  """This process's memory cgroup path (relative to the mount), or None."""
  try:
    with open(_OWN_CGROUP) as f:
      for line in f:
        _, controllers, path = line.rstrip('\n').split(':', 2)
        if 'memory' in controllers.split(','):
          return path
  except (OSError, ValueError):
    pass
  return None


def ParentDirectory():
  """The directory new worker cgroups are made in: this process's own.

  Raises:
    MemoryCapError: no cgroup v1 memory controller, or not writable.
  """
  mount = _MemoryMount()
  own = _OwnMemoryCgroup()
  if mount is None or own is None:
    raise MemoryCapError(
        'a worker memory cap needs the Linux cgroup v1 memory controller '
        '(mounted at e.g. /sys/fs/cgroup/memory), which this host does not '
        'have; run without the memory cap, or on a host that has it')
  parent = os.path.join(mount, own.lstrip('/'))
  if not os.access(parent, os.W_OK):
    raise MemoryCapError(
        'a worker memory cap makes a child cgroup under %s, but this process '
        'may not write there; run as root (or in a container whose cgroup '
        'is delegated to it), or without the memory cap' % parent)
  return parent


def _Write(path, value):
  with open(path, 'w') as f:
    f.write(str(value))


def _Read(path):
  with open(path) as f:
    return f.read()


class MemoryCap:
  """A cgroup with a memory limit, for one worker process."""

  def __init__(self, name, cap_bytes):
    """Creates the cgroup and sets its limit.

    Args:
      name: the cgroup's directory name (unique on the host, e.g. with the
        launcher's pid in it).
      cap_bytes: the limit, bytes of resident memory (swap included).

    Raises:
      MemoryCapError: no usable cgroup v1 memory controller, or a cap the
        kernel refuses.
    """
    if cap_bytes <= 0:
      raise MemoryCapError('a memory cap must be > 0 bytes; got %d' %
                           cap_bytes)
    self.cap_bytes = int(cap_bytes)
    self.path = os.path.join(ParentDirectory(), name)
    try:
      os.makedirs(self.path, exist_ok=True)
      _Write(os.path.join(self.path, 'memory.limit_in_bytes'),
             self.cap_bytes)
      swap = os.path.join(self.path, 'memory.memsw.limit_in_bytes')
      if os.path.exists(swap):
        # Memory plus swap under the same cap: no swapping past it.
        _Write(swap, self.cap_bytes)
    except OSError as e:
      self.Remove()
      raise MemoryCapError('could not set a memory cap of %d bytes in %s: %s'
                           % (self.cap_bytes, self.path, e)) from e

  def Command(self, cmd):
    """`cmd` (a list) run inside the cgroup: it joins, then execs `cmd`."""
    return ['/bin/sh', '-c', 'echo $$ > "$0" && exec "$@"',
            os.path.join(self.path, 'cgroup.procs')] + list(cmd)

  def PeakBytes(self):
    """The most memory the cgroup's processes used at once (None if gone)."""
    try:
      return int(_Read(os.path.join(self.path, 'memory.max_usage_in_bytes')))
    except (OSError, ValueError):
      return None

  def OomKills(self):
    """Processes the OOM killer ended in this cgroup for its cap.

    Returns:
      The count; None if the kernel does not report it (or it is gone).
    """
    try:
      text = _Read(os.path.join(self.path, 'memory.oom_control'))
    except OSError:
      return None
    for line in text.splitlines():
      fields = line.split()
      if len(fields) == 2 and fields[0] == 'oom_kill':
        return int(fields[1])
    return None

  def Remove(self, timeout=5.0):
    """Removes the cgroup once its processes are gone (idempotent)."""
    deadline = time.time() + timeout
    while os.path.isdir(self.path):
      try:
        os.rmdir(self.path)
        return
      except OSError:
        # Busy until the kernel has finished with its last process.
        if time.time() > deadline:
          return
        time.sleep(0.05)
