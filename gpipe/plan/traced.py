"""What one traced step of the executor says about its tasks.

From the task times of a traced step (``gpipe.measure.timeline``), pure
Python:

* ``PhaseSeconds``: the seconds of each kind of task (F, B, W) summed. How
  the executor splits a stage's work between its tasks: the layers timed on
  their own (``measure``) split it differently, and the split decides which
  work is on the pipeline's critical path (B hands a gradient to the
  previous stage, W fills bubbles).
* ``HandoverDelays``: for each task that waited for a task of another
  device (it started after its device's previous task ended), how long
  after that task's end it started: the hand-over as a pipeline pays it,
  with the sending device's core already in its next task.
* ``PhaseFactors``: a calibration factor shared out over the phases as the
  trace shares out the time.
"""

import collections

from gpipe.schedules import pipeline_tasks


def PhaseSeconds(tasks):
  """{phase: summed seconds} of timeline.TaskTime-like records."""
  out = collections.defaultdict(float)
  for t in tasks:
    out[t.phase] += t.end - t.start
  return dict(out)


def HandoverDelays(tasks, per_micro_batch_loss=True):
  """Seconds from a task of another device's end to the start of its reader.

  Args:
    tasks: timeline.TaskTime-like records of one step (stage, micro_batch,
      phase, device, start, end).
    per_micro_batch_loss: as ``pipeline_tasks.Dependencies``.

  Returns:
    A list of seconds, one per task whose last input came from another
    device and ended after the task's device finished its previous task
    (so the task waited for the hand-over).
  """
  if not tasks:
    return []
  by_key = {pipeline_tasks.Task(t.stage, t.micro_batch, t.phase): t
            for t in tasks}
  num_stages = max(t.stage for t in tasks) + 1
  num_micro_batches = 1 + max(
      t.micro_batch for t in tasks
      if not pipeline_tasks.IsAll(t.micro_batch))
  lanes = collections.defaultdict(list)
  for t in tasks:
    lanes[t.device].append(t)
  delays = []
  for lane in lanes.values():
    lane.sort(key=lambda t: t.start)
    previous_end = float('-inf')
    for t in lane:
      deps = [by_key[d] for d in pipeline_tasks.Dependencies(
          pipeline_tasks.Task(t.stage, t.micro_batch, t.phase), num_stages,
          num_micro_batches, per_micro_batch_loss) if d in by_key]
      if deps:
        last = max(deps, key=lambda d: d.end)
        if last.device != t.device and last.end > previous_end:
          delays.append(t.start - last.end)
      previous_end = t.end
  return delays


def PhaseFactors(scale, traced, predicted):
  """Per-phase factors that share `scale` out as the trace does.

  Args:
    scale: the measured over the predicted time of all the phases together.
    traced: {phase: seconds} of a traced step (``PhaseSeconds``).
    predicted: {phase: seconds} the profile gives the same tasks.

  Returns:
    {phase: factor} for the phases of `predicted`, such that the factors
    times `predicted` sum to `scale` times its sum and split it in the
    traced proportions (each `scale` where the trace lacks a phase).
  """
  phases = [p for p in predicted if predicted[p] > 0]
  traced_total = sum(traced.get(p, 0.0) for p in phases)
  if not phases or any(traced.get(p, 0.0) <= 0 for p in phases):
    return {p: scale for p in predicted}
  total = sum(predicted[p] for p in phases)
  out = {p: scale for p in predicted}
  for p in phases:
    out[p] = scale * traced[p] / traced_total * total / predicted[p]
  return out
