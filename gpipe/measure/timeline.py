"""The measured pipeline timeline, from TensorFlow execution traces.

Run a training step with ``RunOptions(trace_level=FULL_TRACE)`` and pass its
``RunMetadata.step_stats`` to ``ParseStepStats``: every stage task is one call
op named by ``gpipe.schedules.pipeline_tasks.OpScope`` (``stage<k>_F<m>``
forward, ``.../stage<k>_B<m>`` backward, ``.../stage<k>_W<m>`` weight
gradient of a split backward, ``.../stage<k>_D<m>`` a step of pipelined
decoding on lane m, once per step), so its device, start and end are in the
trace. The ops inside a re-materializing backward call are traced too: those
under the ``recompute/`` name scope are the recomputed forward pass.

From the tasks: per-stage busy time, the measured bubble (idle) fraction of
each stage over the pipeline's span, a PNG of stages x time with forward,
recompute, backward and weight-gradient tasks in different colours, and a trace file for Perfetto
(ui.perfetto.dev) or chrome://tracing to zoom into (`WriteChromeTrace`).
"""

import collections
import io
import json

from gpipe.schedules import pipeline_tasks

TaskTime = collections.namedtuple(
    'TaskTime',
    ['stage', 'micro_batch', 'phase', 'device', 'start', 'end',
     'recompute_end'])



