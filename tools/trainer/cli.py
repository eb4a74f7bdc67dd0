"""Trains, evaluates, decodes or inspects a registered GPipe model.

Run from the repository root::

  .venv/bin/python -m tools.trainer --model=image.AmoebaNetD_Digits \\
      --logdir=/tmp/digits --mode=train

or ``bazel run //tools:trainer -- --model=... --logdir=...``. This module
holds the flags and the mode dispatch; the run is settled once by
``run_config.Settle`` and handed to the loop, evaluation or decoding.

Modes:

* ``train``: trains to --max_steps (default: the params' p.train.max_steps),
  resuming from the newest checkpoint in --logdir; then evaluates on the
  model's Test() input and prints the test metrics (e.g. accuracy).
* ``train_and_eval``: like train, evaluating on Test() after every checkpoint.
* ``eval`` / ``decode``: evaluates / decodes the newest checkpoint on Test().
* ``inspect_model``: prints every layer and stage with its parameter count,
  ending with ``total params: N``, without allocating weights; with the
  stages on GPUs (``--device_type=gpu``, also with ``--cluster_spec`` and
  ``--devices_per_task``: no GPU needed here) then the GPU audit of the
  training graph (tools/trainer/inspect_model.py).

Where the stages run: by default K virtual CPU devices in this process;
``--worker_processes=K`` starts K local TensorFlow worker processes, one
stage each; ``--cluster_spec=worker=host:port,...`` (or ``TF_CONFIG`` in the
environment) uses running workers (``python -m gpipe.worker``) and their
devices (``--device_type``, ``--devices_per_task``; tools/trainer/placement.py).
"""

import faulthandler
import functools
import os
import signal
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import app
from absl import flags
from absl import logging
from gpipe.runtime import devices
from gpipe.runtime import local_cluster
from gpipe.schedules import registry as schedule_registry
from lingvo import compat as tf
# Defines --model_params_override, used below.
from lingvo import model_registry  # pylint: disable=unused-import
from tools.trainer import checkpoints
from tools.trainer import decoder
from tools.trainer import evaler
from tools.trainer import inspect_model
from tools.trainer import model_select
from tools.trainer import placement as placement_lib
from tools.trainer import remote_tasks
from tools.trainer import planned
from tools.trainer import run_config
from tools.trainer import train_loop
# pylint: enable=g-import-not-at-top,wrong-import-position

# The exit status after Ctrl-C (128 + SIGINT, as shells report it).
_SIGINT_EXIT = 128 + signal.SIGINT
MODES = ('train', 'eval', 'decode', 'train_and_eval', 'inspect_model')
DEFAULT_MODEL = 'image.AmoebaNetD_Digits'

flags.DEFINE_string(
    'model', DEFAULT_MODEL,
    'The registered model: family.ClassName (params/family.py).')
flags.DEFINE_string('logdir', None,
                    'The run directory: checkpoints, event files, logs.')
flags.DEFINE_enum('mode', 'train', MODES, 'What to do.')
flags.DEFINE_integer('max_steps', None,
                     'Train to this global step (default: p.train.max_steps).')
flags.DEFINE_integer('num_stages', None,
                     'Override K, the pipeline stages of the model.')
flags.DEFINE_integer('num_micro_batches', None,
                     'Override M, the micro-batches per mini-batch.')
flags.DEFINE_enum(
    'schedule', None, schedule_registry.Names(),
    'Override the pipeline schedule: ' + schedule_registry.ParamDoc() +
    '. See gpipe/schedules/ and the README table.')
flags.DEFINE_bool(
    'xla', False,
    "Compile every pipeline stage function with XLA (the pipelines' "
    "compile='xla', gpipe/xla.py): fused stages, compiled at the first "
    'step; an op XLA cannot compile is an error naming it. See '
    'docs/TRAINER.md.')
flags.DEFINE_integer(
    'worker_processes', 0,
    'Start this many local TensorFlow worker processes, one stage on each.')
