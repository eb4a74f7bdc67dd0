"""What the trainer's step adds to the pipeline's, measured through the trainer.

The profile predicts the pipeline's own step: the stages' tasks, their
hand-overs and the optimizer's update of their variables. The trainer's step
does more: it reads the next batch from the task's input pipeline, runs
Lingvo's learner (a global gradient norm, a NaN/Inf check and a scale over
every gradient before the optimizer's update), fetches the metrics, and its
client process shares the machine's cores with the workers. On this machine
kind that was half the step again for small models (a plan predicted 352
examples/s where the trainer ran 236).

``Measure`` runs the trainer binary itself (``python -m tools.trainer
--plan=FILE``, with the pinned worker processes the planner's figures are
for) for a few steps of two reference configurations (``References``):

* data-parallel: the whole model as one stage, one micro-batch, a replica
  per device: every device computes, the client competes with all of them,
  and replica 0's device applies the update of every variable;
* pipelined: the model cut over the devices (R=1, K=N, M=N, 'gpipe'): the
  update is spread over them.

``Fit`` solves for the two unknowns that make the profile's predictions of
both equal the trainer's steps: a fixed cost of each step
(``trainer_seconds``: input, metrics, the client) and a factor on the
update's time (``update_factor``: Lingvo's learner on each device's
variables, after every gradient is complete). With one device, or a model
with fewer layers than devices, only the first reference runs and the
update keeps its modelled time.
"""
import contextlib
import os
import shutil
import statistics
import tempfile

from gpipe.plan import choice
from gpipe.plan import search
from gpipe.plan import simulator
from tools.trainer import timed_run

# Steps run before the timed ones (graph optimization, first allocations),
# and the timed ones, in intervals of timed_run.LOG_EVERY steps (the median
# of the intervals' mean steps).
WARMUP_STEPS = 4
# The largest factor on the update's modelled time ``Fit`` gives.
MAX_UPDATE_FACTOR = 10.0
TIMED_STEPS = 12

class TrainerStepError(RuntimeError):
  """The trainer's reference run failed; the text has its last output."""


def References(profile, devices):
  """The configurations ``Measure`` runs (see the module docstring).

  Args:
    profile: the model's profile.Profile.
    devices: the devices of the run being planned.

  Returns:
    A list of simulator.Configurations: data-parallel (R = the devices when
    the batch splits evenly over them, else R = 1 on one device), then, when
    the model has a layer per device and the batch splits into N
    micro-batches, pipelined over the devices.
  """
  n = max(devices, 1)
  replicas = n if profile.batch % n == 0 else 1
  found = [simulator.Configuration(replicas, 1, (profile.num_layers,), 1,
                                   'gpipe', 'never')]
  if n > 1 and profile.num_layers >= n and profile.batch % n == 0:
    found.append(simulator.Configuration(
        1, n, search.Cut(profile, n, profile.batch // n), n, 'gpipe',
        'never'))
  return found


@contextlib.contextmanager
def _Unpinned():
  """This process on every core it may use while the body starts children.

  The planner pins itself to one core while it measures; the trainer it
  starts inherits that, but its client must run where the system puts it
  (its workers pin themselves). Set here, not in the child: a function run
  between fork and exec in a threaded process may deadlock.
  """
  pinned = os.sched_getaffinity(0)
  allowed = set(range(os.cpu_count() or 1))
  try:
    os.sched_setaffinity(0, allowed)
  except OSError:
    pass  # A container's cpuset: keep what we have.
  try:
    yield
  finally:
    os.sched_setaffinity(0, pinned)


def Measure(model, override, profile, devices, log=None,
            timed_steps=TIMED_STEPS, timeout=900):
  """The trainer's median step of each reference configuration.

  Args:
    model: the registered model.
    override: its --model_params_override text.
    profile: its profile.Profile (the batch, the layers).
    devices: local worker processes to run on (the devices planned for).
    log: a print-like function, or None.
    timed_steps: steps timed after ``WARMUP_STEPS``.
    timeout: seconds each trainer run may take.

  Returns:
    A list of (simulator.Configuration, median step seconds).

  Raises:
    TrainerStepError: the trainer failed or printed no step times.
  """
  return [(config, _MeasureOne(model, override, profile, config, log,
                               timed_steps, timeout))
          for config in References(profile, devices)]


def _MeasureOne(model, override, profile, config, log, timed_steps,
                timeout):
  """The trainer's median step of `config` (see ``Measure``)."""
  workdir = tempfile.mkdtemp(prefix='gpipe_trainer_step_')
  plan_path = os.path.join(workdir, 'reference_plan.json')
  predicted = simulator.Predict(_Bare(profile), config)
  choice.Save(choice.Plan(
      model=model, config=config, task_costs=None,
      num_devices=config.num_devices, memory_per_device=None,
      predicted=dict(step_seconds=predicted.step_seconds,
                     examples_per_second=predicted.examples_per_second,
                     bubble=predicted.bubble,
                     peak_bytes=list(predicted.peak_bytes))), plan_path)
  if log:
    log('timing the trainer\'s own step: %s on %d worker process(es), %d '
        'steps' % (config.label, config.num_devices,
                   WARMUP_STEPS + timed_steps))
  try:
    with _Unpinned():
      seconds = timed_run.StepSeconds(
          model, plan_path, config.num_devices, profile.batch, WARMUP_STEPS,
          timed_steps, os.path.join(workdir, 'run'), override, timeout)
  except timed_run.TimedRunError as e:
    raise TrainerStepError('the reference run of %s: %s' %
                           (config.label, e)) from e
  finally:
    shutil.rmtree(workdir, ignore_errors=True)  # Its checkpoint too.
  return statistics.median(seconds)


def _Bare(profile):
  return profile.Replace(trainer_seconds=0.0, update_factor=1.0)


def Fit(profile, measured):
  """(trainer_seconds, update_factor) matching the trainer's steps.

  Each prediction is ``base + f * update + a``: `base` the step without the
  update, `update` the update's modelled seconds on the busiest device after
  the last gradient, `f` the factor and `a` the fixed cost. Two references
  whose updates differ give both; one gives `a` with f = 1. `a` is negative
  when the profile's step is longer than the trainer's (its calibration
  over-predicts): the correction then shortens every prediction. The
  factor stays within [0, MAX_UPDATE_FACTOR] (a larger one says the two
  references differ by more than the update, not what the update costs),
  and `a` is then fitted to both on average.

  Args:
    profile: the profile.Profile.
    measured: ``Measure``'s list of (configuration, seconds).

  Returns:
    (trainer_seconds, update_factor).
  """
  terms = []
  for config, seconds in measured:
    without = simulator.Predict(_Bare(profile).Replace(update_factor=0.0),
                                config).step_seconds
    update = simulator.Predict(_Bare(profile), config).step_seconds - without
    terms.append((seconds - without, update))
  factor = 1.0
  if len(terms) > 1:
    (rest_a, update_a), (rest_b, update_b) = terms[:2]
    if abs(update_a - update_b) > 1e-6 * max(abs(rest_a), abs(rest_b), 1e-9):
      factor = min(max((rest_a - rest_b) / (update_a - update_b), 0.0),
                   MAX_UPDATE_FACTOR)
  fixed = statistics.mean(rest - factor * update for rest, update in terms)
  return fixed, factor


def Predicted(profile, config):
  """The profile's step of `config` without the trainer's part (seconds)."""
  return simulator.Predict(_Bare(profile), config).step_seconds
