"""Deprecated: the former home of the task vocabulary, kept for one release.

It was split in two:

* the task vocabulary (``Task``, the phases, ``Label``, ``OpScope``,
  ``ParseOpName``, ``Dependencies``, ...) is
  ``gpipe.schedules.pipeline_tasks``, pure Python;
* ``TaskRegistry``, which chains the tasks' graph ops in each device's order,
  is ``gpipe.task_ops.ScheduledOps``.

This module re-exports both under their old names (the same objects) and
warns once on import. It will be deleted in the next release.
"""

import warnings

from gpipe import task_ops as _task_ops
from gpipe.schedules import pipeline_tasks as _pipeline_tasks

warnings.warn(
    'gpipe.pipeline_tasks is deprecated: import gpipe.schedules.pipeline_tasks '
    '(the task vocabulary) or gpipe.task_ops (ScheduledOps, formerly '
    'TaskRegistry)', DeprecationWarning, stacklevel=2)

globals().update({
    name: value for name, value in vars(_pipeline_tasks).items()
    if not name.startswith('_')
})
TaskRegistry = _task_ops.ScheduledOps