flags.DEFINE_bool(
    'loop_stages', False,
    'With fewer workers/devices than stages: place stage k on worker k mod '
    'D, several stages per worker, run breadth-first (smaller bubble).')
flags.DEFINE_bool('pin_cores', False,
                  'With --worker_processes: pin worker i to core i.')
flags.DEFINE_string(
    'cluster_spec', '',
    "Running workers (python -m gpipe.worker): 'worker=host:port,host:port', "
    'a JSON cluster dict or TF_CONFIG JSON (default: $TF_CONFIG, if set). '
    'Stages are laid out on their devices task by task.')
# Devices of a cluster (tools/trainer/placement.py, gpipe/runtime/).
flags.DEFINE_enum(
    'device_type', 'auto', ['auto', 'cpu', 'gpu', 'tpu'],
    'The devices stages run on: auto is the GPUs every worker task has, '
    'else CPU. tpu stops at once, saying what TPUs the run has: stages on '
    'TPU cores are not built (docs/TPU.md).')
flags.DEFINE_integer(
    'devices_per_task', 0,
    'Use the first N devices of --device_type on each worker task (0: all). '
    'With --worker_processes: virtual CPUs per local worker. With '
    '--mode=inspect_model and a cluster: plan N devices per task without '
    'connecting; with --mode=inspect_model --device_type=gpu and no '
    'cluster: plan N GPUs in this process (default: as many as the stages '
    'need; no GPU needed).')
flags.DEFINE_float(
    'connect_timeout_secs', 10,
    'The longest each check of a running worker (reachable, serving as '
    'its task, its devices) may take before the run stops with its address.')
flags.DEFINE_string(
    'fprop_dtype', 'float32',
    "Compute dtype of the model's layers: 'float32', or 'bfloat16' for mixed "
    'precision (variables, optimizer slots, gradient accumulation and the '
    'loss stay float32; see gpipe/precision.py). float16 is refused (it '
    'needs loss scaling).')
flags.DEFINE_integer(
    'data_parallel', 1,
    'R: train R data-parallel replicas of the pipeline on R x K workers '
    '(--worker_processes=R*K or --cluster_spec with R*K servers; default: '
    'R x K virtual CPUs). Replica r takes 1/R of each mini-batch on workers '
    'r*K .. r*K+K-1; the gradients are summed in the graph, one update, one '
    'copy of the variables (checkpoints do not depend on R).')
flags.DEFINE_integer(
    'max_worker_restarts', 0,
    'When a worker dies, restore the newest checkpoint and go on, at most '
    'this many times (0: stop with an error). With --worker_processes the '
    'trainer stops the workers and starts fresh ones; with a running cluster '
    '(--cluster_spec or TF_CONFIG) it names the lost task and waits up to '
    '--worker_wait_secs for its supervisor to start it again at the same '
    'address.')
flags.DEFINE_float(
    'worker_wait_secs', 300,
    'With a running cluster and --max_worker_restarts: how long to wait for '
    'lost servers to serve again before stopping with the reason.')
flags.DEFINE_integer('checkpoint_every_n_steps', 100, 'Checkpoint period.')
flags.DEFINE_integer('log_every_n_steps', 10,
                     'Console progress line and summary period.')
flags.DEFINE_integer(
    'trace_every_n_steps', 100,
    'Trace a step this often for the timeline, bubbles and peak memory '
    '(also the 2nd step of each run); 0: never.')
flags.DEFINE_integer('seed', 1234,
                     'Random seed (graph; and the input order when given).')
flags.DEFINE_bool(
    'session_graph_optimizer', False,
    "Run Grappler's meta-optimizer over the session's graph. Off by "
    'default: the stage functions are still optimized on their workers, and '
    "on a large pipeline the whole-graph passes cost much of the first "
    "step and of the session master's memory.")
flags.DEFINE_integer('step_timeout_secs', 300,
                     'A session run longer than this fails (lost workers).')
