"""Per-step records and console progress lines of a training run.

``StepLog`` appends one JSON line per step to ``<logdir>/train_steps.jsonl``
(step, loss and the task's other metrics). A resumed run first drops the lines
after the step it restored, so the file always describes the one history
that the checkpoints continue (tests compare it across runs).

``Progress`` formats the console line printed every N steps: step, loss,
examples/s (with data-parallel replicas also per replica) and the estimated
time to max_steps.
"""

import json
import os
import re
import time

STEP_LOG = 'train_steps.jsonl'


class StepLog:
  """JSON lines {"step": s, "loss": ..., "time": t, ...} in train_steps.jsonl.

  ``time`` is the wall clock (seconds since the epoch) when the step's
  record was written: examples/s over a run, across restarts and moves, for
  plots (``python -m tools.benchmark elastic``).
  """

  def __init__(self, logdir, resume_step=0):
    """Opens the log, keeping only lines with step <= resume_step.

    Args:
      logdir: the run's directory.
      resume_step: the restored global step (0 for a fresh run).
    """
    self.path = os.path.join(logdir, STEP_LOG)
    kept = [r for r in ReadStepLog(self.path) if r['step'] <= resume_step]
    with open(self.path, 'w') as f:
      for record in kept:
        f.write(json.dumps(record) + '\n')
    self._file = open(self.path, 'a')

  def Append(self, step, metrics):
    """Writes one step's {name: float} metrics (flushed at once)."""
    record = {'step': int(step)}
    record.update({k: float(v) for k, v in sorted(metrics.items())})
    record['time'] = round(time.time(), 3)
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()

  def Close(self):
    self._file.close()


def ReadStepLog(path):
  """The records of a step log (a list of dicts; [] if there is none)."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          records.append(json.loads(line))
        except ValueError:
          break  # A line cut short by a killed process ends the log.
  return records


_PROGRESS = re.compile(r'^step (\d+)/\d+ .* ([\d.]+) examples/s', re.M)


def StepSeconds(output, batch, warmup=0):
  """Per-step seconds from the progress lines of a run logged every step.

  Args:
    output: the trainer's console text (``--log_every_n_steps=1``).
    batch: examples per step.
    warmup: leading steps to leave out.

  Returns:
    The seconds of each step after `warmup`, in step order.
  """
  return [batch / float(rate) for step, rate in _PROGRESS.findall(output)
          if int(step) > warmup and float(rate) > 0]


def FormatSeconds(seconds):
  """'1h02m03s', '2m05s' or '7s'."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  if hours:
    return '%dh%02dm%02ds' % (hours, minutes, secs)
  if minutes:
    return '%dm%02ds' % (minutes, secs)
  return '%ds' % secs


class Progress:
  """Throughput over the last interval and the ETA to max_steps."""

  def __init__(self, start_step, max_steps, clock=time.time, replicas=1):
    """Starts the first interval.

    Args:
      start_step: the global step the run starts from.
      max_steps: the step it trains to.
      clock: returns the time in seconds.
      replicas: R data-parallel replicas: the line also gives examples/s
        per replica (each takes 1/R of every mini-batch).
    """
    self._clock = clock
    self._replicas = replicas
    self._max_steps = max_steps
    self._last_step = start_step
    self._last_time = clock()
    self._examples = 0

  @property
  def last_step(self):
    """The step the current interval started after."""
    return self._last_step

  def Count(self, num_examples):
    """Adds the examples of one finished step."""
    self._examples += num_examples

  def Line(self, step, metrics):
    """The progress line at `step`; restarts the interval.

    Args:
      step: the global step after the last update.
      metrics: {name: value}; 'loss' first, then the others.

    Returns:
      (line, examples per second over the interval).
    """
    now = self._clock()
    elapsed = max(now - self._last_time, 1e-9)
    steps = max(step - self._last_step, 1)
    rate = self._examples / elapsed
    eta = (self._max_steps - step) * elapsed / steps
    shown = ['loss %.4f' % metrics['loss']] + [
        '%s %.4g' % (k, v) for k, v in sorted(metrics.items()) if k != 'loss'
    ]
    speed = '%.1f examples/s' % rate
    if self._replicas > 1:
      speed += ' (%.1f per replica x %d)' % (rate / self._replicas,
                                             self._replicas)
    line = 'step %d/%d  %s  %s  ETA %s' % (
        step, self._max_steps, '  '.join(shown), speed, FormatSeconds(eta))
    self._last_step, self._last_time, self._examples = step, now, 0
    return line, rate
