"""Batched weight gradients: one W task per stage for all micro-batches.

Micro-batching makes every weight gradient a sum of M small products. For a
dense layer, micro-batch m's weight gradient is ``x_m^T dy_m``: a matmul
whose inner dimension is the micro-batch (32 rows at M=32 of a 1024 batch),
slow on a CPU or an accelerator, whose 4 MiB result (a 1024x1024 layer) is
then written and added to a running sum, M times per step. Both costs grow
with M while the bubble they buy back shrinks.

With ``PipeliningLayer.batched_weight_gradients`` every micro-batch runs F
and B (the input gradient, which the previous stage waits for), and each
stage keeps what its weight gradient reads (x_m and dy_m). After its last
B, one W task per stage computes the weight gradients of all micro-batches
at once: ``concat(x)^T concat(dy)``, one large matmul, no running sum. W is
off the critical path, so the last stage's W fills the drain bubble while
the earlier stages finish their B's::

  fill-drain, K=2, M=4:

    device 0:  F0 F1 F2 F3 .. .. .. .. B3 B2 B1 B0 W*
    device 1:  .. F0 F1 F2 F3 B3 B2 B1 B0 W*

  (``W*``: all micro-batches' weight gradients; B is the input gradient
  only.)

It works with every schedule (with 1F1B and the zero-bubble ones the W's of
a stage move from their slots to after its last B) and every remat mode. The
price is memory: what W reads (about one activation and one output gradient
per weight per micro-batch) stays alive until the end of the stage's
backward, as without re-materialization.

The batched W is traced on the whole replica batch (M micro-batches) and
fed the micro-batches' tensors concatenated along the axis where the two
traces' shapes differ; weight gradients that B computed itself are summed.
This equals the sum of the per-micro-batch weight gradients when each weight
gradient is a sum over examples (or positions) of per-example products: true
for dense, attention, convolution, embedding and normalization layers,
whose statistics are computed in F or B, never in W. A stage whose W reads
a tensor that cannot be concatenated (a scalar per micro-batch, a shape
that does not scale with the batch) is refused with the tensor's name.
"""

from gpipe.schedules import pipeline_tasks

Task = pipeline_tasks.Task


def Orders(orders):
  """Device orders with each stage's W tasks replaced by one batched W.

  Args:
    orders: per device, its Tasks in run order (any schedule; without a
      split backward there are no W tasks yet).

  Returns:
    The same orders without per-micro-batch W tasks, each stage's
    ``Task(k, AllMicroBatches(0, M), W)`` right after its last B on its
    device.
  """
  result = []
  for order in orders:
    kept = [t for t in order if t.phase != pipeline_tasks.WEIGHT]
    last_b = {}
    micro_batches = {}
    for i, t in enumerate(kept):
      if t.phase == pipeline_tasks.BACKWARD:
        last_b[t.stage] = i
        micro_batches.setdefault(t.stage, []).append(t.micro_batch)
    new = []
    for i, t in enumerate(kept):
      new.append(t)
      if t.phase == pipeline_tasks.BACKWARD and last_b[t.stage] == i:
        covered = micro_batches[t.stage]
        new.append(Task(t.stage, pipeline_tasks.AllMicroBatches(
            min(covered), len(covered)), pipeline_tasks.WEIGHT))
    result.append(new)
  return result


def ConcatAxis(name, per_micro_batch, whole, num_micro_batches):
  """The axis along which M micro-batch tensors make the whole-batch one.

  Args:
    name: the tensor's name (for the error).
    per_micro_batch: its TensorShape in the micro-batch trace.
    whole: its TensorShape in the whole-batch trace.
    num_micro_batches: M.

  Returns:
    The axis a with whole[a] == M * per_micro_batch[a], all others equal.

  Raises:
    ValueError: no such single axis (a scalar per micro-batch, unknown
      dimensions, a shape that does not scale with the batch).
  """
  if num_micro_batches == 1:
    return 0  # One micro-batch: nothing to stack.
  known = (per_micro_batch.is_fully_defined() and whole.is_fully_defined() and
           per_micro_batch.rank == whole.rank)
  axes = []
  if known:
    mb, full = per_micro_batch.as_list(), whole.as_list()
    axes = [a for a in range(len(mb)) if mb[a] != full[a]]
    if len(axes) == 1 and full[axes[0]] != num_micro_batches * mb[axes[0]]:
      axes = []
  if len(axes) != 1:
    raise ValueError(
        'the weight gradient reads %s (shape %s per micro-batch, %s for the '
        'whole batch), which is not %d micro-batches stacked along one axis: '
        'its weight gradients cannot be computed for all micro-batches at '
        'once. Set batched_weight_gradients=False' %
        (name, per_micro_batch, whole, num_micro_batches))
  return axes[0]
