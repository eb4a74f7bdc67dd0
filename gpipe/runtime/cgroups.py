"""Linux cgroup v1 controllers: where a child cgroup of this process goes.

A worker's memory cap (``memory_cap``) and CPU quota (``cpu_quota``) are
child cgroups of this process's own cgroup under one v1 controller
(``memory``, ``cpu``). ``ParentDirectory(controller)`` finds that cgroup's
directory, checked writable, or says why there is none; ``Write``, ``Read``
and ``Remove`` handle a cgroup's files and the cgroup itself.
"""

import os
import time

_MOUNTS = '/proc/mounts'
_OWN_CGROUP = '/proc/self/cgroup'


class CgroupError(RuntimeError):
  """A cgroup v1 controller is missing, or this process may not use it."""


def Mount(controller):
  """Where the cgroup v1 `controller` is mounted, or None."""
  try:
    with open(_MOUNTS) as f:
      for line in f:
        fields = line.split()
        if (len(fields) >= 4 and fields[2] == 'cgroup' and
            controller in fields[3].split(',')):
          return fields[1]
  except OSError:
    pass
  return None


def OwnCgroup(controller):
  """This process's cgroup of `controller` (relative to the mount), or None."""
  try:
    with open(_OWN_CGROUP) as f:
      for line in f:
        _, controllers, path = line.rstrip('\n').split(':', 2)
        if controller in controllers.split(','):
          return path
  except (OSError, ValueError):
    pass
  return None


def ParentDirectory(controller, what, error=CgroupError):
  """The directory new child cgroups of `controller` are made in.

  Args:
    controller: a cgroup v1 controller, e.g. 'memory' or 'cpu'.
    what: what needs it, for messages ('a worker memory cap').
    error: the exception class to raise.

  Returns:
    This process's own cgroup directory of that controller.

  Raises:
    `error`: no such controller mounted, or its directory is not writable.
  """
  mount = Mount(controller)
  own = OwnCgroup(controller)
  if mount is None or own is None:
    raise error(
        '%s needs the Linux cgroup v1 %s controller (mounted at e.g. '
        '/sys/fs/cgroup/%s), which this host does not have; run without it, '
        'or on a host that has it' % (what, controller, controller))
  parent = os.path.join(mount, own.lstrip('/'))
  if not os.access(parent, os.W_OK):
    raise error(
        '%s makes a child cgroup under %s, but this process may not write '
        'there; run as root (or in a container whose cgroup is delegated to '
        'it), or without it' % (what, parent))
  return parent


def Write(path, value):
  with open(path, 'w') as f:
    f.write(str(value))


def Read(path):
  with open(path) as f:
    return f.read()


def Remove(path, timeout=5.0):
  """Removes the cgroup at `path` once its processes are gone (idempotent)."""
  deadline = time.time() + timeout
  while os.path.isdir(path):
    try:
      os.rmdir(path)
      return
    except OSError:
      # Busy until the kernel has finished with its last process.
      if time.time() > deadline:
        return
      time.sleep(0.05)
