"""The plan_trainer subcommand: the planner's predictions against the trainer.

The ``plan`` subcommand checks the simulator on the benchmark's own stacks in
its own runner. This one checks what a user meets: for each registered model
that trains here,

1. ``python -m tools.plan`` plans it for the devices (measuring its layers'
   relative costs, then their absolute times and the trainer's own step
   from traced reference runs of the trainer: ``tools/plan/trainer_step.py``;
   a configuration it ran is predicted by its measured step), timed from
   start to end, with each phase's seconds as it logs them;
2. the planner's pick and the best candidate of each other shape (R x K) and
   of each other schedule family, up to ``--top`` configurations, each run
   by the trainer itself (``python -m tools.trainer --plan=FILE
   --worker_processes=N --pin_cores``) for ``--steps`` steps after
   ``--warmup``, in runs of their own; the median step of each run, as the
   trainer's own progress lines give it. ``--passes`` passes over them all
   run each configuration that many times, minutes apart: its measured step
   is the fastest run's (a shared machine's bursts of other work slowed
   whole runs of the same configuration twofold); every run is kept.

It reports per configuration the predicted and measured step (ms), the error
against the fastest pass and how far the prediction lies outside the passes'
own range (``RangeError``, a lenient bound beside the error: a shared
machine's passes of one configuration differ by as much as a prediction may
miss) and the error side by side (``SideBySide``: each configuration against
the others of the same pass, what the pick rests on; a machine whose speed
moved between planning and the passes moves the error against the fastest
pass but not this one, nor does an error the planner makes in every
configuration alike), marking those the planner measured while planning
("measured in planning": their prediction is that measurement, this run
checks it again)
apart from those it extrapolated with its fit; per model the planning time,
the largest error of each kind, the largest spread of one configuration's
passes, whether the pick is within 5% of the fastest configuration measured
and, when not, whether the passes tell the two apart at all
(``PickVerdicts``); the plot puts predicted against measured.
"""

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from gpipe.plan import choice
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from tools.benchmark import report
from tools.trainer import timed_run

# The registered models that train on this machine kind in minutes.
MODELS = ('image.AmoebaNetD_Digits', 'mt.NumbersSmall', 'mt.NumbersTiny',
          'toy.PipelinedDigitsMlp')
# The pick counts as the fastest when within this of the fastest measured.
PICK_TOLERANCE = 0.05
# The shortest logged interval of a run (timed_run.IntervalSteps): a step of
# a few milliseconds is timed over hundreds of steps per interval (one of a
# few intervals the trainer's own flushes or a burst of other work may
# slow).
MIN_INTERVAL_SECONDS = 0.5

def PickVerdicts(measured):
  """Whether the pick is the fastest configuration measured, two ways.

  Args:
    measured: per configuration, a dict with 'pick' (bool), 'measured_ms'
      (its fastest pass) and 'passes_ms' (every pass).

  Returns:
    (within: the pick's step within PICK_TOLERANCE of the fastest's;
    overlaps: the pick's fastest pass no slower than the fastest
    configuration's slowest pass, i.e. the two are not told apart by the
    passes' own spread), both False when the pick was not measured.
  """
  pick = [m for m in measured if m['pick']]
  if not pick:
    return False, False
  pick = pick[0]
  fastest = min(measured, key=lambda m: m['measured_ms'])
  return (pick['measured_ms'] <= fastest['measured_ms'] *
          (1 + PICK_TOLERANCE),
          pick['measured_ms'] <= max(fastest['passes_ms']))


def RangeError(predicted_ms, passes_ms):
  """How far a prediction lies outside the trainer's own passes.

  A configuration's passes on a shared machine differ by as much as a
  prediction may miss (the largest spread of one of a model's
  configurations' three passes was 8-53% on the 2-core machine of
  docs/BENCHMARKS.md): a prediction between its slowest and fastest pass
  is as close as another pass of the trainer was. Lenient where the passes
  spread widely (the error against the fastest pass stands beside it).

  Args:
    predicted_ms: the predicted step.
    passes_ms: the trainer's step in each pass.

  Returns:
    0 inside [fastest, slowest]; else the relative error against the
    nearer end (negative: faster than every pass).
  """
  low, high = min(passes_ms), max(passes_ms)
  if predicted_ms < low:
    return predicted_ms / low - 1
  if predicted_ms > high:
    return predicted_ms / high - 1
  return 0.0


