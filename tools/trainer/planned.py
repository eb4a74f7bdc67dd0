"""``--plan``: train the configuration the planner chose.

* ``--plan=auto``: run the planner (``python -m tools.plan``, in its own
  process, which pins itself to one core while it measures) for this model
  on the run's devices under ``--memory_per_device`` (its peaks keep every
  gradient sum to the end of the step, as this trainer's Lingvo learner
  needs); it prints its table and writes ``<logdir>/plan.json`` (its profile
  goes to ``<logdir>/profile.json`` and is reused by later runs). A logdir
  that already holds a plan (a resumed run) keeps it.
* ``--plan=FILE``: a plan written by ``python -m tools.plan --plan_out``,
  copied to ``<logdir>/plan.json``.

The run's devices are those the placement lays the stages on
(``placement.LaidOutDevices``: each local worker's or cluster task's
devices, ``--devices_per_task`` of them if given, or this process's GPUs);
the layout uses every one, so a plan, made or saved, must be for exactly
that many: another count is refused before any worker starts. Stages on
virtual CPUs of this process (no workers, no GPU) get as many CPUs as the
plan asks for; the planner plans for this machine's cores there.

The plan sets the pipeline's K, cut, M, schedule, remat, batched weight
gradients and measured task costs (``gpipe.plan.choice.ApplyToPipeline``),
and the run's data-parallel replicas and compute dtype; the flags that set
those by hand are refused beside it.
"""

import collections
import os
import shutil
import subprocess
import sys

from gpipe.plan import choice
from gpipe.runtime import layout
from gpipe.schedules import registry
from tools.trainer import placement as placement_lib

PLAN_FILE = 'plan.json'
PROFILE_FILE = 'profile.json'
# How tools.plan starts the line of an error it stops with.
PLANNER_ERROR = 'plan: error: '


class PlanError(ValueError):
  """A plan that cannot be used, or a planner that failed or found nothing.

  The text says what to change.
  """


class Devices(
    collections.namedtuple('Devices', ['count', 'described', 'laid_out'])):
  """The devices --plan plans for.

  Attributes:
    count: N, the devices to plan for.
    described: them in words for messages ('2 task(s) x 1 CPU').
    laid_out: whether the run lays its stages on exactly these N devices
      (False: virtual CPUs of this process, as many as a plan needs).
  """

  __slots__ = ()


def RunDevices(worker_processes=0, cluster_spec='', device_type='auto',
               devices_per_task=0, connect_timeout_secs=10.0, environ=None):
  """The Devices of a run with these placement flags (placement.Placement's).

  Args:
    worker_processes: --worker_processes.
    cluster_spec: --cluster_spec ('': TF_CONFIG in `environ`, if set).
    device_type: --device_type.
    devices_per_task: --devices_per_task.
    connect_timeout_secs: --connect_timeout_secs (a running cluster is asked
      for its devices).
    environ: the environment to read TF_CONFIG from (default os.environ).

  Returns:
    A Devices.
  """
  devices = placement_lib.LaidOutDevices(
      worker_processes=worker_processes, cluster_spec=cluster_spec,
      device_type=device_type, devices_per_task=devices_per_task,
      connect_timeout_secs=connect_timeout_secs, environ=environ)
  if devices is None:
    cores = os.cpu_count() or 1
    return Devices(cores, "%d core(s) of this machine, as virtual CPUs of "
                   'the trainer' % cores, False)
  return Devices(len(devices), layout.CountByTask(devices), True)


def CheckDevices(plan, devices, source, resumed=False):
  """Raises PlanError if `plan` is for another number of devices.

  Args:
    plan: a gpipe.plan.choice.Plan.
    devices: the run's Devices.
    source: the plan file, for the message.
    resumed: the plan is the logdir's own, from an earlier run.
  """
  c = plan.config
  if not devices.laid_out or c.num_devices == devices.count:
    return
  if resumed:
    todo = ('resume on %d device(s), as that run had, or give a new --logdir '
            'to plan for %d' % (c.num_devices, devices.count))
  else:
    todo = ('plan for %d (python -m tools.plan --model=%s --devices=%d '
            '--plan_out=FILE, or --plan=auto), or run on %d device(s)' %
            (devices.count, plan.model, devices.count, c.num_devices))
  raise PlanError(
      'the plan %s%s runs on %d device(s) (R=%d replica(s) x D=%d), but this '
      'run lays its stages on %d (%s) and uses every one: %s' %
      (source, ' (this logdir\'s, from an earlier run)' if resumed else '',
       c.num_devices, c.replicas, c.devices_per_replica, devices.count,
       devices.described, todo))


