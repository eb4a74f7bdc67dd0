"""A few timed steps of the trainer binary on a plan, in a child process.

The planner times its reference configurations this way
(``tools/plan/trainer_step.py``) and the plan benchmark the configurations it
checks (``tools/benchmark/plan_trainer.py``): the trainer itself, on the
pinned local worker processes the planner's figures are for, logging every
few steps as a run does, its checkpoints out of the way.
"""

import glob
import os
import subprocess
import sys

from gpipe.measure import timeline
from gpipe.runtime import child_env
from tools.trainer import progress

# Steps between progress lines: each line's examples/s gives its interval's
# mean step, with the console, step-log and TensorBoard flushes a run pays.
LOG_EVERY = 4

# The repository: the children's working directory and path.
ROOT = child_env.ROOT


def Environment():
  """This process's environment with the repository on PYTHONPATH."""
  return child_env.Environment()


class TimedRunError(RuntimeError):
  """The trainer failed or printed no step times; the text says why."""


def StepSeconds(model, plan_path, workers, batch, warmup, steps, logdir,
                override='', timeout=None):
  """The mean step (seconds) of each logged interval after `warmup` steps.

  No step is traced (``TracedStepSeconds`` traces one).

  Args:
    model: the registered model.
    plan_path: a plan file (``--plan=FILE``) for `workers` devices.
    workers: local worker processes, pinned one per core.
    batch: examples per step.
    warmup: steps left out (a multiple of ``LOG_EVERY`` keeps intervals
      whole).
    steps: steps timed after them.
    logdir: the run's directory.
    override: --model_params_override text.
    timeout: seconds the trainer may take, or None.

  Returns:
    A list of seconds, one per logged interval.

  Raises:
    TimedRunError: the trainer timed out, failed or printed no step times
      (with its last line).
  """
  return _Run(model, plan_path, workers, batch, warmup, steps, logdir,
              override, timeout, trace=False)


def TracedStepSeconds(model, plan_path, workers, batch, warmup, steps,
                      logdir, override='', timeout=None):
  """``StepSeconds``, and the stage tasks of the run's second step, traced.

  The trainer traces its second step (``--trace_every_n_steps`` beyond the
  run's end: no other), which lies in the `warmup` steps (at least 2) left
  out of the timed intervals.

  Returns:
    (seconds per logged interval, that step's timeline.TaskTimes: empty
    when it ran no pipeline stage).

  Raises:
    TimedRunError: as ``StepSeconds``, or `warmup` < 2.
  """
  if warmup < 2:
    raise TimedRunError('the traced step is the second: warm up for at '
                        'least 2 steps, not %d' % warmup)
  seconds = _Run(model, plan_path, workers, batch, warmup, steps, logdir,
                 override, timeout, trace=True)
  paths = sorted(glob.glob(os.path.join(logdir, '**', '*.trace.json'),
                          recursive=True))
  return seconds, timeline.ReadChromeTrace(paths[0]) if paths else []


def _Run(model, plan_path, workers, batch, warmup, steps, logdir, override,
         timeout, trace):
  """The trainer's logged intervals (see ``StepSeconds``)."""
  total = warmup + steps
  args = [sys.executable, '-m', 'tools.trainer', '--model=' + model,
          '--logdir=' + logdir, '--plan=' + plan_path,
          '--worker_processes=%d' % workers, '--pin_cores',
          '--max_steps=%d' % total, '--log_every_n_steps=%d' % LOG_EVERY,
          '--checkpoint_every_n_steps=%d' % (10 * total),
          '--trace_every_n_steps=%d' % (10 * total if trace else 0),
          '--eval_after_train=false']
  if override:
    args.append('--model_params_override=' + override)
  try:
    done = subprocess.run(args, cwd=ROOT, env=Environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout,
                          check=False)
  except subprocess.TimeoutExpired as e:
    raise TimedRunError('the trainer did not finish %d steps with %s in %d s'
                        % (total, plan_path, timeout)) from e
  seconds = progress.StepSeconds(done.stdout, batch, warmup)
  if done.returncode or not seconds:
    lines = [l for l in done.stdout.splitlines() if l.strip()]
    raise TimedRunError('the trainer failed with %s (exit status %d): %s' % (
        plan_path, done.returncode, lines[-1] if lines else 'no output'))
  return seconds
