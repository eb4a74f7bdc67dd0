"""A stack of scopes per thread, for state that graph-building code opens.

Tracing a stage function opens scopes (the micro-batch seed, the batch-norm
statistics collector) that layers deep inside read without an argument being
threaded through every FProp. Each thread builds its own graph (the 'time'
partitioner traces layers in a thread of its own), so the stack is
thread-local.
"""

import contextlib
import threading


class ThreadLocalStack:
  """A per-thread stack whose innermost item code in the scope can read."""

  def __init__(self):
    self._local = threading.local()

  def _Items(self):
    if not hasattr(self._local, 'items'):
      self._local.items = []
    return self._local.items

  @contextlib.contextmanager
  def Pushed(self, item):
    """Makes `item` the innermost one inside the block; yields it."""
    items = self._Items()
    items.append(item)
    try:
      yield item
    finally:
      items.pop()

  def Top(self):
    """The innermost item of this thread, or None outside every scope."""
    items = self._Items()
    return items[-1] if items else None
