"""Trains, evaluates, decodes or inspects a registered GPipe model.

Run from the repository root::

  .venv/bin/python -m tools.trainer --model=image.AmoebaNetD_Digits \\
      --logdir=/tmp/digits --mode=train

or ``bazel run //tools:trainer -- --model=... --logdir=...``. This module
defines the flags (one per setting of ``settings.py``) and dispatches the
mode; the run is settled once by ``run_config.Settle`` and handed to the
loop, evaluation or decoding.

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

import dataclasses
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
from lingvo import compat as tf
# Defines --model_params_override, used below.
from lingvo import model_registry  # pylint: disable=unused-import
from tools.trainer import checkpoints
from tools.trainer import decoder
from tools.trainer import elastic as elastic_lib
from tools.trainer import evaler
from tools.trainer import inspect_model
from tools.trainer import model_select
from tools.trainer import placement as placement_lib
from tools.trainer import remote_tasks
from tools.trainer import planned
from tools.trainer import run_config
from tools.trainer import sessions
from tools.trainer import settings as settings_lib
from tools.trainer import train_loop
# pylint: enable=g-import-not-at-top,wrong-import-position

# The exit status after Ctrl-C (128 + SIGINT, as shells report it).
_SIGINT_EXIT = 128 + signal.SIGINT
# The trainer's flags: one per setting of tools/trainer/settings.py.
settings_lib.DefineFlags()

FLAGS = flags.FLAGS


# The errors a user can cause; they are printed without a traceback.
USER_ERRORS = (model_select.UnknownModelError, run_config.LogdirError,
               checkpoints.CheckpointMismatchError,
               checkpoints.CheckpointCorruptError,
               checkpoints.NoCheckpointError,
               train_loop.NonFiniteLossError, train_loop.WorkerLostError,
               local_cluster.WorkerDiedError, placement_lib.WorkerRestartError,
               devices.DiscoveryError, ValueError)


def _PlanFromFlags(asked):
  """--plan's Plan for the Settings `asked`, or None without --plan."""
  if not asked.plan and (not asked.memory_per_device or asked.elastic):
    # --elastic's moves take --memory_per_device as their cap.
    return None
  if asked.plan and asked.xla:
    # The planner measures uncompiled stages; XLA changes every stage's
    # time (on CPUs a convolution stage ran 12x slower compiled).
    raise planned.PlanError(
        '--plan chooses from uncompiled stages\' measured times, which '
        '--xla changes: drop --xla, or --plan and set the pipeline by hand')
  logdir = run_config.PrepareLogdir(asked.logdir, asked.mode)
  return planned.Resolve(
      asked.plan, asked.model, asked.model_params_override, logdir,
      planned.RunDevices(
          worker_processes=asked.worker_processes,
          cluster_spec=asked.cluster_spec, device_type=asked.device_type,
          devices_per_task=asked.devices_per_task,
          connect_timeout_secs=asked.connect_timeout_secs),
      asked.memory_per_device, functools.partial(print, flush=True),
      settings_lib.Given(FLAGS, (
          'num_stages', 'num_micro_batches', 'schedule', 'data_parallel',
          'fprop_dtype', 'loop_stages')))


def SettleFromFlags(workers=None):
  """The RunConfig of the command line (run_config.Settle).

  Args:
    workers: running local workers for --worker_processes (run_config.Settle),
      or None to start them.
  """
  asked = settings_lib.FromFlags(FLAGS)
  plan = _PlanFromFlags(asked)
  if plan is not None:
    # The plan decides some settings (replicas, dtype, looping) too.
    asked = dataclasses.replace(asked, **planned.RunSettings(plan))
  return run_config.Settle(
      asked, plan=plan,
      input_seed=asked.seed if FLAGS['seed'].present else None,
      workers=workers)


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
      inspect_model.AuditGpus(run.train, run.placement, run.seed, echo=echo,
                              square_norms=run.square_norms)
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
  if run.elastic:
    try:
      return _TrainElastic(run, echo)
    finally:
      train_loop.ForgetKeptGraph()
  evaluate = lambda path: evaler.Evaluate(run, path=path, echo=echo)
  placement = run.placement
  try:
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
  finally:
    # Its training graph, before the final evaluation builds another.
    train_loop.ForgetKeptGraph()
  return _Finish(run, loop, step, path, evaluate, echo)


def _TrainElastic(run, echo):
  """_Train with --elastic: the run moves between shapes (elastic.py)."""
  driver = elastic_lib.Elastic(run, echo)
  # On the shape in use (evaluation follows the moves); a task lost while
  # evaluating is a loss like one while training.
  evaluation = elastic_lib.Evaluation(driver, echo)
  try:
    while True:
      loop = train_loop.TrainLoop(
          driver.run, after_checkpoint=(evaluation.InLoop if run.mode ==
                                        'train_and_eval' else None),
          echo=echo, watch=driver)
      evaluation.loop = loop
      try:
        step, path = loop.Run()
      except (train_loop.WorkerLostError,
              remote_tasks.TaskUnreachableError) as e:
        # A task unreachable before the first step: lost during the move.
        if loop.stop_requested:
          raise  # Ctrl-C or SIGTERM came first: stop, as asked.
        driver.AfterLoss(e, loop)
        continue
      if not loop.moved:
        break
      driver.Move(loop)
    train_loop.ForgetKeptGraph()  # Before the final evaluation's graph.
    # A move no step followed (the last checkpoint's evaluation lost a
    # task) is written as done; no move is made after training: the watch
    # stops (a loss during the final evaluation still moves the run).
    driver.Settle()
    driver.Close()
    return _Finish(driver.run, loop, step, path, evaluation.Final, echo)
  finally:
    driver.Close()


def _Finish(run, loop, step, path, evaluate, echo):
  """After training: the stop signal's status, or the final evaluation."""
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
    if sessions.AbandonedSessions() or remote_tasks.AbandonedSessions():
      # A session of workers lost before a restart cannot be closed (it
      # would wait for them forever): skip the interpreter's cleanup.
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
    return code
  except (train_loop.WorkerLostError, placement_lib.WorkerRestartError,
          remote_tasks.TaskUnreachableError, elastic_lib.ElasticError) as e:
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
    if sessions.AbandonedSessions() or remote_tasks.AbandonedSessions():
      os._exit(_SIGINT_EXIT)  # pylint: disable=protected-access
    return _SIGINT_EXIT


