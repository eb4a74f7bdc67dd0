"""Checks that each micro-batch's loss gradient needs only its own forward.

Every schedule but fill-drain runs micro-batch m's backward on the last stage
before the forwards of later micro-batches (1F1B: ``F0 B0 F1 B1 ...``). That
is only possible when the gradient reaching the last stage for micro-batch m
is computed from micro-batch m alone: the loss of each micro-batch computed
inside the pipeline (``PipeliningLayer``'s ``loss_tpl``), reduced by the
caller with a sum or mean. A loss computed on the merged output (e.g. a
softmax cross entropy over the whole batch's logits) makes every gradient
wait for every forward; with the schedule's order imposed on top, the step
would deadlock. ``Checker`` finds this while the gradient graph is built and
raises an error that says what to change, instead of a hang.
"""

from gpipe.schedules import pipeline_tasks


class Checker:
  """Walks the graph behind each last-stage output gradient."""

  def __init__(self, pipeline_name, schedule_name, scheduled_ops, num_stages,
               num_micro_batches, has_loss_layer):
    """Constructor.

    Args:
      pipeline_name: the PipeliningLayer's name (for messages).
      schedule_name: its schedule.
      scheduled_ops: the task_ops.ScheduledOps holding every forward task's
        ops.
      num_stages: K.
      num_micro_batches: M.
      has_loss_layer: whether the pipeline ends with p.loss_tpl.
    """
    self._pipeline = pipeline_name
    self._schedule = schedule_name
    self._scheduled_ops = scheduled_ops
    self._num_stages = num_stages
    self._num_micro_batches = num_micro_batches
    self._has_loss = has_loss_layer
    self._forward_of = None  # op -> micro-batch, built at the first check.
    self._memo = {}

  def _ForwardOps(self):
    return {
        op: m for s in range(self._num_stages)
        for m in range(self._num_micro_batches)
        for op in self._scheduled_ops.Ops(
            pipeline_tasks.Task(s, m, pipeline_tasks.FORWARD))
    }

  def _MicroBatchesBehind(self, op):
    """The micro-batches whose forward tasks `op` depends on (memoized)."""
    stack = [(op, False)]
    while stack:
      current, expanded = stack.pop()
      if current in self._memo:
        continue
      if current in self._forward_of:
        self._memo[current] = frozenset([self._forward_of[current]])
        continue
      parents = [t.op for t in current.inputs] + list(current.control_inputs)
      if expanded:
        found = frozenset()
        for parent in parents:
          found |= self._memo.get(parent, frozenset())
        self._memo[current] = found
        continue
      stack.append((current, True))
      stack.extend((parent, False) for parent in parents
                   if parent not in self._memo)
    return self._memo[op]

  def Check(self, micro_batch, d_outputs):
    """Raises ValueError if `d_outputs` depend on other micro-batches.

    Args:
      micro_batch: m, the micro-batch of the last stage's backward task.
      d_outputs: the gradients of its float outputs.
    """
    if self._forward_of is None:
      self._forward_of = self._ForwardOps()
    others = set()
    for d in d_outputs:
      if d is not None:
        others |= self._MicroBatchesBehind(d.op) - {micro_batch}
    if not others:
      return
    others = sorted(others)
    advice = (
        'Compute each micro-batch\'s loss inside the pipeline: set loss_tpl '
        'to a layer returning per-example losses (FProp(theta, *outputs, '
        'targets)), pass FProp(..., targets=labels), and reduce its merged '
        'output with tf.reduce_mean or tf.reduce_sum.'
        if not self._has_loss else
        'The loss layer\'s output must be reduced without mixing '
        'micro-batches (tf.reduce_mean or tf.reduce_sum of the per-example '
        'losses, not e.g. a normalization by the whole batch\'s output).')
    raise ValueError(
        '%s: schedule %r starts the backward of micro-batch %d at the last '
        'stage right after its forward, but the gradient of its output '
        'depends on the forward of micro-batch(es) %s: the loss is not '
        'separable per micro-batch. %s Or use schedule=\'gpipe\', which '
        'waits for every forward.' %
        (self._pipeline, self._schedule, micro_batch,
         ', '.join(str(m) for m in others[:8]), advice))
