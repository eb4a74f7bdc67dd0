"""The profile's absolute times, measured through the trainer itself.

The profile's layers give each layer's cost relative to the others'. The
trainer's step does more than the pipeline's tasks: it reads the next batch
from the task's input pipeline, runs Lingvo's learner (a global gradient
norm, a NaN/Inf check and a scale over every gradient before the
optimizer's update), fetches the metrics, and its client process shares the
machine's cores with the workers; and a stage task in a worker beside
another takes longer than the layers timed alone. On this machine kind
predictions from the layers and a separate calibration run were half the
step off either way.

``Measure`` runs the trainer itself (its ``--plan=FILE`` training on the
pinned worker processes the planner's figures are for; all of them in one
process on the same workers: ``tools/trainer/timed_run.py``) for a few
steps of two or three reference configurations (``References``), tracing
one step of each in its warm-up:

* data-parallel: the whole model as one stage, one micro-batch, a replica
  per device ('gpipe': F and an unsplit backward): every device computes
  all the time, the client competes with all of them;
* pipelined: the model cut over the devices (R=1, K=N, M=N) under a split
  backward ('zb_h1': F, B and W tasks; 'gpipe' for a model whose loss is
  computed after the pipeline): hand-overs between the workers, devices
  partly idle;
* looped: two stages per device (R=1, K=2N, v=2, M=N, 'zb_v'), when the
  model has two layers per device: twice the task calls of the pipelined
  one, which gives the cost of a call in the trainer's step.

A device computes more slowly while the other does too: the unsplit
backward's factor comes from the first (as data-parallel candidates run),
the split backward's from the second (as pipelined ones run).

``gpipe.plan.trainer_fit.Fit`` then scales the layers' figures to the
traced task times, takes the hand-over's latency from the pipelined trace,
and fits one scale, the trainer's fixed cost of a step and (with the third)
a task call's cost to the untraced steps. With one device, or a model with fewer layers than devices, only
the first reference runs.
"""
import collections
import contextlib
import os
import shutil
import statistics
import tempfile

from gpipe.plan import choice
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.plan import trainer_fit
from tools.trainer import timed_run

# Steps run before the timed ones (graph optimization, first allocations;
# the second is traced), and the timed ones, in intervals of
# timed_run.LOG_EVERY steps (the median of the intervals' mean steps); a
# model of a few milliseconds a step runs as many intervals of more steps
# (timed_run.IntervalSteps).
WARMUP_STEPS = 4
TIMED_STEPS = 12
# A model whose fastest reference measured under SHORT_STEP_SECONDS a step
# in the trainer runs each reference SHORT_STEP_RUNS times. Two runs of the
# same configuration of a few milliseconds a step differ by up to a third
# here (the client's and the workers' threads share the cores, and a few
# milliseconds are a few scheduler slices), more than the intervals within
# one run: every reference runs once, then, when the first round's steps
# are short, every one again in the same order, and each takes its fastest
# run (its median and its traced step), as the plan benchmark takes the
# fastest of its passes. All of a model's references or none run again, so
# that the fit compares like with like. The default model's references (85
# to 112 ms a step) differed by 3-6% between two such rounds here, against
# 5-33% for the toy's (4-7 ms) and mt.NumbersTiny's (24-36 ms): they run
# once, and it plans in no more time than before.
SHORT_STEP_SECONDS = 0.05
SHORT_STEP_RUNS = 2

class TrainerStepError(RuntimeError):
  """The trainer's reference run failed; the text has its last output."""