flags.DEFINE_bool('eval_after_train', True,
                  'In train mode, evaluate on Test() at the end.')
flags.DEFINE_integer('decode_max_batches', None,
                     'Decode at most this many batches (default: all).')
# Pipelined decoding (tasks/mt/pipelined_decode.py, gpipe/lanes.py).
flags.DEFINE_integer(
    'decode_micro_batches', None,
    'M: decode each batch in M lanes through the pipeline stages (must '
    'divide the batch; default K lanes for the K stages of the decoding '
    'loop, 1 for K = 1).')
flags.DEFINE_bool(
    'pipelined_decode', None,
    'Decode through the pipeline stages on their devices, in lanes '
    '(default for models that can); --nopipelined_decode runs the '
    'unpipelined decoder, for comparison.')

# The planner (tools/trainer/planned.py, gpipe/plan/).
flags.DEFINE_string(
    'plan', '',
    "'auto': measure the model, simulate every configuration for the run's "
    'devices (those the stages are laid out on: every device of the local '
    'workers or cluster tasks, --devices_per_task of each if given; else '
    "this process's GPUs, else the cores) under --memory_per_device, print "
    'the table and train the fastest that fits; or a plan file from python '
    '-m tools.plan --plan_out for that many devices. Sets K, the cut, M, '
    'schedule, remat, batched weight gradients, --data_parallel and '
    '--fprop_dtype; written to <logdir>/plan.json.')
flags.DEFINE_string('memory_per_device', '',
                    "With --plan=auto: each device's memory, e.g. '16GiB'.")

FLAGS = flags.FLAGS


# The errors a user can cause; they are printed without a traceback.
USER_ERRORS = (model_select.UnknownModelError, run_config.LogdirError,
               checkpoints.CheckpointMismatchError,
               checkpoints.CheckpointCorruptError,
               checkpoints.NoCheckpointError,
               train_loop.NonFiniteLossError, train_loop.WorkerLostError,
               local_cluster.WorkerDiedError, placement_lib.WorkerRestartError,
               devices.DiscoveryError, ValueError)


def _PlanFromFlags():
  """(--plan's Plan or None, the run settings it decides)."""
  if not FLAGS.plan and not FLAGS.memory_per_device:
    return None, {}
  if FLAGS.plan and FLAGS.xla:
    # The planner measures uncompiled stages; XLA changes every stage's
    # time (on CPUs a convolution stage ran 12x slower compiled).
    raise planned.PlanError(
        '--plan chooses from uncompiled stages\' measured times, which '
        '--xla changes: drop --xla, or --plan and set the pipeline by hand')
  logdir = run_config.PrepareLogdir(FLAGS.logdir, FLAGS.mode)
  plan = planned.Resolve(
      FLAGS.plan, FLAGS.model, FLAGS.model_params_override, logdir,
      planned.RunDevices(
          worker_processes=FLAGS.worker_processes,
          cluster_spec=FLAGS.cluster_spec, device_type=FLAGS.device_type,
          devices_per_task=FLAGS.devices_per_task,
          connect_timeout_secs=FLAGS.connect_timeout_secs),
      FLAGS.memory_per_device, functools.partial(print, flush=True),
      {name: FLAGS[name].present or FLAGS[name].value != FLAGS[name].default
       for name in (
          'num_stages', 'num_micro_batches', 'schedule', 'data_parallel',
          'fprop_dtype', 'loop_stages')})
  return plan, planned.RunSettings(plan)


