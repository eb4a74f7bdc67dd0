"""The planner's command line: profile a model, search, print, save.

``main`` measures the registered model's profile (or loads ``--profile``),
searches every configuration for ``--devices`` under
``--memory_per_device`` (``gpipe.plan.search``), prints the best ones and
why the others were dropped, and writes the chosen plan (``--plan_out``),
which the trainer runs with ``--plan=FILE``. Peak memory is predicted for
the trainer's update (Lingvo's learner reads every gradient before it
applies any): each stage's gradient sum is kept to the end of the step
(``gpipe.plan.simulator.UPDATE_ALL_GRADIENTS``).

Measuring pins this process to one core (``--core``) with one intra-op
thread, as the benchmark's and the trainer's pinned workers run a stage,
and measures the hand-over between two such worker processes (or takes
``--handover_latency`` and ``--handover_bandwidth`` for a cluster that is
not here). The layers' figures give relative costs; the absolute task
times, the hand-over's latency and what the trainer's step adds come from
traced reference runs of the trainer itself (``tools/plan/trainer_step.py``,
``gpipe.plan.trainer_fit``), all in one trainer process started while the
layers are measured; a model of short steps runs each reference twice, the
faster run counting. A configuration the trainer ran is predicted by its
measured step; the others by the fitted simulator, ranked as if as long as
the fit's largest error on the measured ones makes them
(``gpipe.plan.search.Measured``). Each phase logs how long it took.
"""

import argparse
import contextlib
import json
import os
import sys
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.plan import choice
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from gpipe.plan import simulator
from gpipe.plan import trainer_fit
from gpipe.schedules import registry
from gpipe import precision
from gpipe.runtime import forked_workers
from gpipe.runtime import local_cluster
from lingvo import compat as tf

# Threads of the measuring sessions: a pinned one-core worker's.
INTRA_OP_THREADS = 1
INTER_OP_THREADS = 2


def _Parser():
  parser = argparse.ArgumentParser(
      prog='python -m tools.plan',
      description=sys.modules[__package__].__doc__.split('\n')[0])
  parser.add_argument('--model', help='a registered model, family.ClassName '
                      '(measured unless --profile is given)')
  parser.add_argument('--model_params_override', default='',
                      help="Lingvo params text for the model, 'a.b=1; c=2'")
  parser.add_argument('--profile', help='a saved profile (JSON) to plan from '
                      'instead of measuring')
  parser.add_argument('--profile_out', help='write the measured profile here')
  parser.add_argument('--devices', type=int, default=2,
                      help='devices to plan for: R replicas x D devices '
                      'each = this (the trainer uses every device it is '
                      'given)')
  parser.add_argument('--memory_per_device', default='',
                      help="memory cap of each device, e.g. '16GiB', "
                      "'256MiB' (default: no cap)")
  parser.add_argument('--memory_headroom', type=float,
                      default=search.HEADROOM,
                      help='the share of --memory_per_device a plan leaves '
                      'free (predicted peaks are a few percent off)')
  parser.add_argument('--plan_out', help='write the best plan here (JSON, '
                      'for the trainer\'s --plan=FILE)')
  parser.add_argument('--json', help='write the search (top candidates and '
                      'the dropped ones by reason) here')
  parser.add_argument('--top', type=int, default=10,
                      help='candidates to print')
  parser.add_argument('--rows', default='',
                      help='micro-batch sizes to measure, e.g. 4,16,64 '
                      '(default: the batch / --devices and / 16)')
  parser.add_argument('--dtypes', default='float32',
                      help="compute dtypes to measure, e.g. 'float32,"
                      "bfloat16'")
  parser.add_argument('--schedules', default='',
                      help='schedules to consider (default all: %s)' %
                      ', '.join(registry.Names()))
  parser.add_argument('--max_micro_batches', type=int, default=64)
  parser.add_argument('--handover_latency', type=float, default=None,
                      help='seconds per hand-over between devices (with '
                      '--handover_bandwidth: not measured)')
  parser.add_argument('--handover_bandwidth', type=float, default=None,
                      help='bytes/s between devices')
  parser.add_argument('--core', type=int, default=0,
                      help='the core to pin the measurement to')
  parser.add_argument('--repeats', type=int, default=3,
                      help='timed runs per measured figure (the fastest of '
                      "a layer's; they give relative costs, the trainer's "
                      'traced runs the absolute times)')
  parser.add_argument('--calibrate', default=None,
                      action=argparse.BooleanOptionalAction,
                      help='time the whole model as one stage of the '
                      'executor and both workers computing at once '
                      '(gpipe/plan/calibrate.py; default: only with '
                      '--no-trainer_step or --calibrate_layers, the '
                      'traced reference runs of the trainer give the task '
                      "times otherwise); --no-calibrate: the layers' "
                      'figures as measured')
  parser.add_argument('--trainer_step', default=True,
                      action=argparse.BooleanOptionalAction,
                      help='time a few steps of the trainer itself '
                      '(tools/plan/trainer_step.py) so that predictions '
                      'include what its step adds to the pipeline\'s: '
                      'input, Lingvo\'s learner, its client process')
  parser.add_argument('--short_step_runs', type=int, default=None,
                      help="runs of each of the trainer's reference "
                      'configurations when the fastest took under 50 ms a '
                      'step in its first run, the fastest run counting '
                      '(default: 2; a few milliseconds a step vary between '
                      'runs: tools/plan/trainer_step.py)')
  parser.add_argument('--calibrate_layers', type=int, default=None,
                      help='calibrate on the first N layers on a small '
                      'batch instead of the whole model (one too large '
                      'for a worker here; gpipe/plan/calibrate.py)')
  return parser