def SideBySide(predicted_ms, passes_ms):
  """Each prediction against the other configurations of the same pass.

  A shared machine's speed moves over minutes (the same configuration's
  passes differed by up to 53% on the 2-core machine of docs/BENCHMARKS.md,
  and whole passes by up to a fifth against the planning run). The
  configurations one pass trains, minutes apart, share much of its speed.
  Each configuration's prediction is scaled by the factor of the *others*
  in the same pass (the geometric mean of their measured / predicted steps:
  left out, its own error is not spread over them) and compared with its
  step in that pass. What is left is the planner's error in a configuration's
  step relative to the others', which is what its pick rests on; with two
  configurations it is the error in their ratio (both rows show it, with
  opposite signs). One configuration's error is also in every other row's
  factor, a 1/(n-1) share of it with n configurations: a row is judged
  against the others as measured, outliers included. An error every
  configuration shares (the machine's speed, or one the planner makes in
  all alike) is not seen here: the error against the fastest pass shows it.

  Args:
    predicted_ms: each configuration's predicted step.
    passes_ms: per configuration, its step in each pass (pass n of every
      configuration ran in the same pass over them all).

  Returns:
    (errors: per configuration, the median over passes of
    predicted * others' factor / measured - 1; factors: per pass, the
    geometric mean of every configuration's measured / predicted step, above
    1 when the pass ran slower than predicted), or (None, None) with fewer
    than two configurations.
  """
  if len(predicted_ms) < 2:
    return None, None
  count = min(len(p) for p in passes_ms)
  logs = [[math.log(p[n] / predicted) for n in range(count)]
          for predicted, p in zip(predicted_ms, passes_ms)]

  def Factor(n, leave_out=None):
    return math.exp(statistics.mean(
        log[n] for i, log in enumerate(logs) if i != leave_out))

  errors = [statistics.median(Factor(n, i) / math.exp(logs[i][n]) - 1
                              for n in range(count))
            for i in range(len(logs))]
  return errors, [Factor(n) for n in range(count)]


def _Percent(x):
  return '-' if x is None else '%.0f%%' % (100 * x)


def _Signed(x):
  return '-' if x is None else '%+.0f%%' % (100 * x)


def _Family(schedule):
  return 'zero bubble' if schedule.startswith('zb') else schedule


def Shortlist(candidates, top):
  """The pick, then the best of each other R x K, then of each family.

  Args:
    candidates: search.Candidates that fit, fastest first.
    top: the most to return.

  Returns:
    Up to `top` candidates with distinct configurations.
  """
  chosen, shapes = [], set()
  for c in candidates:
    shape = (c.config.replicas, c.config.num_stages)
    if shape not in shapes:
      chosen.append(c)
      shapes.add(shape)
  families = {_Family(c.config.schedule) for c in chosen}
  for c in candidates:
    if len(chosen) >= top:
      break
    family = _Family(c.config.schedule)
    if family not in families and c not in chosen:
      chosen.append(c)
      families.add(family)
  return chosen[:top]


def Phases(output):
  """{phase: seconds} of the planner's "<phase> took <s> s" lines."""
  phases = {}
  for line in output.splitlines():
    found = re.match(r'(.+) took ([0-9.]+) s$', line.strip())
    if found:
      phases[found.group(1)] = float(found.group(2))
  return phases


def _Plan(model, devices, workdir, repeats):
  """Runs the planner; returns (seconds, its Phases, profile and plan paths)."""
  plan_path = os.path.join(workdir, 'plan.json')
  profile_path = os.path.join(workdir, 'profile.json')
  args = [sys.executable, '-m', 'tools.plan', '--model=' + model,
          '--devices=%d' % devices, '--plan_out=' + plan_path,
          '--profile_out=' + profile_path, '--repeats=%d' % repeats]
  start = time.time()
  done = subprocess.run(args, cwd=timed_run.ROOT,
                        env=timed_run.Environment(),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, check=False)
  seconds = time.time() - start
  for line in done.stdout.splitlines():
    if line.startswith(('timing', 'the trainer', 'calibrat', 'contention',
                        'task factors', 'scale on', '  fitted', 'measuring',
                        'hand-over', 'Best', 'the fit')) or ' took ' in line:
      report.Log('  ' + line)
  if done.returncode or not os.path.exists(plan_path):
    raise RuntimeError('the planner failed for %s:\n%s' %
                       (model, done.stdout[-3000:]))
  return seconds, Phases(done.stdout), profile_path, plan_path


