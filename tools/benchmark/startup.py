"""The startup subcommand: where a pipelined trainer's start-up goes.

Runs ``python -m tools.trainer`` for two steps of a registered model on local
worker processes, once per variant, one after another on the same machine
state, and reports each start-up phase the trainer logged
(``tools/trainer/startup.py``: imports and workers, layers and variables,
the forward graph with its stage tracing, ``tf.gradients``, the learner and
its optimizer update, the session, variable initialization, step 1 (the
master's graph optimization and partitioning, the workers' function
instantiation and the step) and step 2), the time from the trainer's start
to the end of step 1, the trainer's peak memory and worker 0's (the
session's master, which holds the partitioned graph of every worker), the
training graph's size and the first steps' losses, which every variant must
share.

Two runs, side by side: ``after`` is this checkout; ``before`` (with
``--before=DIR``) is the same command in another checkout (e.g. ``git worktree
add DIR <commit>``), with ``--before_env`` (e.g. ``PYTHONPATH=DIR`` to put
another package set first). Every figure that
an older trainer does not log is measured from outside: the time from the
trainer's start to its step-1 progress line, the trainer's peak resident
memory (``VmHWM``, read until it exits), the workers' peaks it prints and the
losses it writes.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from gpipe.measure import memory
from tools.benchmark import report

PEAKS = re.compile(r'worker peak memory \(VmHWM\): (.*)')
PEAK_ITEM = re.compile(r'(\d+): ([\d.]+) MiB')
# The trainer's progress line of a step: "step 1/2 ...".
STEP_LINE = re.compile(r'^step (\d+)/')


def _MiB(num_bytes):
  """A cell of a column titled in MiB."""
  return memory.FormatMiB(num_bytes, missing='-', unit='')


def _PeakOf(pid):
  """VmHWM bytes of a running process (0 once it is gone)."""
  try:
    with open('/proc/%d/status' % pid) as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def RunTrainer(args, checkout, env, logdir):
  """Runs the trainer of `checkout` for two steps, measured from outside.

  Args:
    args: the parsed flags (model, worker_processes, timeouts).
    checkout: the repository whose ``tools.trainer`` runs.
    env: extra environment variables.
    logdir: the run's directory.

  Returns:
    A dict: seconds to the step-1 and step-2 lines, the trainer's peak
    memory, the workers' peaks, the losses and startup.json if written.

  Raises:
    RuntimeError: the trainer failed (its last lines in the message).
  """
  command = [
      sys.executable, '-m', 'tools.trainer', '--model=%s' % args.model,
      '--logdir=%s' % logdir, '--max_steps=2', '--log_every_n_steps=1',
      '--eval_after_train=false', '--trace_every_n_steps=0',
      '--step_timeout_secs=%d' % args.step_timeout_secs
  ]
  if args.worker_processes:
    command.append('--worker_processes=%d' % args.worker_processes)
  report.Log('startup: %s (in %s%s)' % (
      ' '.join(command[1:]), checkout,
      ''.join(' %s=%s' % kv for kv in sorted(env.items()))))
  started = time.time()
  proc = subprocess.Popen(command, cwd=checkout, env=dict(os.environ, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  peak = [0]
  done = threading.Event()

  def Watch():
    while not done.wait(0.2):
      peak[0] = max(peak[0], _PeakOf(proc.pid))

  watcher = threading.Thread(target=Watch, daemon=True)
  watcher.start()
  lines, step_seconds, workers = [], {}, []
  timer = threading.Timer(args.timeout_secs, proc.kill)
  timer.start()
  try:
    for line in proc.stdout:
      lines.append(line.rstrip('\n'))
      found = STEP_LINE.match(line)
      if found:
        step_seconds[int(found.group(1))] = time.time() - started
        peak[0] = max(peak[0], _PeakOf(proc.pid))
      found = PEAKS.search(line)
      if found:
        workers = [float(mib) * 2**20
                   for _, mib in PEAK_ITEM.findall(found.group(1))]
    code = proc.wait()
  finally:
    timer.cancel()
    done.set()
    watcher.join()
  if code != 0 or 1 not in step_seconds:
    raise RuntimeError('the trainer in %s failed (exit code %s); its last '
                       'lines:\n%s' % (checkout, code, '\n'.join(lines[-30:])))
  losses = []
  with open(os.path.join(logdir, 'train_steps.jsonl')) as f:
    for line in f:
      losses.append(json.loads(line)['loss'])
  path = os.path.join(logdir, 'startup.json')
  startup = None
  if os.path.exists(path):
    with open(path) as f:
      startup = json.load(f)
  return dict(checkout=checkout, env=env, to_step_1=step_seconds[1],
              to_step_2=step_seconds.get(2), trainer_peak_bytes=peak[0],
              worker_peak_bytes=workers, losses=losses, startup=startup)


def _ParseEnv(text):
  env = {}
  for item in filter(None, text.split(',')):
    key, eq, value = item.partition('=')
    if not eq:
      raise ValueError('--before_env item %r: give NAME=VALUE' % item)
    env[key] = value
  return env


def Startup(args):
  """Start-up phases of a pipelined trainer: wall time and memory each."""
  here = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  runs_wanted = []
  if args.before:
    if not os.path.isdir(os.path.join(args.before, 'tools', 'trainer')):
      raise ValueError('--before=%s: not a checkout of this project (no '
                       'tools/trainer in it)' % args.before)
    runs_wanted.append(('before', args.before, _ParseEnv(args.before_env)))
  runs_wanted.append(('after', here, {}))
  settings = dict(model=args.model, worker_processes=args.worker_processes,
                  runs={name: dict(checkout=c, env=e)
                        for name, c, e in runs_wanted})
  header, info = report.Header('Start-up', settings)
  result = dict(machine=info, settings=settings, runs=[])
  for name, checkout, env in runs_wanted:
    run = RunTrainer(args, checkout, env, tempfile.mkdtemp(prefix='startup_'))
    run['name'] = name
    report.Log('startup %s: step 1 done %.1f s after the start, trainer peak '
               '%s MiB' % (name, run['to_step_1'],
                           _MiB(run['trainer_peak_bytes'])))
    result['runs'].append(run)
  runs = result['runs']
  names = [r['name'] for r in runs]
  phases = []
  for run in runs:
    for row in (run['startup'] or {}).get('phases', []):
      if row['phase'] not in phases:
        phases.append(row['phase'])
  rows = []
  for phase in phases:
    cells = []
    for run in runs:
      by_name = {r['phase']: r for r in (run['startup'] or {}).get(
          'phases', [])}
      cells.append('%.1f' % by_name[phase]['seconds']
                   if phase in by_name else '-')
    rows.append([phase] + cells)
  rows.append(['**trainer start to end of step 1 (s)**'] +
              ['**%.1f**' % r['to_step_1'] for r in runs])
  rows.append(['step 2 (s)'] + [
      '%.1f' % (r['to_step_2'] - r['to_step_1']) if r['to_step_2'] else '-'
      for r in runs])
  rows.append(['**trainer peak memory (MiB)**'] +
              ['**%s**' % _MiB(r['trainer_peak_bytes']) for r in runs])
  rows.append(['worker 0 peak memory (MiB; the session master)'] + [
      _MiB(r['worker_peak_bytes'][0]) if r['worker_peak_bytes'] else '-'
      for r in runs])
  rows.append(['other workers peak memory (MiB, largest)'] + [
      _MiB(max(r['worker_peak_bytes'][1:]))
      if len(r['worker_peak_bytes']) > 1 else '-' for r in runs])
  rows.append(['ops of the training graph (outside functions)'] + [
      str((r['startup'] or {}).get('graph_ops', '-')) for r in runs])
  rows.append(['losses of steps 1, 2'] + [
      ', '.join('%.6f' % l for l in r['losses']) for r in runs])
  text = header + '\n' + report.Table(['phase (s)'] + names, rows)
  if len(runs) == 2:
    a, b = runs
    text += ('\n\nafter / before: trainer start to end of step 1 %.2fx, '
             'trainer peak memory %.2fx' % (
                 b['to_step_1'] / a['to_step_1'],
                 b['trainer_peak_bytes'] / max(a['trainer_peak_bytes'], 1)))
    if a['worker_peak_bytes'] and b['worker_peak_bytes']:
      text += ', worker 0 peak memory %.2fx' % (
          b['worker_peak_bytes'][0] / a['worker_peak_bytes'][0])
    result['same_losses'] = a['losses'] == b['losses']
    text += '; same losses: %s' % ('yes' if result['same_losses'] else 'NO')
  print(text)
  result['markdown'] = text
  report.Write(args, result, None)
  return result
