"""``--plan``: train the configuration the planner chose.

* ``--plan=auto``: run the planner (``python -m tools.plan``, in its own
  process, which pins itself to one core while it measures) for this model
  on the run's devices (``--worker_processes``, or the servers of
  ``--cluster_spec``, else this machine's cores) under
  ``--memory_per_device`` (its peaks keep every gradient sum to the end of
  the step, as this trainer's Lingvo learner needs); it prints its table
  and writes ``<logdir>/plan.json`` (its profile goes to
  ``<logdir>/profile.json`` and is reused by later runs). A logdir that
  already holds a plan (a resumed run) keeps it.
* ``--plan=FILE``: a plan written by ``python -m tools.plan --plan_out``,
  copied to ``<logdir>/plan.json``.

The plan sets the pipeline's K, cut, M, schedule, remat, batched weight
gradients and measured task costs (``gpipe.plan.choice.ApplyToPipeline``),
and the run's data-parallel replicas and compute dtype; the flags that set
those by hand are refused beside it.
"""

import os
import shutil
import subprocess
import sys

from gpipe.plan import choice
from gpipe.schedules import registry

PLAN_FILE = 'plan.json'
PROFILE_FILE = 'profile.json'


class PlanError(ValueError):
  """The planner failed or found nothing; the text says what to change."""


def Devices(worker_processes, cluster_spec):
  """The devices --plan=auto plans for."""
  if worker_processes:
    return worker_processes
  if cluster_spec:
    return len(cluster_spec.split('=', 1)[-1].split(','))
  return os.cpu_count() or 1


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
    echo('planning from the profile %s' % profile)
    args.append('--profile=' + profile)
  else:
    echo('measuring the model for the planner (saved to %s)' % profile)
    args.append('--profile_out=' + profile)
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [root] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  done = subprocess.run(args, cwd=root, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, check=False)
  for line in done.stdout.splitlines():
    echo(line)
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
    devices: the devices to plan for (``Devices``).
    memory: --memory_per_device text ('' for no cap).
    echo: prints a console line.
    manual_flags: {flag name: value} of the flags a plan sets; any that is
      set is refused.

  Returns:
    A gpipe.plan.choice.Plan, or None.

  Raises:
    PlanError: a flag the plan would override, a failed planner, or a plan
      for another model.
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
  if plan_flag == 'auto':
    if os.path.exists(saved):
      echo('resuming with the plan in %s' % saved)
    else:
      _RunPlanner(model, override, devices, memory, logdir, echo)
  else:
    if memory:
      raise PlanError('--memory_per_device is for --plan=auto; the plan in '
                      '%s was made for its own cap' % plan_flag)
    if os.path.abspath(plan_flag) != os.path.abspath(saved):
      shutil.copyfile(plan_flag, saved)
  plan = choice.Load(saved)
  if plan.model != model:
    raise PlanError('the plan %s is for %s, not %s: plan this model (python '
                    '-m tools.plan --model=%s)' % (plan_flag, plan.model,
                                                   model, model))
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