def SettleFromFlags():
  """The RunConfig of the command line (run_config.Settle)."""
  plan, decided = _PlanFromFlags()
  return run_config.Settle(
      FLAGS.model, FLAGS.mode, logdir=FLAGS.logdir,
      override=FLAGS.model_params_override, num_stages=FLAGS.num_stages,
      num_micro_batches=FLAGS.num_micro_batches, schedule=FLAGS.schedule,
      xla=FLAGS.xla, input_seed=FLAGS.seed if FLAGS['seed'].present else None,
      worker_processes=FLAGS.worker_processes,
      cluster_spec=FLAGS.cluster_spec, pin_cores=FLAGS.pin_cores,
      loop_stages=decided.get('loop_stages', FLAGS.loop_stages),
      fprop_dtype=decided.get('fprop_dtype', FLAGS.fprop_dtype),
      step_timeout_secs=FLAGS.step_timeout_secs, plan=plan,
      data_parallel=decided.get('data_parallel', FLAGS.data_parallel),
      max_worker_restarts=FLAGS.max_worker_restarts,
      worker_wait_secs=FLAGS.worker_wait_secs,
      device_type=FLAGS.device_type, devices_per_task=FLAGS.devices_per_task,
      connect_timeout_secs=FLAGS.connect_timeout_secs, seed=FLAGS.seed,
      max_steps=FLAGS.max_steps,
      checkpoint_every_n_steps=FLAGS.checkpoint_every_n_steps,
      log_every_n_steps=FLAGS.log_every_n_steps,
      trace_every_n_steps=FLAGS.trace_every_n_steps,
      eval_after_train=FLAGS.eval_after_train,
      decode_max_batches=FLAGS.decode_max_batches,
      decode_micro_batches=FLAGS.decode_micro_batches,
      pipelined_decode=FLAGS.pipelined_decode,
      session_graph_optimizer=FLAGS.session_graph_optimizer)


def Main(run, echo):
  """Runs run.mode; returns the process exit code.

  Args:
    run: the settled RunConfig (its local workers, if any, are stopped
      before returning).
    echo: prints a console line.
  """
  if run.mode == 'inspect_model':
    inspect_model.Inspect(run.train, echo=echo)
    if inspect_model.HasGpuStages(run.placement):
      inspect_model.AuditGpus(run.train, run.placement, run.seed, echo=echo)
    return 0
  placement = run.placement
  try:
    if placement.cluster is not None:
      echo('started %d worker processes (pids %s) serving %s' %
           (len(placement.cluster.pids), placement.cluster.pids,
            ', '.join(placement.cluster.ClusterSpecDict()['worker'])))
    if placement.description is not None:
      echo('cluster from %s: %d worker task(s) at %s; stages on %d %s '
           'device(s)' % (placement.description.source,
                          placement.description.num_tasks,
                          ', '.join(placement.description.workers),
                          len(placement.devices), placement.device_type))
    if run.mode == 'eval':
      evaler.Evaluate(run, echo=echo)
    elif run.mode == 'decode':
      decoder.Decode(run, echo=echo)
    else:
      code = _Train(run, echo)
      if code:
        return code
    if placement.cluster is not None:
      peaks = placement.cluster.PeakRssBytes()
      echo('worker peak memory (VmHWM): %s' % ', '.join(
          '%d: %s' % (i, '%.0f MiB' % (b / 2**20) if b else '?')
          for i, b in enumerate(peaks)))
    return 0
  finally:
    placement.Stop()


