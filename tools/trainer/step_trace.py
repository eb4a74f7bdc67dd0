"""What one traced training step measured: stage times, bubbles, memory.

Every N steps the trainer runs a step with a full trace. From its
``RunMetadata.step_stats``: the pipeline's stage tasks (``gpipe.measure.timeline``),
each stage's busy seconds and measured bubble fraction, the timeline image
(and a trace file for Perfetto / chrome://tracing, written by the loop),
and the peak memory of each device (``gpipe.measure.memory``): ``peak_bytes`` is
what the step's own ops held at once (activations, gradients, temporaries),
``allocator_peak_bytes`` what the device's allocator held (with variables;
virtual CPUs of one process share one allocator and all see its total;
written only where the allocator counts bytes: GPUs, TPUs, and CPUs when
``TF_CPU_ALLOCATOR_USE_BFC=true`` is set for the trainer's processes).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.measure import memory
from gpipe.measure import timeline


def _ShortDevice(name):
  """'/job:worker/replica:0/task:1/device:CPU:0' -> 'worker_1_CPU_0'."""
  parts = dict(
      p.split(':', 1) for p in name.strip('/').split('/') if ':' in p)
  device = parts.get('device', name).replace(':', '_')
  return '%s_%s_%s' % (parts.get('job', 'local'), parts.get('task', '0'),
                       device)


def Measure(run_metadata, title=''):
  """Scalars, the timeline image and the stage tasks of one traced step.

  Args:
    run_metadata: the RunMetadata of a FULL_TRACE session run.
    title: the timeline image's title.

  Returns:
    (scalars, png, tasks): scalars is {summary tag: value}; png is the
    timeline image bytes, or None when the step ran no pipeline stage;
    tasks are its gpipe.measure.timeline.TaskTimes (for a trace file).
  """
  scalars = {}
  try:
    peaks = memory.PeakBytesPerDevice(run_metadata)
    allocator_peaks = memory.PeakAllocatorBytesPerDevice(run_metadata)
  except ValueError:  # No memory records in this trace.
    peaks, allocator_peaks = {}, {}
  for device, peak in sorted(peaks.items()):
    if peak:
      scalars['memory/peak_bytes/' + _ShortDevice(device)] = peak
  for device, peak in sorted(allocator_peaks.items()):
    if peak:
      scalars['memory/allocator_peak_bytes/' + _ShortDevice(device)] = peak
  tasks = timeline.ParseStepStats(run_metadata.step_stats)
  if not tasks:
    return scalars, None, tasks
  busy = timeline.StageBusySeconds(tasks)
  bubbles = timeline.BubbleFractions(tasks)
  recompute = timeline.StageRecomputeSeconds(tasks)
  for k, (b, f, r) in enumerate(zip(busy, bubbles, recompute)):
    scalars['pipeline/stage_%d/compute_sec' % k] = b
    scalars['pipeline/stage_%d/bubble_fraction' % k] = f
    scalars['pipeline/stage_%d/recompute_sec' % k] = r
  scalars['pipeline/bubble_fraction'] = sum(bubbles) / len(bubbles)
  scalars['pipeline/span_sec'] = timeline.Span(tasks)
  return scalars, timeline.RenderPNG(tasks, title=title), tasks