def Calibrates(args):
  """Whether to run the separate calibration (see --calibrate)."""
  if args.calibrate is None:
    return not args.trainer_step or args.calibrate_layers is not None
  return args.calibrate


def DefaultRows(batch, devices=1):
  """Micro-batch sizes to measure: the batch over the devices and over 16.

  The layers' figures give relative costs, interpolated linearly in the
  rows between two sizes (and extrapolated beyond them): the size of the
  trainer's reference runs, which set the absolute times
  (``tools/plan/trainer_step.py``), and a small one.
  """
  return sorted({max(1, batch // max(devices, 1)), max(1, batch // 16)})


@contextlib.contextmanager
def _Timed(what, log):
  """Logs how long the body took: where a plan's measuring time goes."""
  start = time.time()
  yield
  log('%s took %.1f s' % (what, time.time() - start))


def MeasureProfile(args, log, cap=None):
  """The registered model's profile, measured (see the module docstring).

  Args:
    args: the parsed flags.
    log: a print-like function for progress.
    cap: the memory cap in bytes (None: none): one below what the weights
      and optimizer slots alone need on args.devices is refused before
      anything is measured (search.CheckCapHoldsWeights).

  Returns:
    A profile.Profile.
  """
  # pylint: disable=g-import-not-at-top
  from gpipe.plan import profiling
  from tools.plan import model_profile
  from tools.trainer import model_select
  # pylint: enable=g-import-not-at-top
  if cap is None:
    # The hand-over's workers' fork server imports while the model is
    # described (with a cap, nothing starts before the cap is checked).
    forked_workers.Prestart()
  with _Timed('describing the model', log):
    described = model_profile.Describe(args.model,
                                       args.model_params_override)
    cfg = model_select.ModelParams(args.model, 'Train',
                                   args.model_params_override)
    slots, traffic = model_profile.OptimizerCosts(cfg)
  # From the built variables: seconds, where measuring takes minutes.
  search.CheckCapHoldsWeights(
      profiling.LayerParamBytes(described.params.layers,
                              described.loss[0] if described.loss else None),
      slots, args.devices, cap, args.memory_headroom)
  rows = ([int(r) for r in args.rows.split(',')] if args.rows else
          DefaultRows(described.batch, args.devices))
  dtypes = [precision.ParseFPropDtype(d).name for d in args.dtypes.split(',')]
  if (args.handover_latency is None) != (args.handover_bandwidth is None):
    raise ValueError('give both --handover_latency and --handover_bandwidth, '
                     'or neither (measured)')
  with contextlib.ExitStack() as stack:
    started = None
    if args.trainer_step:
      # Its imports and workers start while the layers are measured, and it
      # builds its first reference's graph meanwhile.
      from tools.plan import trainer_step  # pylint: disable=g-import-not-at-top
      started = stack.enter_context(trainer_step.Start(
          args.model, args.model_params_override, args.devices))
      trainer_step.WarmUp(started, args.model, len(described.params.layers),
                          described.batch, args.devices)
    profile = _MeasureLayers(args, log, described, rows, dtypes, slots,
                             traffic)
    if started is not None:
      profile = _FitToTheTrainer(args, log, profile, started)
  return profile


def _MeasureLayers(args, log, described, rows, dtypes, slots, traffic):
  """The layers' profile (and the hand-over), calibrated if asked."""
  # pylint: disable=g-import-not-at-top
  from gpipe.plan import calibrate
  from gpipe.plan import profiling
  from tools.benchmark import runner
  # pylint: enable=g-import-not-at-top
  config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=INTRA_OP_THREADS,
      inter_op_parallelism_threads=INTER_OP_THREADS)
  with local_cluster.LocalCluster(
      2, pin_cores=True, intra_op_threads=INTRA_OP_THREADS,
      inter_op_threads=INTER_OP_THREADS) as cluster:
    if args.handover_latency is not None:
      handover = profile_lib.Handover(args.handover_latency,
                                      args.handover_bandwidth)
      step = None
    else:
      log('measuring the hand-over between two pinned worker processes')
      with _Timed('measuring the hand-over', log):
        got = profiling.MeasureHandover(cluster.target, cluster.devices,
                                      repeats=args.repeats)
      handover, step = got['handover'], got['step_seconds']
    profiling.PinToCore(args.core)
    log('measuring %d layers of %s at %s rows per micro-batch in %s' %
        (len(described.params.layers), args.model, rows, ', '.join(dtypes)))
    with _Timed('measuring the layers', log):
      profile = profiling.MeasureModel(
          args.model, described.params.layers, described.input_specs,
          described.batch, rows, dtypes=dtypes, loss=described.loss,
          batch_dim=described.params.batch_dim, optimizer_slots=slots,
          update_traffic=traffic, handover=handover, step_seconds=step,
          session_config=config, repeats=args.repeats,
          machine=runner.MachineInfo(),
          notes='one core (%d), %d intra-op + %d inter-op threads; override '
          '%r' % (args.core, INTRA_OP_THREADS, INTER_OP_THREADS,
                  args.model_params_override), log=log)
    if Calibrates(args):
      log('calibrating against the executor on the two workers')
      with _Timed('calibrating', log):
        profile = calibrate.CalibrateProfile(
            profile, cluster.target, cluster.devices,
            described.params.layers, described.input_specs,
            calibrate.Rows(rows), loss=described.loss,
            batch_dim=described.params.batch_dim,
            num_layers=args.calibrate_layers,
            handover=args.handover_latency is None, log=log)
  return profile


def _FitToTheTrainer(args, log, profile, started):
  """`profile` fitted to the trainer's reference runs (trainer_fit.Fit).

  Args:
    args: the parsed flags.
    log: a print-like function for progress.
    profile: the layers' profile.Profile.
    started: the trainer's process (``trainer_step.Start``).

  Returns:
    The fitted profile with its ``trainer_reference`` (or `profile` itself,
    with a warning, when the trainer's runs failed).
  """
  from tools.plan import trainer_step  # pylint: disable=g-import-not-at-top
  try:
    with _Timed("timing the trainer's step", log):
      measured = trainer_step.Measure(
          started, profile, args.devices, log=log,
          short_step_runs=(trainer_step.SHORT_STEP_RUNS
                           if args.short_step_runs is None
                           else args.short_step_runs))
  except trainer_step.TrainerStepError as e:
    log('warning: %s; the predictions leave out what the trainer\'s step '
        'adds to the pipeline\'s' % e)
    return profile
  for ref in measured:
    log('the trainer\'s step of %s: %.1f ms (%d traced tasks)' % (
        ref.config.label, 1e3 * ref.seconds, len(ref.tasks)))
  fitted = trainer_fit.Fit(profile, measured, log=log)
  for ref in measured:
    log('  fitted prediction of %s: %.1f ms' % (
        ref.config.label,
        1e3 * simulator.Predict(fitted, ref.config).step_seconds))
  record = trainer_fit.ReferenceRecord(profile, fitted, measured,
                                       args.devices)
  # The reference runs are the trainer's with its defaults: Lingvo's norms
  # built with Square (--square_norms; gpipe/compat/lingvo_norms.py).
  record['square_norms'] = True
  log('the fit\'s largest error: %.0f%% on the measured steps, %.0f%% on '
      'one left out of the fit (the search uses the measured steps, and '
      'ranks the others as if %.0f%% longer)' % (
          100 * record['own_error'], 100 * record['fit_error'],
          100 * record['fit_error']))
  return fitted.Replace(trainer_reference=record)


def Plan(args, log=print):
  """Runs the planner; returns (SearchResult, Plan or None)."""
  # The cap and the device count first: a bad one is said before minutes
  # of measuring.
  cap = (search.ParseBytes(args.memory_per_device)
         if args.memory_per_device else None)
  if args.devices < 1:
    raise ValueError('--devices=%d: give the devices to plan for, >= 1' %
                     args.devices)
  if args.short_step_runs is not None and args.short_step_runs < 1:
    raise ValueError('--short_step_runs=%d: give the runs of a short '
                     'reference, >= 1' % args.short_step_runs)
  if args.profile:
    profile = profile_lib.Load(args.profile)
    search.CheckCapHoldsWeights(
        [layer.param_bytes for layer in profile.layers],
        profile.optimizer_slots, args.devices, cap, args.memory_headroom)
    reference = profile.trainer_reference
    if reference and reference['devices'] != args.devices:
      log('note: the trainer\'s step in this profile was timed on %d '
          'device(s), not %d: what it adds may differ; measure again with '
          '--model for the exact figure' % (reference['devices'],
                                            args.devices))
    if reference and not reference.get('square_norms'):
      log('note: the trainer\'s step in this profile was timed before the '
          'trainer built Lingvo\'s norms with Square ops (--square_norms): '
          'models with large weights now step faster than it says; measure '
          'again with --model')
  elif args.model:
    profile = MeasureProfile(args, log, cap)
  else:
    raise ValueError('give --model (to measure it) or --profile (a saved '
                     'profile)')
  if args.profile_out:
    profile_lib.Save(profile, args.profile_out)
    log('wrote the profile to %s' % args.profile_out)
  options = dict(max_micro_batches=args.max_micro_batches,
                 headroom=args.memory_headroom)
  if args.schedules:
    options['schedules'] = [registry.Get(s).name
                            for s in args.schedules.split(',')]
  result = search.Search(profile, args.devices, cap,
                         update=simulator.UPDATE_ALL_GRADIENTS, **options)
  print(search.Table(result, top=args.top), flush=True)
  print('\nPeak memory keeps each stage\'s gradient sum to the end of the '
        'step: the update reads every gradient before it applies any (as '
        'Lingvo\'s learner does; its scaled copies are not counted).',
        flush=True)
  plan = None
  if result.best:
    plan = choice.FromCandidate(result.best, args.devices, cap,
                                profile.model)
    print('\nBest: %s' % plan.Describe(), flush=True)
    if args.plan_out:
      choice.Save(plan, args.plan_out)
      log('wrote the plan to %s' % args.plan_out)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(search.ToJson(result, top=args.top), f, indent=1,
                sort_keys=True)
  return result, plan


def main(argv=None):
  """Runs the planner; returns the exit status (1: nothing fits, or an error).

  Args:
    argv: the arguments after the program name (default sys.argv[1:]).
  """
  if os.environ.get('BUILD_WORKING_DIRECTORY'):
    os.chdir(os.environ['BUILD_WORKING_DIRECTORY'])
  args = _Parser().parse_args(argv)
  log = lambda *a: print(*a, file=sys.stderr, flush=True)
  try:
    with _Timed('planning', log):
      result, _ = Plan(args, log)
  except (ValueError, RuntimeError) as e:  # Bad input, workers not serving.
    print('plan: error: %s' % e, file=sys.stderr, flush=True)
    return 1
  return 0 if result.best else 1