def _Train(run, echo):
  """Modes train and train_and_eval; returns 0, or the stop signal's status.

  A run stopped by SIGTERM or Ctrl-C before max_steps (its step finished
  and saved) skips the final evaluation and exits with the signal's status (143, 130), as a
  process killed by it would: a supervisor (Slurm's requeue, a Kubernetes
  Job) must not read a preempted run as finished, and a grace period after
  SIGTERM is too short for an evaluation.
  """
  evaluate = lambda path: evaler.Evaluate(run, path=path, echo=echo)
  placement = run.placement
  while True:
    loop = train_loop.TrainLoop(
        run,
        after_checkpoint=evaluate if run.mode == 'train_and_eval' else None,
        echo=echo)
    try:
      step, path = loop.Run()
      break
    except train_loop.WorkerLostError as e:
      if not run.max_worker_restarts or loop.stop_requested:
        # Ctrl-C or SIGTERM came first: stop, as asked, with the error.
        raise
      if placement.restarts >= run.max_worker_restarts:
        raise train_loop.WorkerLostError('%s%s' % (e, train_loop.GaveUpNote(
            placement.restarts, run.max_worker_restarts))) from e
      # The error's advice (run the command again) is what happens next.
      echo('worker lost: %s' % e.summary)
      if placement.remote is not None:
        _AwaitRemoteTasks(run, echo)
        continue
      echo('restarting the worker processes (restart %d of %d), then '
           'resuming from the newest checkpoint' %
           (placement.restarts + 1, run.max_worker_restarts))
      placement.Restart()
      echo('restarted %d worker processes (pids %s) serving %s' %
           (len(placement.cluster.pids), placement.cluster.pids,
            ', '.join(placement.cluster.ClusterSpecDict()['worker'])))
  if loop.interrupted:
    echo('stopped by %s after step %d (saved %s): no evaluation; run the '
         'same command to resume' % (loop.interrupted, step, path))
    return 128 + signal.Signals[loop.interrupted].value
  if run.mode == 'train' and run.eval_after_train and path:
    _, metrics = evaluate(path)
    for name in ('accuracy', 'top5_accuracy', 'bleu'):
      if name in metrics:
        echo('final test %s: %.4f (step %d, %d test examples)' %
             (name, metrics[name], step, metrics['num_examples']))
  echo('TensorBoard: .venv/bin/tensorboard --logdir %s' % run.logdir)
  return 0


def _AwaitRemoteTasks(run, echo):
  """Waits for the servers of --cluster_spec to serve again (a restart)."""
  placement = run.placement
  echo('waiting up to %g s (--worker_wait_secs) for every task to serve '
       'again (restart %d of %d), then resuming from the newest checkpoint' %
       (placement.worker_wait_secs, placement.restarts + 1,
        run.max_worker_restarts))
  started = time.time()
  placement.Restart()
  echo('every task serves again after %.1f s: %s' % (
      time.time() - started, ', '.join(placement.remote.addresses)))


def main(argv):
  # `kill -USR1 <pid>` prints every thread's Python stack (a stuck run).
  faulthandler.register(signal.SIGUSR1, file=sys.__stderr__)
  if len(argv) > 1:
    raise app.UsageError('unexpected arguments: %s' % ' '.join(argv[1:]))
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel('WARNING')
  # Flushed: progress must show up at once when stdout is a file or pipe.
  echo = functools.partial(print, flush=True)
  try:
    code = Main(SettleFromFlags(), echo)
    if train_loop.AbandonedSessions() or remote_tasks.AbandonedSessions():
      # A session of workers lost before a restart cannot be closed (it
      # would wait for them forever): skip the interpreter's cleanup.
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
    return code
  except (train_loop.WorkerLostError, placement_lib.WorkerRestartError,
          remote_tasks.TaskUnreachableError) as e:
    print('trainer: error: %s' % e, file=sys.stderr, flush=True)
    sys.stdout.flush()
    # The session to the lost worker cannot be closed (it would wait for the
    # worker forever), so skip the interpreter's cleanup. The workers are
    # already stopped and every file is closed.
    os._exit(1)  # pylint: disable=protected-access
  except USER_ERRORS as e:
    print('trainer: error: %s' % e, file=sys.stderr, flush=True)
    return 1
  except KeyboardInterrupt:
    # Ctrl-C outside the training loop (set-up, evaluation), or a second one
    # in it (the loop said what it saved): stop without a traceback, with
    # the shell's status for SIGINT.
    print('trainer: stopped by Ctrl-C', file=sys.stderr, flush=True)
    sys.stdout.flush()
    if train_loop.AbandonedSessions() or remote_tasks.AbandonedSessions():
      os._exit(_SIGINT_EXIT)  # pylint: disable=protected-access
    return _SIGINT_EXIT


