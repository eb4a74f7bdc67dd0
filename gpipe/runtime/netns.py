"""Joining a Linux network namespace (setns), for a process or a thread.

A process forked into a lab host (``gpipe.runtime.fork_server``) joins the
host's namespace before it serves; ``tools.netlab.netns.InNamespace`` joins
one in a thread of its own. Only the calling thread moves: call it where
that thread is the process's only one, or in a thread whose sockets are to
belong to the namespace.
"""

import ctypes
import os

_CLONE_NEWNET = 0x40000000


def Join(name):
  """Moves the calling thread into network namespace `name`.

  Args:
    name: a namespace under /var/run/netns (``ip netns add``), or the path
      of a namespace file (e.g. /proc/PID/ns/net).

  Raises:
    OSError: the namespace does not exist, or setns refused (not root).
  """
  libc = ctypes.CDLL(None, use_errno=True)
  fd = os.open(name if name.startswith('/') else '/var/run/netns/' + name,
               os.O_RDONLY)
  try:
    if libc.setns(fd, _CLONE_NEWNET):
      raise OSError(ctypes.get_errno(), 'setns into %s failed' % name)
  finally:
    os.close(fd)