def _RunPlanner(model, override, devices, memory, logdir, echo):
  """Runs tools.plan for the model; its table goes to our stdout."""
  profile = os.path.join(logdir, PROFILE_FILE)
  plan_path = os.path.join(logdir, PLAN_FILE)
  args = [sys.executable, '-m', 'tools.plan', '--model=' + model,
          '--devices=%d' % devices, '--plan_out=' + plan_path]
  if override:
    args.append('--model_params_override=' + override)
  if memory:
    args.append('--memory_per_device=' + memory)
  if os.path.exists(profile):
    echo('planning for %d device(s) from the profile %s' % (devices, profile))
    args.append('--profile=' + profile)
  else:
    echo('measuring the model for the planner (saved to %s), to plan for %d '
         'device(s)' % (profile, devices))
    args.append('--profile_out=' + profile)
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [root] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  done = subprocess.run(args, cwd=root, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, check=False)
  errors = []
  for line in done.stdout.splitlines():
    echo(line)
    if line.startswith(PLANNER_ERROR):
      errors.append(line[len(PLANNER_ERROR):])
  if errors:
    # A refusal (a cap below the weights, a model it cannot plan): its own
    # words say what to change.
    raise PlanError('--plan=auto: the planner stopped: %s' % errors[-1])
  if done.returncode or not os.path.exists(plan_path):
    raise PlanError(
        '--plan=auto: the planner found no configuration of %s for %d '
        'device(s)%s (exit status %d, its output above): raise '
        '--memory_per_device, add devices, or train without --plan' %
        (model, devices, ' with %s each' % memory if memory else '',
         done.returncode))
  return plan_path


def Resolve(plan_flag, model, override, logdir, devices, memory, echo,
            manual_flags):
  """The Plan of ``--plan`` (None without it), saved in the logdir.

  Args:
    plan_flag: '' (no plan), 'auto' or a plan file.
    model: the registered model.
    override: --model_params_override.
    logdir: the run's directory (created).
    devices: the run's Devices (``RunDevices``): the planner plans for
      them, and a saved plan for another count of laid-out devices is
      refused.
    memory: --memory_per_device text ('' for no cap).
    echo: prints a console line.
    manual_flags: {flag name: value} of the flags a plan sets; any that is
      set is refused.

  Returns:
    A gpipe.plan.choice.Plan, or None.

  Raises:
    PlanError: a flag the plan would override, a missing plan file, a
      failed planner, or a plan for another model or device count.
  """
  if not plan_flag:
    if memory:
      raise PlanError('--memory_per_device is for --plan=auto')
    return None
  given = sorted(name for name, value in manual_flags.items() if value)
  if given:
    raise PlanError(
        '--plan sets %s itself: drop %s, or train without --plan' %
        (', '.join(sorted(manual_flags)), ', '.join('--' + g for g in given)))
  saved = os.path.join(logdir, PLAN_FILE)
  resumed = plan_flag == 'auto' and os.path.exists(saved)
  if plan_flag == 'auto':
    source = saved
    if resumed:
      echo('resuming with the plan in %s' % saved)
    else:
      _RunPlanner(model, override, devices.count, memory, logdir, echo)
  else:
    if memory:
      raise PlanError('--memory_per_device is for --plan=auto; the plan in '
                      '%s was made for its own cap' % plan_flag)
    if not os.path.isfile(plan_flag):
      raise PlanError(
          '--plan=%s: there is no such plan file. Write one with python -m '
          'tools.plan --model=%s --devices=%d --plan_out=%s (add '
          '--memory_per_device=SIZE for a cap), or plan in the run with '
          '--plan=auto' % (plan_flag, model, devices.count, plan_flag))
    source = plan_flag
  plan = choice.Load(source)
  if plan.model != model:
    raise PlanError('the plan %s is for %s, not %s: plan this model (python '
                    '-m tools.plan --model=%s)' % (source, plan.model,
                                                   model, model))
  CheckDevices(plan, devices, source, resumed)
  # Copied only once accepted: a refused plan must not become the logdir's,
  # which a later --plan=auto would resume with.
  if plan_flag != 'auto' and (os.path.abspath(plan_flag) !=
                              os.path.abspath(saved)):
    shutil.copyfile(plan_flag, saved)
  echo('plan: %s (written to %s)' % (plan.Describe(), saved))
  return plan


def RunSettings(plan):
  """The run settings a plan decides beyond the pipeline's params."""
  c = plan.config
  loop = (c.stages_per_device > 1 and
          registry.Get(c.schedule).placement == registry.ANY)
  return dict(data_parallel=c.replicas, fprop_dtype=c.dtype,
              loop_stages=loop)


def Apply(cfg, plan):
  """Applies `plan` to the one pipeline of the model params `cfg`."""
  # pylint: disable=g-import-not-at-top
  from tools.trainer import model_select
  found = model_select.FindPipelines(cfg)
  if len(found) != 1:
    raise PlanError('a plan is for a model with one pipeline; this one has '
                    '%d' % len(found))
  choice.ApplyToPipeline(found[0][1], plan)