_RECOMPUTE_PREFIX = pipeline_tasks.RECOMPUTE_SCOPE + '/'


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
      task = pipeline_tasks.ParseOpName(node.node_name)
      if task is None:
        pending.append((start, end, node.node_name))
        continue
      phase = task.phase
      recompute_end = start
      if phase == pipeline_tasks.BACKWARD:
        # A re-materializing backward first recomputes the forward pass,
        # under the name scope "recompute/" (see gpipe.stage).
        recomputed = [
            t_end for t, t_end, name in pending
            if start <= t <= end and name.startswith(_RECOMPUTE_PREFIX)
        ]
        if recomputed:
          recompute_end = max(recomputed)
      pending = []
      raw.append((task.stage, task.micro_batch, phase, dev.device,
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


def Devices(tasks):
  """The devices of the tasks, in order of their first stage."""
  first = {}
  for t in tasks:
    first[t.device] = min(first.get(t.device, t.stage), t.stage)
  return sorted(first, key=first.get)


def _Lane(tasks, by):
  """(number of lanes, task -> lane index) for lanes per stage or device."""
  if by == 'stage':
    return NumStages(tasks), lambda t: t.stage
  if by == 'device':
    index = {d: i for i, d in enumerate(Devices(tasks))}
    return len(index), lambda t: index[t.device]
  raise ValueError("lanes are by 'stage' or 'device', not %r" % by)


def StageBusySeconds(tasks, by='stage'):
  """Seconds each stage (or device, with by='device') spent in its tasks."""
  num, lane = _Lane(tasks, by)
  return [
      _Union([(t.start, t.end) for t in tasks if lane(t) == k])
      for k in range(num)
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


def BubbleFractions(tasks, by='stage'):
  """Measured idle fraction of each stage (or device) over the span."""
  span = Span(tasks)
  return [1.0 - busy / span for busy in StageBusySeconds(tasks, by)]


COLORS = {'F': '#4C72B0', 'R': '#8C8C8C', 'B': '#DD8452', 'W': '#55A868',
          'D': '#8172B3'}


def RenderPNG(tasks, title='', path=None, by='stage'):
  """Draws stages x time; returns the PNG bytes (and writes `path` if given).

  Args:
    tasks: TaskTimes from ParseStepStats.
    title: the figure title.
    path: optional file to write.
    by: one lane per 'stage', or per 'device' (several stages per device:
      each task is labelled stage:micro-batch).

  Returns:
    The PNG as bytes.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.patches import Patch  # pylint: disable=g-import-not-at-top
  num_lanes, lane = _Lane(tasks, by)
  fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * num_lanes))
  scale = 1e3  # milliseconds
  for t in tasks:
    y = num_lanes - 1 - lane(t)
    if t.phase != 'B':
      spans = [(t.start, t.end, t.phase)]
    else:
      spans = [(t.start, t.recompute_end, 'R'), (t.recompute_end, t.end, 'B')]
    for start, end, kind in spans:
      if end > start:
        ax.broken_barh([(start * scale, (end - start) * scale)], (y - 0.4, 0.8),
                       facecolors=COLORS[kind], edgecolor='white',
                       linewidth=0.5)
    if (t.end - t.start) * scale > 0:
      ax.text((t.start + t.end) / 2 * scale, y,
              pipeline_tasks.MicroBatchName(t.micro_batch) if by == 'stage'
              else '%d:%s' % (t.stage,
                              pipeline_tasks.MicroBatchName(t.micro_batch)),
              ha='center', va='center', fontsize=7 if by == 'stage' else 5,
              color='white')
  ax.set_yticks(range(num_lanes))
  ax.set_yticklabels(['%s %d' % (by, k) for k in reversed(range(num_lanes))])
  ax.set_xlabel('time (ms)')
  bubbles = BubbleFractions(tasks, by) if tasks else []
  ax.set_title(title + ('  bubble per %s: ' % by + ', '.join(
      '%.0f%%' % (100 * b) for b in bubbles) if bubbles else ''))
  handles = [
      Patch(color=COLORS['F'], label='forward'),
      Patch(color=COLORS['R'], label='recompute'),
      Patch(color=COLORS['B'], label='backward'),
      Patch(color=COLORS['W'], label='weight gradient'),
  ]
  if any(t.phase == pipeline_tasks.DECODE for t in tasks):
    handles.append(Patch(color=COLORS['D'], label='decode step (lane)'))
  ax.legend(handles=handles, loc='upper right', fontsize=7,
            ncol=len(handles))
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=100)
  plt.close(fig)
  data = buf.getvalue()
  if path:
    with open(path, 'wb') as f:
      f.write(data)
  return data


def _JsonMicroBatch(micro_batch):
  """A task's micro-batch in a trace's args: its index, or '*' for all."""
  return pipeline_tasks.MicroBatchName(micro_batch) if pipeline_tasks.IsAll(
      micro_batch) else micro_batch


def ChromeTrace(tasks, step=None):
  """The tasks as a Trace Event Format dict, for Perfetto / chrome://tracing.

  One process per device (in `Devices` order) and one thread per stage in it;
  each task is a complete event named by its phase and micro-batch (``F3``,
  ``B3``). A task that begins with a recomputed forward pass holds a nested
  ``recompute`` slice over that part.

  Args:
    tasks: TaskTimes (e.g. from ParseStepStats), times in seconds.
    step: optional training step, recorded in ``otherData``.

  Returns:
    ``{'traceEvents': [...], 'displayTimeUnit': 'ms'}`` (plus ``otherData``
    with the step when given); ``ts``/``dur`` are in microseconds. The device
    of pid k is ``Devices(tasks)[k - 1]``; the thread id of stage s is s + 1.
  """
  # Ids start at 1: Perfetto treats pid 0 as the Linux idle process, and some
  # of its versions merge thread 0 into thread 1.
  pids = {device: k + 1 for k, device in enumerate(Devices(tasks))}

  def _Micros(seconds):
    # Tasks are parsed from whole microseconds; rounding hides the float error
    # of the seconds round trip.
    return round(seconds * 1e6, 3)

  meta = []
  for device, pid in pids.items():
    meta.append({'ph': 'M', 'name': 'process_name', 'pid': pid, 'tid': 0,
                 'args': {'name': device}})
    meta.append({'ph': 'M', 'name': 'process_sort_index', 'pid': pid,
                 'tid': 0, 'args': {'sort_index': pid}})
  threads = sorted({(pids[t.device], t.stage) for t in tasks})
  for pid, stage_id in threads:
    meta.append({'ph': 'M', 'name': 'thread_name', 'pid': pid,
                 'tid': stage_id + 1, 'args': {'name': 'stage %d' % stage_id}})
    meta.append({'ph': 'M', 'name': 'thread_sort_index', 'pid': pid,
                 'tid': stage_id + 1, 'args': {'sort_index': stage_id}})
  events = []
  for t in sorted(tasks, key=lambda t: (t.start, t.stage)):
    where = {'pid': pids[t.device], 'tid': t.stage + 1}
    events.append(dict(
        where, ph='X',
        name=t.phase + pipeline_tasks.MicroBatchName(t.micro_batch),
        cat=t.phase,
        ts=_Micros(t.start), dur=_Micros(t.end - t.start),
        args={'stage': t.stage,
              'micro_batch': _JsonMicroBatch(t.micro_batch),
              'phase': t.phase}))
    if t.recompute_end > t.start:
      # Listed after its task with the same start, so viewers nest it inside.
      events.append(dict(
          where, ph='X', name='recompute', cat='recompute',
          ts=_Micros(t.start), dur=_Micros(t.recompute_end - t.start),
          args={'stage': t.stage,
                'micro_batch': _JsonMicroBatch(t.micro_batch),
                'phase': t.phase}))
  trace = {'traceEvents': meta + events, 'displayTimeUnit': 'ms'}
  if step is not None:
    trace['otherData'] = {'step': step}
  return trace


def WriteChromeTrace(tasks, path, step=None):
  """Writes `ChromeTrace(tasks, step)` to `path` as JSON; returns the dict.

  Open the file in ui.perfetto.dev or chrome://tracing.
  """
  trace = ChromeTrace(tasks, step)
  with open(path, 'w') as f:
    json.dump(trace, f)
  return trace


def ReadChromeTrace(path):
  """The TaskTimes of a trace file written by ``WriteChromeTrace``.

  Devices come from its process names; the recompute slices are folded back
  into their tasks' ``recompute_end``; a task of all micro-batches (a
  batched W) keeps its micro-batch as the file's text ('*').

  Args:
    path: the trace file.

  Returns:
    A list of TaskTime sorted by start, times in seconds.
  """
  with open(path) as f:
    trace = json.load(f)
  devices = {}
  for e in trace['traceEvents']:
    if e.get('ph') == 'M' and e.get('name') == 'process_name':
      devices[e['pid']] = e['args']['name']
  recompute = {}
  tasks = []
  for e in trace['traceEvents']:
    if e.get('ph') != 'X':
      continue
    args = e['args']
    start = e['ts'] * 1e-6
    end = start + e['dur'] * 1e-6
    key = (e['pid'], args['stage'], args['micro_batch'], args['phase'],
           start)
    if e.get('cat') == 'recompute':
      recompute[key] = end
      continue
    tasks.append(TaskTime(args['stage'], args['micro_batch'],
                          args['phase'], devices.get(e['pid'], str(e['pid'])),
                          start, end, start))
  out = []
  for t in tasks:
    pid = [p for p, d in devices.items() if d == t.device]
    key = (pid[0] if pid else None, t.stage, t.micro_batch, t.phase, t.start)
    out.append(t._replace(recompute_end=recompute.get(key, t.start)))
  return sorted(out, key=lambda t: (t.start, t.stage))
