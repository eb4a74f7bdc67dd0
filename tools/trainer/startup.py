"""Where a trainer's start-up goes: wall time and memory of each phase.

A large pipeline pays its start-up at every start, evaluation job and
recovery: building the layers and their variables, tracing the stages, the
learner's gradients and per-variable update ops, the session, and the first
step (where the session's master optimizes and partitions the graph and the
workers instantiate their stage functions). ``StartupLog`` times these
phases in the trainer process: each phase's own seconds (without the phases
nested in it), the process's resident and peak memory at its end, and writes
them to ``<logdir>/startup.json`` for ``python -m tools.benchmark startup``.

The phases inside Lingvo's graph construction are timed by wrapping the
functions that do the work (``Hooks``) and with the library's own hook on
stage tracing (``gpipe.stage.OnTrace``), only while the log is active
(``TimeGraphBuild``):

- ``forward``: the task's FProp on its inputs (the pipeline's schedule of
  stage calls), with ``stage tracing`` (tracing the stage functions) apart;
- ``tf.gradients``: the backward graph;
- ``learner``: gradient scaling and clipping and the optimizer's update ops
  (``optimizer update`` apart: slot variables and one update per variable).
"""

import contextlib
import functools
import json
import os
import time

from gpipe.measure import memory

PROC_STATUS = '/proc/self/status'


def ProcessMemory():
  """(resident, peak resident) bytes of this process (0, 0 if unknown)."""
  found = {}
  try:
    with open(PROC_STATUS) as f:
      for line in f:
        key, _, value = line.partition(':')
        if key in ('VmRSS', 'VmHWM'):
          found[key] = int(value.split()[0]) * 1024
  except OSError:
    return 0, 0
  return found.get('VmRSS', 0), found.get('VmHWM', 0)


def TrainerStartTime():
  """The wall-clock time the trainer started: its package's first import.

  Not the process's start: a script that sets up the machine and then execs
  the trainer (``train.sh``) keeps its process, and its set-up is not the
  trainer's start-up. The interpreter's own start before that import (tens
  of milliseconds) is not counted.
  """
  import tools.trainer  # pylint: disable=g-import-not-at-top
  return tools.trainer.STARTED


class StartupLog:
  """Phases of a start-up: nested timers with memory at each phase's end.

  ``Phase(name)`` is a context manager; phases nest, and each records its
  own time (its wall time less that of the phases inside it), so the rows
  add up to the total. A phase entered again (a hooked function called
  twice) adds to its row.
  """

  def __init__(self, echo=None, origin=None):
    """A log whose total counts from `origin` (default: the trainer's start)."""
    self._echo = echo
    self._started = TrainerStartTime() if origin is None else origin
    self._rows = {}
    self._order = []
    self._stack = []

  def _Row(self, name, parent):
    if name not in self._rows:
      self._rows[name] = dict(phase=name, parent=parent, seconds=0.0,
                              calls=0, rss_bytes=0, peak_bytes=0)
      self._order.append(name)
    return self._rows[name]

  @contextlib.contextmanager
  def Phase(self, name):
    """Times the body as phase `name` (nested in the phase around it)."""
    parent = self._stack[-1][0] if self._stack else None
    row = self._Row(name, parent)
    entry = [name, time.time(), 0.0]
    self._stack.append(entry)
    try:
      yield
    finally:
      self._stack.pop()
      wall = time.time() - entry[1]
      row['seconds'] += wall - entry[2]
      row['calls'] += 1
      row['rss_bytes'], row['peak_bytes'] = ProcessMemory()
      if self._stack:
        self._stack[-1][2] += wall
      if self._echo and not self._stack:
        self._echo('start-up: %s took %.1f s (trainer %s resident, peak %s)' %
                   (name, wall, memory.FormatMiB(row['rss_bytes']),
                    memory.FormatMiB(row['peak_bytes'])))

  def Mark(self, name, seconds, nested=False):
    """Adds a phase measured elsewhere.

    Args:
      name: the phase.
      seconds: its time.
      nested: False: a phase of its own (e.g. before the log existed);
        True: a phase that just ended inside the open one (a hook's report),
        whose own time it is taken from.
    """
    parent = self._stack[-1] if nested and self._stack else None
    row = self._Row(name, parent[0] if parent else None)
    row['seconds'] += seconds
    row['calls'] += 1
    row['rss_bytes'], row['peak_bytes'] = ProcessMemory()
    if parent:
      parent[2] += seconds

  @contextlib.contextmanager
  def Hooks(self, hooks):
    """Times calls of existing functions as phases, inside the body only.

    Args:
      hooks: (owner, attribute name, phase name) triples: owner is a module
        or class whose attribute is the function to time.

    Yields:
      Nothing; on exit every attribute is restored.
    """
    saved = []
    try:
      for owner, attr, name in hooks:
        original = owner.__dict__[attr]
        saved.append((owner, attr, original))
        setattr(owner, attr, self._Timed(original, name))
      yield
    finally:
      for owner, attr, original in reversed(saved):
        setattr(owner, attr, original)

  def _Timed(self, fn, name):
    """`fn` (a function, or a staticmethod/classmethod) timed as `name`."""
    wrap_as = None
    if isinstance(fn, (staticmethod, classmethod)):
      wrap_as, fn = type(fn), fn.__func__

    @functools.wraps(fn)
    def Timed(*args, **kwargs):
      with self.Phase(name):
        return fn(*args, **kwargs)

    return wrap_as(Timed) if wrap_as else Timed

  def Rows(self):
    """The phases in the order first entered, as dicts."""
    return [dict(self._rows[name]) for name in self._order]

  def Write(self, path, **extra):
    """Writes the phases (and `extra` fields) as JSON to `path`."""
    rss, peak = ProcessMemory()
    result = dict(extra, phases=self.Rows(), started=self._started,
                  since_trainer_start=time.time() - self._started,
                  trainer_rss_bytes=rss, trainer_peak_bytes=peak)
    with open(path, 'w') as f:
      json.dump(result, f, indent=1)
    return result


def GraphBuildHooks():
  """The (owner, attribute, phase) hooks of Lingvo's inside a graph's build."""
  # Imported here: the hooks name Lingvo's internals, which only a trainer
  # that builds a graph needs.
  from lingvo.core import base_model  # pylint: disable=g-import-not-at-top
  from lingvo.core import learner  # pylint: disable=g-import-not-at-top
  from lingvo.core import optimizer  # pylint: disable=g-import-not-at-top
  from lingvo.core import py_utils  # pylint: disable=g-import-not-at-top
  return [
      (base_model.BaseTask, 'FPropDefaultTheta', 'forward'),
      (learner.Learner, 'Apply', 'learner'),
      (py_utils, 'ComputeGradients', 'tf.gradients'),
      (optimizer.Base, 'Apply', 'optimizer update'),
  ]


@contextlib.contextmanager
def TimeGraphBuild(log):
  """Inside the body, times the phases of a graph's build in `log`.

  Args:
    log: a StartupLog.

  Yields:
    Nothing; on exit the functions are restored and the hook removed.
  """
  from gpipe import stage as stage_lib  # pylint: disable=g-import-not-at-top
  traced = lambda unused_stage, seconds: log.Mark('stage tracing', seconds,
                                                  nested=True)
  with log.Hooks(GraphBuildHooks()), stage_lib.OnTrace(traced):
    yield
