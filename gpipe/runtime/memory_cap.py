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

from gpipe.runtime import cgroups


class MemoryCapError(RuntimeError):
  """The memory cap cannot be set up on this host."""


def ParentDirectory():
  """The directory new worker cgroups are made in: this process's own.

  Raises:
    MemoryCapError: no cgroup v1 memory controller, or not writable.
  """
  return cgroups.ParentDirectory('memory', 'a worker memory cap',
                                 MemoryCapError)


_Write = cgroups.Write
_Read = cgroups.Read


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
    cgroups.Remove(self.path, timeout)