def References(profile, devices):
  """The configurations ``Measure`` runs (see the module docstring).

  Args:
    profile: the model's profile.Profile.
    devices: the devices of the run being planned.

  Returns:
    A list of simulator.Configurations: data-parallel (R = the devices when
    the batch splits evenly over them, else R = 1 on one device; 'gpipe'),
    then, when the model has a layer per device and the batch splits into
    N micro-batches, pipelined over the devices ('zb_h1' when the loss is
    computed per micro-batch, else 'gpipe'), and with two layers per
    device and a per-micro-batch loss, looped ('zb_v', v=2).
  """
  n = max(devices, 1)
  replicas = n if profile.batch % n == 0 else 1
  found = [simulator.Configuration(replicas, 1, (profile.num_layers,), 1,
                                   'gpipe', 'never')]
  if n > 1 and profile.num_layers >= n and profile.batch % n == 0:
    found.append(simulator.Configuration(
        1, n, search.Cut(profile, n, profile.batch // n), n,
        'zb_h1' if profile.loss_in_pipeline else 'gpipe', 'never'))
  if (n > 1 and profile.loss_in_pipeline and profile.num_layers >= 2 * n
      and profile.batch % n == 0):
    found.append(simulator.Configuration(
        1, 2 * n, search.Cut(profile, 2 * n, profile.batch // n), n, 'zb_v',
        'never', stages_per_device=2))
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


class Started(
    collections.namedtuple('Started', ['model', 'runs', 'workdir',
                                       'timed_steps'])):
  """The trainer's process for the references, started (``Start``).

  Attributes:
    model: the registered model.
    runs: its timed_run.TrainerRuns.
    workdir: a directory of its own (plans, logdirs).
    timed_steps: steps timed after ``WARMUP_STEPS`` in each run.
  """

  __slots__ = ()


@contextlib.contextmanager
def Start(model, override, devices, timed_steps=TIMED_STEPS):
  """Starts the trainer's process for ``Measure``; yields a Started.

  Its imports and its `devices` worker processes start now, while the
  caller measures the layers the references' cuts need; it runs nothing
  until ``Measure`` sends it the references. It is stopped, and its
  directory removed, at the end of the block.

  Args:
    model: the registered model.
    override: its --model_params_override text.
    devices: local worker processes to run on (the devices planned for).
    timed_steps: steps timed after ``WARMUP_STEPS``.
  """
  workdir = tempfile.mkdtemp(prefix='gpipe_trainer_step_')
  try:
    with _Unpinned():
      runs = timed_run.TrainerRuns(model, devices, WARMUP_STEPS, timed_steps,
                                   os.path.join(workdir, 'runs'), override)
    with runs:
      yield Started(model, runs, workdir, timed_steps)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)  # The checkpoints too.


def WarmUp(started, model, num_layers, batch, devices):
  """Has the started process build the data-parallel reference's graph.

  That reference's cut needs no measured layer (the whole model is one
  stage): its plan is written before the layers are measured, and the
  process builds its graph meanwhile, on a core the layers' measuring leaves
  it, and that reference's run takes it (``timed_run.TrainerRuns.WarmUp``).

  Args:
    started: what ``Start`` yielded.
    model: the registered model.
    num_layers: the pipeline's layers.
    batch: examples per step.
    devices: the devices planned for.
  """
  config = simulator.Configuration(devices if batch % devices == 0 else 1, 1,
                                   (num_layers,), 1, 'gpipe', 'never')
  if config.num_devices != devices:
    return
  path = os.path.join(started.workdir, 'warm_up.json')
  # Only built, never run: nothing is predicted.
  choice.Save(choice.Plan(
      model=model, config=config, task_costs=None, num_devices=devices,
      memory_per_device=None, predicted=dict(
          step_seconds=0.0, examples_per_second=0.0, bubble=0.0,
          peak_bytes=[])), path)
  started.runs.WarmUp(path)


def Measure(started, profile, devices, log=None, timeout=900,
            short_step_runs=SHORT_STEP_RUNS):
  """The trainer's median step of each reference configuration.

  The references run one after another in the process ``Start`` started,
  on the same worker processes: the trainer's imports and its workers'
  start are paid once (and overlap the layers' measuring). When the
  fastest reference's step is under SHORT_STEP_SECONDS in the first round,
  all of them run `short_step_runs` times, round after round, and each
  counts its fastest run. When a later round fails or times out, the
  first round's runs count (``TrainerRuns.Run`` logs why).

  Args:
    started: what ``Start`` yielded (used once).
    profile: the model's profile.Profile (the batch, the layers).
    devices: the devices planned for (the started process's workers).
    log: a print-like function, or None.
    timeout: seconds each trainer run may take.
    short_step_runs: runs of each reference of a model of short steps.

  Returns:
    A list of trainer_fit.References: the configuration, the median
    untraced step (seconds) of its fastest run, that run's traced tasks
    and, when it ran more than once, each run's median step.

  Raises:
    TrainerStepError: the trainer failed or printed no step times, or no
      reference runs on all `devices` (a batch they do not divide).
    ValueError: `short_step_runs` < 1.
  """
  if short_step_runs < 1:
    raise ValueError('short_step_runs=%d: a reference runs at least once'
                     % short_step_runs)
  configs = [c for c in References(profile, devices)
             if c.num_devices == devices]
  if not configs:
    raise TrainerStepError(
        'no reference configuration runs on all %d devices (a batch of %d '
        'they do not divide)' % (devices, profile.batch))
  # A step of a few milliseconds is timed over longer intervals.
  intervals = [timed_run.IntervalSteps(Predicted(profile, c)) for c in configs]
  paths = []
  for i, config in enumerate(configs):
    paths.append(os.path.join(started.workdir, 'reference_%d.json' % i))
    _SavePlan(started.model, profile, config, paths[-1])
    if log:
      log('timing the trainer\'s own step: %s on %d worker process(es), %d '
          'steps, logged every %d' % (
              config.label, config.num_devices,
              (WARMUP_STEPS + started.timed_steps) * intervals[i] //
              timed_run.LOG_EVERY, intervals[i]))

  def Again(first):
    """The rounds after the first when its fastest step is short."""
    fastest = min(statistics.median(seconds) for seconds, _ in first)
    if fastest >= SHORT_STEP_SECONDS or short_step_runs < 2:
      return []
    if log:
      log('the fastest reference took %.1f ms a step, under %.0f ms: each '
          'runs %d times, the fastest run counting' % (
              1e3 * fastest, 1e3 * SHORT_STEP_SECONDS, short_step_runs))
    return list(range(len(configs))) * (short_step_runs - 1)

  try:
    runs = started.runs.Run(paths, profile.batch,
                            timeout * len(configs),
                            log=log, intervals=intervals, again=Again)
  except timed_run.TimedRunError as e:
    raise TrainerStepError('the reference runs of %s: %s' % (
        ', '.join(c.label for c in configs), e)) from e
  # Per reference, (median, traced tasks) of each of its runs, in order.
  found = [[] for _ in configs]
  for k, (seconds, tasks) in enumerate(runs):
    found[k % len(configs)].append((statistics.median(seconds), tasks))
  fastest = [min(range(len(f)), key=lambda k, f=f: f[k][0]) for f in found]
  if log and len(runs) > len(configs):
    for config, f, k in zip(configs, found, fastest):
      log('the trainer\'s step of %s in %d runs: %s ms (run %d, the '
          'fastest, counts)' % (config.label, len(f),
                                 ', '.join('%.1f' % (1e3 * m) for m, _ in f),
                                 k + 1))
  return [trainer_fit.Reference(config, *f[k],
                                runs=tuple(m for m, _ in f) if len(f) > 1
                                else ())
          for config, f, k in zip(configs, found, fastest)]


def _SavePlan(model, profile, config, path):
  """Writes the plan of reference `config` (the layers' prediction)."""
  predicted = simulator.Predict(_Bare(profile), config)
  choice.Save(choice.Plan(
      model=model, config=config, task_costs=None,
      num_devices=config.num_devices, memory_per_device=None,
      predicted=dict(step_seconds=predicted.step_seconds,
                     examples_per_second=predicted.examples_per_second,
                     bubble=predicted.bubble,
                     peak_bytes=list(predicted.peak_bytes))), path)


def _Bare(profile):
  return profile.Replace(trainer_seconds=0.0, update_factor=1.0)


def Predicted(profile, config):
  """The profile's step of `config` without the trainer's part (seconds)."""
  return simulator.Predict(_Bare(profile), config).step_seconds