def _Train(model, plan_path, devices, warmup, steps, batch, logdir,
           predicted):
  """The trainer's median step (s) with the plan, and each interval's.

  A step predicted at a few milliseconds is logged over more steps, as the
  planner's references are (``timed_run.IntervalSteps``, intervals of at
  least MIN_INTERVAL_SECONDS): `warmup` and `steps` count intervals of
  ``timed_run.LOG_EVERY`` steps then.
  """
  n = timed_run.IntervalSteps(predicted, MIN_INTERVAL_SECONDS)
  scale = lambda k: -(-k // timed_run.LOG_EVERY) * n
  seconds = timed_run.StepSeconds(model, plan_path, devices, batch,
                                  scale(warmup), scale(steps), logdir,
                                  log_every=n)
  return statistics.median(seconds), seconds


def PlanTrainer(args):
  """Predicted against measured through the trainer (see the module doc)."""
  models = [m for m in args.models.split(',') if m] or list(MODELS)
  title, info = report.Header(
      'The planner through the trainer',
      dict(models=','.join(models), devices=args.devices, top=args.top,
           warmup=args.warmup, steps=args.steps, passes=args.passes))
  rows, results, refused = [], [], []
  for model in models:
    workdir = tempfile.mkdtemp(prefix='gpipe_plan_trainer_')
    report.Log('planning %s for %d devices' % (model, args.devices))
    plan_seconds, phases, profile_path, plan_path = _Plan(
        model, args.devices, workdir, args.repeats)
    profile = profile_lib.Load(profile_path)
    # The planner's search with its defaults (no cap: every shape runs).
    result = search.Search(profile, args.devices, None)
    shortlist = Shortlist(result.candidates, args.top)
    paths = []
    for i, c in enumerate(shortlist):
      paths.append(os.path.join(workdir, 'candidate_%d.json' % i))
      choice.Save(choice.FromCandidate(c, args.devices, None, model),
                  paths[-1])
    runs = [[] for _ in shortlist]
    failed = {}
    for n in range(max(args.passes, 1)):
      for i, c in enumerate(shortlist):
        if i in failed:
          continue
        report.Log('  training %s with %s (pass %d)' % (model, c.config.label,
                                                       n + 1))
        try:
          runs[i].append(_Train(model, paths[i], args.devices, args.warmup,
                                args.steps, profile.batch,
                                os.path.join(workdir, 'run_%d_%d' % (i, n)),
                                c.prediction.step_seconds))
        except timed_run.TimedRunError as e:
          # A configuration the planner offers but the trainer refuses: a
          # finding of its own, reported; the others still run.
          report.Log('  the trainer refused %s: %s' % (c.config.label, e))
          failed[i] = str(e)
    measured = []
    for i, c in enumerate(shortlist):
      if i in failed:
        refused.append(dict(model=model, config=c.config.label, pick=i == 0,
                            error=failed[i]))
        continue
      seconds, steps = min(runs[i], key=lambda run: run[0])
      passes = [1e3 * run[0] for run in runs[i]]
      predicted = c.prediction.step_seconds
      # The planner's own measurement of it (the prediction) or its fit's.
      measured.append(dict(config=c.config.label, pick=i == 0,
                           reference=bool(c.measured),
                           predicted_ms=1e3 * predicted,
                           measured_ms=1e3 * seconds,
                           passes_ms=passes,
                           step_ms=[1e3 * s for s in steps],
                           error=predicted / seconds - 1,
                           range_error=RangeError(1e3 * predicted, passes),
                           spread=max(passes) / min(passes) - 1))
    if not measured:
      continue
    side_by_side, factors = SideBySide([m['predicted_ms'] for m in measured],
                                      [m['passes_ms'] for m in measured])
    for i, m in enumerate(measured):
      m['side_by_side_error'] = side_by_side[i] if side_by_side else None
    fastest = min(m['measured_ms'] for m in measured)
    pick = measured[0] if measured[0]['pick'] else None
    within, overlaps = PickVerdicts(measured)
    planned = choice.Load(plan_path)

    def Largest(kind):
      errors = [abs(m['error']) for m in measured if m['reference'] == kind]
      return max(errors) if errors else None

    results.append(dict(
        model=model, plan_seconds=plan_seconds, phases=phases,
        trainer_ms=1e3 * profile.trainer_seconds,
        task_factors=(profile.factors[0]._asdict() if profile.factors
                      else None),
        fit_error=result.fit_error,
        pick_is_plan=planned.config == result.best.config,
        pick_is_fastest=within,
        pick_overlaps_fastest=overlaps,
        largest_error=max(abs(m['error']) for m in measured),
        largest_error_measured=Largest(True),
        largest_error_extrapolated=Largest(False),
        largest_range_error=max((m['range_error'] for m in measured),
                                key=abs),
        largest_spread=max(m['spread'] for m in measured),
        largest_side_by_side_error=(max(side_by_side, key=abs)
                                    if side_by_side else None),
        pass_factors=factors,
        configurations=measured))
    for m in measured:
      rows.append([model, m['config'] + (' (pick)' if m['pick'] else '') +
                   (' (measured in planning)' if m['reference'] else
                    ' (extrapolated)'),
                   '%.1f' % m['predicted_ms'],
                   ' / '.join('%.1f' % x for x in m['passes_ms']),
                   _Signed(m['error']),
                   _Signed(m['range_error']),
                   _Signed(m['side_by_side_error'])])
    report.Log('  %s: planned in %.0f s; pick %s measured %s (fastest '
               '%.1f ms)' % (model, plan_seconds, result.best.config.label,
                             '%.1f ms' % pick['measured_ms'] if pick else
                             'refused by the trainer', fastest))
  summary = report.Table(
      ['model', 'planning (s)', 'trainer adds (ms)', 'task factors F/B/W',
       "fit's error on its references", 'largest error, measured in planning',
       'largest error, extrapolated', "largest spread of a configuration's "
       'passes', "largest error outside the passes' range",
       'largest error side by side', "each pass's factor against the plan",
       'pick is the fastest measured', "pick's passes reach the fastest's"],
      [[r['model'], '%.0f' % r['plan_seconds'], '%.1f' % r['trainer_ms'],
        '/'.join('%.2f' % r['task_factors'][k] for k in 'FBW')
        if r['task_factors'] else '-', _Percent(r['fit_error']),
        _Percent(r['largest_error_measured']),
        _Percent(r['largest_error_extrapolated']),
        _Percent(r['largest_spread']),
        _Signed(r['largest_range_error']),
        _Signed(r['largest_side_by_side_error']),
        ' / '.join('%.2f' % s for s in r['pass_factors'])
        if r['pass_factors'] else '-',
        'yes' if r['pick_is_fastest'] else 'no',
        'yes' if r['pick_overlaps_fastest'] else 'no'] for r in results])
  notes = ['The trainer refused %s of %s%s: %s' % (
      r['config'], r['model'], ' (the pick)' if r['pick'] else '',
      r['error']) for r in refused]
  markdown = '\n'.join([
      title, report.Table(['model', 'configuration', 'predicted step (ms)',
                           'trainer step (ms), each pass', 'error',
                           "outside the passes' range", 'side by side'],
                    rows),
      ''] + notes + ['',
      summary, ''])
  print(markdown, flush=True)

  def Plot(plt):
    fig, ax = plt.subplots(figsize=(6, 5))
    for r in results:
      xs = [m['measured_ms'] for m in r['configurations']]
      ys = [m['predicted_ms'] for m in r['configurations']]
      ax.scatter(xs, ys, label=r['model'])
    top = max(max(m['measured_ms'], m['predicted_ms'])
              for r in results for m in r['configurations']) * 1.1
    ax.plot([0, top], [0, top], 'k--', linewidth=0.8)
    ax.plot([0, top], [0, 0.85 * top], 'k:', linewidth=0.6)
    ax.plot([0, top], [0, 1.15 * top], 'k:', linewidth=0.6)
    ax.set_xlabel('step through the trainer (ms)')
    ax.set_ylabel('predicted step (ms)')
    ax.set_title('The planner against the trainer (dotted: 15%)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

  report.Write(args, dict(markdown=markdown, machine=info, models=results,
                          refused=refused), Plot)
  return results
