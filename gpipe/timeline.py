"""The measured pipeline timeline, from TensorFlow execution traces.

Run a training step with ``RunOptions(trace_level=FULL_TRACE)`` and pass its
``RunMetadata.step_stats`` to ``ParseStepStats``: every stage task is one call
op named ``stage<k>_F<m>`` (forward) or ``.../stage<k>_B<m>`` (backward), so
its device, start and end are in the trace. The ops inside a re-materializing
backward call are traced too: those under the ``recompute/`` name scope are
the recomputed forward pass.

From the tasks: per-stage busy time, the measured bubble (idle) fraction of
each stage over the pipeline's span, and a PNG of stages x time with
forward, recompute and backward in different colours.
"""

import collections
import io
import re

from gpipe import stage

TaskTime = collections.namedtuple(
    'TaskTime',
    ['stage', 'micro_batch', 'phase', 'device', 'start', 'end',
     'recompute_end'])

_CALL = re.compile(r'(?:^|/)stage(\d+)_([FB])(\d+)/(?:Stateful)?PartitionedCall$')


_RECOMPUTE_PREFIX = stage.RECOMPUTE_SCOPE + '/'


def ParseStepStats(step_stats):
  """The stage tasks of one traced step, times in seconds from its start.

  Args:
    step_stats: a ``tf.compat.v1.RunMetadata().step_stats``.

  Returns:
    A list of TaskTime sorted by start; ``recompute_end`` is the end of the
    recomputed forward inside a backward task (== start when none).
  """
  raw = []
  for dev in step_stats.dev_stats:
    # A call's inner ops are traced just before the call itself.
    pending = []
    for node in dev.node_stats:
      start = node.all_start_micros
      end = start + max(node.all_end_rel_micros, 1)
      match = _CALL.search(node.node_name)
      if not match:
        pending.append((start, end, node.node_name))
        continue
      phase = match.group(2)
      recompute_end = start
      if phase == 'B':
        # A re-materializing backward first recomputes the forward pass,
        # under the name scope "recompute/" (see gpipe.stage).
        recomputed = [
            t_end for t, t_end, name in pending
            if start <= t <= end and name.startswith(_RECOMPUTE_PREFIX)
        ]
        if recomputed:
          recompute_end = max(recomputed)
      pending = []
      raw.append((int(match.group(1)), int(match.group(3)), phase, dev.device,
                  start, end, recompute_end))
  if not raw:
    return []
  origin = min(r[4] for r in raw)
  tasks = []
  for stage, mb, phase, device, start, end, recompute_end in raw:
    tasks.append(
        TaskTime(stage, mb, phase, device, (start - origin) * 1e-6,
                 (end - origin) * 1e-6, (recompute_end - origin) * 1e-6))
  return sorted(tasks, key=lambda t: (t.start, t.stage))


def NumStages(tasks):
  return max(t.stage for t in tasks) + 1 if tasks else 0


def _Union(intervals):
  total, cur_start, cur_end = 0.0, None, None
  for start, end in sorted(intervals):
    if cur_end is None or start > cur_end:
      if cur_end is not None:
        total += cur_end - cur_start
      cur_start, cur_end = start, end
    else:
      cur_end = max(cur_end, end)
  if cur_end is not None:
    total += cur_end - cur_start
  return total


def StageBusySeconds(tasks):
  """Seconds each stage spent inside its tasks."""
  return [
      _Union([(t.start, t.end) for t in tasks if t.stage == k])
      for k in range(NumStages(tasks))
  ]


def StageRecomputeSeconds(tasks):
  """Seconds each stage spent recomputing forward passes."""
  out = [0.0] * NumStages(tasks)
  for t in tasks:
    out[t.stage] += t.recompute_end - t.start
  return out


def Span(tasks):
  """Seconds from the first task's start to the last task's end."""
  return max(t.end for t in tasks) - min(t.start for t in tasks)


def BubbleFractions(tasks):
  """Measured idle fraction of each stage over the pipeline's span."""
  span = Span(tasks)
  return [1.0 - busy / span for busy in StageBusySeconds(tasks)]


COLORS = {'F': '#4C72B0', 'R': '#8C8C8C', 'B': '#DD8452'}


def RenderPNG(tasks, title='', path=None):
  """Draws stages x time; returns the PNG bytes (and writes `path` if given).

  Args:
    tasks: TaskTimes from ParseStepStats.
    title: the figure title.
    path: optional file to write.

  Returns:
    The PNG as bytes.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.patches import Patch  # pylint: disable=g-import-not-at-top
  num_stages = NumStages(tasks)
  fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * num_stages))
  scale = 1e3  # milliseconds
  for t in tasks:
    y = num_stages - 1 - t.stage
    if t.phase == 'F':
      spans = [(t.start, t.end, 'F')]
    else:
      spans = [(t.start, t.recompute_end, 'R'), (t.recompute_end, t.end, 'B')]
    for start, end, kind in spans:
      if end > start:
        ax.broken_barh([(start * scale, (end - start) * scale)], (y - 0.4, 0.8),
                       facecolors=COLORS[kind], edgecolor='white',
                       linewidth=0.5)
    if (t.end - t.start) * scale > 0:
      ax.text((t.start + t.end) / 2 * scale, y, str(t.micro_batch),
              ha='center', va='center', fontsize=7, color='white')
  ax.set_yticks(range(num_stages))
  ax.set_yticklabels(['stage %d' % k for k in reversed(range(num_stages))])
  ax.set_xlabel('time (ms)')
  bubbles = BubbleFractions(tasks) if tasks else []
  ax.set_title(title + ('  bubble per stage: ' + ', '.join(
      '%.0f%%' % (100 * b) for b in bubbles) if bubbles else ''))
  ax.legend(handles=[
      Patch(color=COLORS['F'], label='forward'),
      Patch(color=COLORS['R'], label='recompute'),
      Patch(color=COLORS['B'], label='backward')
  ], loc='upper right', fontsize=7, ncol=3)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=100)
  plt.close(fig)
  data = buf.getvalue()
  if path:
    with open(path, 'wb') as f:
      f.write(data)
  return data
