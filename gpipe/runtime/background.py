"""A function running in a thread of its own, its value or error kept.

Three callers need the same thing: run work in another thread and, while it
runs or after, get exactly what it returned or raised.

* ``LocalCluster.Call`` runs session work while it checks that the worker
  processes are alive (a dead master would make the run wait forever);
* the trainer runs each step while it probes the session's master;
* ``RunIsolated`` builds scratch layers (to count, time or profile them)
  outside the thread-local stack of layers that Lingvo is constructing.

Plain ``threading``: no TensorFlow, and Lingvo only if the caller imported
it (``RunIsolated``).
"""

import sys
import threading


class BackgroundCall:
  """fn() started in a new thread at construction.

  Example::

    call = BackgroundCall(lambda: sess.run(fetches))
    while not call.Wait(0.5):
      CheckWorkers()
    values = call.Result()
  """

  def __init__(self, fn, daemon=True, name=None):
    """Starts fn() in a new thread.

    Args:
      fn: a function of no arguments.
      daemon: whether the thread may be abandoned when the process exits
        (a run that waits on a dead worker never returns).
      name: the thread's name, for stack dumps.
    """
    self._fn = fn
    self._value = None
    self._error = None
    self._done = threading.Event()
    self.thread = threading.Thread(target=self._Run, daemon=daemon,
                                   name=name)
    self.thread.start()

  def _Run(self):
    try:
      self._value = self._fn()
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e
    finally:
      # What fn holds (e.g. a closed session and its graph) is not kept
      # alive by a finished call that is still referenced.
      self._fn = None
      self._done.set()

  def Wait(self, timeout=None):
    """Waits up to `timeout` seconds (None: until it ends); True if ended."""
    return self._done.wait(timeout)

  @property
  def done(self):
    return self._done.is_set()

  @property
  def error(self):
    """What fn raised (None while it runs or if it returned)."""
    return self._error

  def Result(self):
    """Waits for fn to end; returns its value or raises its error."""
    self._done.wait()
    if self._error is not None:
      raise self._error
    return self._value


def _DefaultCluster():
  """A default Lingvo cluster; None if Lingvo was not imported."""
  factory = sys.modules.get('lingvo.core.cluster_factory')
  if factory is None:
    return None
  return factory.Cluster(factory.Cluster.Params())


def RunIsolated(fn):
  """Runs fn() in a fresh thread and returns its result (or raises its error).

  Lingvo tracks the layers under construction in a thread-local stack, so a
  layer built while another layer's __init__ runs would become its child.
  Scratch layers (for counting, timing or profiling) are built in their own
  thread, whose stack is empty. The thread is not a daemon: the work always
  finishes.

  Lingvo's stack of clusters is thread-local too, and the thread's is empty
  as before (a scratch build does not depend on the caller's cluster, e.g.
  its eval mode), but with one default cluster on it: without it, each
  layer built would make a default cluster of its own, a deep copy of its
  params each time (an AmoebaNet-D's parameter count spent 8 of its 11 s
  there). Lingvo is used only if the caller imported it.
  """
  cluster = _DefaultCluster()
  if cluster is None:
    return BackgroundCall(fn, daemon=False).Result()

  def InCluster():
    with cluster:
      return fn()

  return BackgroundCall(InCluster, daemon=False).Result()
