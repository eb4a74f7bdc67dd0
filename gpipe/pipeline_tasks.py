"""The task vocabulary shared by schedules, executor, stages and timeline.

A pipeline step is a set of tasks; a task is one phase of one stage on one
micro-batch:

* ``F`` (forward): the stage's layers on micro-batch m;
* ``B`` (backward): the gradient of the stage's *inputs* for micro-batch m.
  In a schedule without a split backward, B also computes the gradient of
  the stage's weights (the whole backward pass of the stage). With
  re-materialization B first recomputes the stage's forward pass;
* ``W`` (weights): only in schedules with a split backward (zero bubble):
  the gradient of the stage's weights for micro-batch m, from what B kept.
  W is off the critical path: nothing downstream waits for it, so a schedule
  can delay it into what would be a bubble. With batched weight gradients
  (``gpipe.weight_batching``) a stage has one W task for all micro-batches,
  whose micro-batch index is ``ALL`` (printed ``W*s1``, op scope
  ``stage1_Wall``).

Printed as ``F3s1`` (phase, micro-batch, stage). In the graph every task is
one function call op inside the name scope ``stage<k>_<phase><m>``
(``OpScope``); execution traces are parsed back with ``ParseOpName``. The
order of the tasks on each device is imposed by ``TaskRegistry`` with control
dependencies.
"""

import collections
import re

Task = collections.namedtuple('Task', ['stage', 'micro_batch', 'phase'])

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'
PHASES = (FORWARD, BACKWARD, WEIGHT)

# The micro-batch index of a task that covers every micro-batch (the one
# batched W task of a stage).
ALL = -1
_ALL_NAME = 'all'

_CALL = re.compile(
    r'(?:^|/)stage(\d+)_([%s])(\d+|%s)/(?:Stateful)?PartitionedCall$' %
    (''.join(PHASES), _ALL_NAME))


def Label(task):
  """'F3s1': phase, micro-batch, stage."""
  if task.micro_batch == ALL:
    return '%s*s%d' % (task.phase, task.stage)
  return '%s%ds%d' % (task.phase, task.micro_batch, task.stage)


def OpScope(stage, phase, micro_batch):
  """The name scope of a task's call op: 'stage1_B3'."""
  if micro_batch == ALL:
    return 'stage%d_%s%s' % (stage, phase, _ALL_NAME)
  return 'stage%d_%s%d' % (stage, phase, micro_batch)


def ParseOpName(node_name):
  """The Task of a traced call op's name, or None for any other op."""
  match = _CALL.search(node_name)
  if not match:
    return None
  m = match.group(3)
  return Task(int(match.group(1)), ALL if m == _ALL_NAME else int(m),
              match.group(2))


class TaskRegistry:
  """Orders the ops of each device's tasks as the schedule says.

  The tasks on each device are chained by control dependencies in their
  schedule order, so a device never starts a later task first. Forward ops
  exist before backward ones are created (by tf.gradients, in an order of its
  choosing), so each new task's ops are linked to whichever neighbours in its
  device's order already exist; once every task is registered, every pair of
  neighbours is linked.
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
        self._position[task] = (lane, i)
    self._ops = {}

  def Has(self, task):
    return task in self._position

  def Register(self, task, ops):
    """Records the ops of `task` and chains them to its neighbours.

    Args:
      task: a Task of the schedule.
      ops: the graph ops that run it (usually one function call op).
    """
    if task in self._ops:
      # A second tf.gradients call over the same pipeline: leave its ops
      # unordered rather than chain them to the first call's.
      return
    ops = [op for op in ops if op is not None]
    self._ops[task] = ops
    lane, i = self._position[task]
    order = self._orders[lane]
    if i > 0:
      for prev_op in self._ops.get(order[i - 1], []):
        for op in ops:
          op._add_control_input(prev_op)  # pylint: disable=protected-access
    if i + 1 < len(order):
      for next_op in self._ops.get(order[i + 1], []):
        for op in ops:
          next_op._add_control_input(op)  # pylint: disable=protected-access

  def Ops(self, task):
    """The registered ops of `task` ([] if not registered yet)."""
    return list(self._ops.get(task, []))
