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
  (``gpipe.weight_batching``) a stage has one W task for all micro-batches
  of its pipeline, whose micro-batch index is an ``AllMicroBatches`` range,
  not an integer (printed ``W*s1``, op scope ``stage1_Wall0to7``).

Pipelined decoding (``gpipe.lanes``) adds a fourth phase, ``D``: one
decoding step of one stage on one lane (a slice of the batch, its
micro-batch index), run once per step inside the decoding loop.

Printed as ``F3s1`` (phase, micro-batch, stage). In the graph every task is
one function call op inside the name scope ``stage<k>_<phase><m>``
(``OpScope``); execution traces are parsed back with ``ParseOpName``. The
order of the tasks on each device is imposed on the graph by
``gpipe.task_ops.ScheduledOps`` with control dependencies.

Pure Python, like the whole of ``gpipe.schedules``: no TensorFlow.
"""

import collections
import re

Task = collections.namedtuple('Task', ['stage', 'micro_batch', 'phase'])

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'
DECODE = 'D'
PHASES = (FORWARD, BACKWARD, WEIGHT, DECODE)

# Re-materialization: every stage recomputes its forward pass in its backward
# task, every stage but the last, or none.
REMAT_MODES = ('always', 'except_last', 'never')


def RematerializesStage(remat, stage, num_stages):
  """Whether `stage`'s backward recomputes its forward pass.

  The one place of the rule: with 'except_last' the last *stage*, whose
  backward starts right after its forward, keeps its activations.

  Args:
    remat: a mode of REMAT_MODES, or True/False (every stage, or none).
    stage: the stage's index, 0 to `num_stages` - 1.
    num_stages: K.

  Returns:
    True if the stage recomputes its forward pass.

  Raises:
    ValueError: `remat` is not a mode of REMAT_MODES or a bool.
  """
  if isinstance(remat, bool):
    return remat
  if remat not in REMAT_MODES:
    raise ValueError('remat is %r; use one of %s' %
                     (remat, ', '.join(REMAT_MODES)))
  return remat == 'always' or (remat == 'except_last' and
                               stage < num_stages - 1)


class AllMicroBatches(collections.namedtuple('AllMicroBatches',
                                             ['first', 'count'])):
  """The micro-batch index of a task that covers `count` micro-batches.

  A stage's one batched W task covers every micro-batch of its pipeline:
  ``AllMicroBatches(0, M)``, or ``AllMicroBatches(r M, M)`` for data-parallel
  replica r. It is deliberately not an integer: ``Shifted`` moves it
  explicitly, and ``+`` raises instead of turning it into another task's
  index.
  """

  __slots__ = ()

  def __add__(self, other):
    raise TypeError('AllMicroBatches%r is a range of micro-batches, not an '
                    'index: use ShiftMicroBatch' % (tuple(self),))

  __radd__ = __add__

  def Shifted(self, offset):
    return AllMicroBatches(self.first + offset, self.count)


def IsAll(micro_batch):
  """Whether a task's micro-batch index covers all micro-batches."""
  return isinstance(micro_batch, AllMicroBatches)


def ShiftMicroBatch(micro_batch, offset):
  """An index, or a range of micro-batches, moved by `offset`."""
  if IsAll(micro_batch):
    return micro_batch.Shifted(offset)
  return micro_batch + offset


_CALL = re.compile(
    r'(?:^|/)stage(\d+)_([%s])(\d+|all(\d+)to(\d+))/'
    r'(?:Stateful)?PartitionedCall$' % ''.join(PHASES))


def MicroBatchName(micro_batch):
  """'3', or '*' for a task that covers all micro-batches."""
  return '*' if IsAll(micro_batch) else str(micro_batch)


def Label(task):
  """'F3s1': phase, micro-batch, stage ('W*s1' for a batched W task)."""
  return '%s%ss%d' % (task.phase, MicroBatchName(task.micro_batch),
                      task.stage)


# The name scope of the recomputed forward pass inside a re-materializing
# backward task's function (what a trace shows as recomputation).
RECOMPUTE_SCOPE = 'recompute'


def OpScope(stage, phase, micro_batch):
  """The name scope of a task's call op: 'stage1_B3', 'stage1_Wall0to7'."""
  if IsAll(micro_batch):
    return 'stage%d_%sall%dto%d' % (stage, phase, micro_batch.first,
                                     micro_batch.first + micro_batch.count - 1)
  return 'stage%d_%s%d' % (stage, phase, micro_batch)


def ParseOpName(node_name):
  """The Task of a traced call op's name, or None for any other op."""
  match = _CALL.search(node_name)
  if not match:
    return None
  if match.group(4) is not None:
    first, last = int(match.group(4)), int(match.group(5))
    m = AllMicroBatches(first, last - first + 1)
  else:
    m = int(match.group(3))
  return Task(int(match.group(1)), m, match.group(2))


def Dependencies(task, num_stages, num_micro_batches, per_micro_batch_loss):
  """The tasks whose outputs `task` consumes (the pipeline's dataflow).

  Args:
    task: a Task; a batched W task (an ``AllMicroBatches`` index) needs the
      B of every micro-batch it covers.
    num_stages: K.
    num_micro_batches: M.
    per_micro_batch_loss: whether the last stage's B of micro-batch m needs
      only its own forward (the loss inside the pipeline), not every one.

  Returns:
    A list of Tasks.
  """
  s, m = task.stage, task.micro_batch
  if IsAll(m):
    return [Task(s, i, BACKWARD) for i in range(m.first, m.first + m.count)]
  if task.phase == FORWARD:
    return [Task(s - 1, m, FORWARD)] if s else []
  if task.phase == WEIGHT:
    return [Task(s, m, BACKWARD)]
  if s < num_stages - 1:
    return [Task(s + 1, m, BACKWARD), Task(s, m, FORWARD)]
  if per_micro_batch_loss:
    return [Task(s, m, FORWARD)]
  # The loss needs the whole mini-batch: every last-stage forward.
  return [Task(s, j, FORWARD) for j in range(num_micro_batches)]
