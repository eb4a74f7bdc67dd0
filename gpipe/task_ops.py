"""The graph side of a schedule: each device's task ops chained in its order.

A schedule (``gpipe.schedules``) is pure data: per device, its tasks
(``gpipe.schedules.pipeline_tasks.Task``) in run order. ``ScheduledOps``
imposes that order on the graph: as the executor (``gpipe.executor``,
``gpipe.lanes``) creates each task's call op, it registers the op here, and
the op gets control dependencies on its neighbours in its device's order.
Graph surgery, so it lives beside the executor, not with the schedules.
"""

from gpipe.compat import tf_internal
from gpipe.schedules import pipeline_tasks


class ScheduledOps:
  """Orders the ops of each device's tasks as the schedule says.

  The tasks on each device are chained by control dependencies in their
  schedule order, so a device never starts a later task first. Forward ops
  exist before backward ones are created (by tf.gradients, in an order of its
  choosing), so each new task's ops are linked to whichever neighbours in its
  device's order already exist; once every task is registered, every pair of
  neighbours is linked.

  A second ``tf.gradients`` over the same pipeline builds the backward tasks
  again: those are registered with ``gradient_pass`` > 0 and left unordered
  (chaining them to the first pass's ops could deadlock a step that runs
  both). Any other surprise is an error: a task the orders do not hold, or a
  task registered twice in the same pass.
  """

  def __init__(self, orders):
    """Constructor.

    Args:
      orders: per device, its Tasks in run order.
    """
    self._position = {}
    self._orders = orders
    for lane, order in enumerate(orders):
      for i, task in enumerate(order):
        if task in self._position:
          raise ValueError('task %s is twice in the orders (devices %d and '
                           '%d)' % (pipeline_tasks.Label(task),
                                    self._position[task][0], lane))
        self._position[task] = (lane, i)
    self._ops = {}
    self._repeated = {}

  def Has(self, task):
    """Whether `task` is in the orders."""
    return task in self._position

  def Registered(self, task):
    """Whether `task`'s ops of the first pass were registered."""
    return task in self._ops

  def Register(self, task, ops, gradient_pass=0):
    """Records the ops of `task` and chains them to its neighbours.

    Args:
      task: a Task of the schedule.
      ops: the graph ops that run it (usually one function call op).
      gradient_pass: 0 for the forward tasks and the first tf.gradients over
        the pipeline; n > 0 for the backward tasks of the (n+1)-th, which are
        recorded but not ordered.

    Raises:
      ValueError: `task` is not in the orders, or was already registered in
        this pass (a bug in the caller: its ops would be left unordered).
    """
    if task not in self._position:
      forward_only = all(t.phase == pipeline_tasks.FORWARD
                         for t in self._position)
      raise ValueError(
          'task %s (%r) is in no device order of this pipeline; the orders '
          'hold %d tasks, e.g. %s%s' % (
              pipeline_tasks.Label(task), task, len(self._position),
              ', '.join(pipeline_tasks.Label(t)
                        for t in list(self._position)[:6]),
              '. The pipeline runs forward only (it was built in eval mode, '
              'which computes no gradients): take gradients of a pipeline '
              'built outside eval mode' if forward_only and
              task.phase != pipeline_tasks.FORWARD else ''))
    ops = [op for op in ops if op is not None]
    if gradient_pass:
      self._repeated.setdefault(task, []).append(ops)
      return
    if task in self._ops:
      raise ValueError(
          'task %s was registered twice in the same pass; a later '
          'tf.gradients over the pipeline must pass gradient_pass > 0' %
          pipeline_tasks.Label(task))
    self._ops[task] = ops
    lane, i = self._position[task]
    order = self._orders[lane]
    if i > 0:
      for prev_op in self._ops.get(order[i - 1], []):
        for op in ops:
          tf_internal.AddControlInput(op, prev_op)
    if i + 1 < len(order):
      for next_op in self._ops.get(order[i + 1], []):
        for op in ops:
          tf_internal.AddControlInput(next_op, op)

  def Ops(self, task):
    """The registered ops of `task` ([] if not registered yet)."""
    return list(self._ops.get(task, []))
