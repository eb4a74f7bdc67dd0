"""Trains, evaluates, decodes or inspects a registered GPipe model.

Run from the repository root::

  .venv/bin/python -m tools.trainer --model=image.AmoebaNetD_Digits \\
      --logdir=/tmp/digits --mode=train

or ``bazel run //tools:trainer -- --model=... --logdir=...``.

Modes:

* ``train``: trains to --max_steps (default: the params' p.train.max_steps),
  resuming from the newest checkpoint in --logdir; then evaluates on the
  model's Test() input and prints the test metrics (e.g. accuracy).
* ``train_and_eval``: like train, evaluating on Test() after every checkpoint.
* ``eval`` / ``decode``: evaluates / decodes the newest checkpoint on Test().
* ``inspect_model``: prints every layer and stage with its parameter count,
  ending with ``total params: N``, without allocating weights.

Where the stages run: by default K virtual CPU devices in this process;
``--worker_processes=K`` starts K local TensorFlow worker processes, one
stage each; ``--cluster_spec=worker=host:port,...`` uses running servers
(``python -m gpipe.worker``).
"""

import faulthandler
import functools
import os
import signal
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
from gpipe import lingvo_import  # pylint: disable=unused-import
from absl import app
from absl import flags
from absl import logging
from gpipe import local_cluster
from lingvo import compat as tf
# Defines --model_params_override, used below.
from lingvo import model_registry  # pylint: disable=unused-import
from tools import checkpoints
from tools import decoder
from tools import evaler
from tools import inspect_model
from tools import model_select
from tools import placement as placement_lib
from tools import train_loop
# pylint: enable=g-import-not-at-top,wrong-import-position

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
    "Existing TensorFlow servers, 'worker=host:port,host:port': stage k on "
    'worker k.')
flags.DEFINE_integer('checkpoint_every_n_steps', 100, 'Checkpoint period.')
flags.DEFINE_integer('log_every_n_steps', 10,
                     'Console progress line and summary period.')
flags.DEFINE_integer(
    'trace_every_n_steps', 100,
    'Trace a step this often for the timeline, bubbles and peak memory '
    '(also the 2nd step of each run); 0: never.')
flags.DEFINE_integer('seed', 1234,
                     'Random seed (graph; and the input order when given).')
flags.DEFINE_integer('step_timeout_secs', 300,
                     'A session run longer than this fails (lost workers).')
flags.DEFINE_bool('eval_after_train', True,
                  'In train mode, evaluate on Test() at the end.')
flags.DEFINE_integer('decode_max_batches', None,
                     'Decode at most this many batches (default: all).')

FLAGS = flags.FLAGS


class LogdirError(ValueError):
  """--logdir is missing or cannot be written."""


# The errors a user can cause; they are printed without a traceback.
USER_ERRORS = (model_select.UnknownModelError, LogdirError,
               checkpoints.CheckpointMismatchError,
               checkpoints.CheckpointCorruptError,
               train_loop.NonFiniteLossError, train_loop.WorkerLostError,
               local_cluster.WorkerDiedError, evaler.NoCheckpointError,
               ValueError)


def PrepareLogdir(logdir):
  """Creates logdir and checks that files can be written there."""
  if not logdir:
    raise LogdirError('--logdir is required for --mode=%s' % FLAGS.mode)
  if not os.path.isabs(logdir) and os.environ.get('BUILD_WORKING_DIRECTORY'):
    # `bazel run` starts binaries in their runfiles: relative paths mean the
    # user's directory.
    logdir = os.path.join(os.environ['BUILD_WORKING_DIRECTORY'], logdir)
  probe = os.path.join(logdir, '.write_test_%d' % os.getpid())
  try:
    os.makedirs(logdir, exist_ok=True)
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise LogdirError(
        '--logdir=%s is not writable (%s: %s): choose a directory you can '
        'create and write to' % (logdir, type(e).__name__, e.strerror or e))
  return os.path.abspath(logdir)


class Run:
  """One invocation: the model's params, placement and the chosen mode."""

  def __init__(self, echo=None):
    # Flushed: progress must show up at once when stdout is a file or pipe.
    self._echo = echo or functools.partial(print, flush=True)
    self._placement = None

  def Params(self, dataset):
    """Model params for `dataset`, with the flags' overrides applied."""
    cfg = model_select.ModelParams(FLAGS.model, dataset,
                                   FLAGS.model_params_override)
    model_select.SetPipelineShape(cfg, FLAGS.num_stages,
                                  FLAGS.num_micro_batches)
    if FLAGS['seed'].present and cfg.input is not None and (
        'seed' in cfg.input):
      cfg.input.seed = FLAGS.seed
    if self._placement is not None:
      model_select.SetStageDevices(
          cfg, self._placement.devices,
          keep_explicit=not self._placement.distributed,
          loop=FLAGS.loop_stages and self._placement.distributed)
    return cfg

  def Main(self):
    """Runs --mode; returns the process exit code."""
    if FLAGS.mode == 'inspect_model':
      inspect_model.Inspect(self.Params('Train'), echo=self._echo)
      return 0
    logdir = PrepareLogdir(FLAGS.logdir)
    num_stages = model_select.MaxStages(self.Params('Train'))
    self._placement = placement_lib.Placement(
        num_stages, worker_processes=FLAGS.worker_processes,
        cluster_spec=FLAGS.cluster_spec,
        step_timeout_secs=FLAGS.step_timeout_secs,
        log_dir=os.path.join(logdir, 'workers'), pin_cores=FLAGS.pin_cores)
    if self._placement.cluster is not None:
      self._echo('started %d worker processes (pids %s) serving %s' %
                 (FLAGS.worker_processes, self._placement.cluster.pids,
                  ', '.join(self._placement.cluster.ClusterSpecDict()
                            ['worker'])))
    try:
      return self._Mode(logdir)
    finally:
      self._placement.Stop()

  def _Evaluate(self, logdir, path=None):
    return evaler.Evaluate(self.Params('Test'), self._placement, logdir,
                           seed=FLAGS.seed, path=path, echo=self._echo)

  def _Mode(self, logdir):
    mode = FLAGS.mode
    if mode == 'eval':
      self._Evaluate(logdir)
    elif mode == 'decode':
      decoder.Decode(self.Params('Test'), self._placement, logdir,
                     seed=FLAGS.seed, max_batches=FLAGS.decode_max_batches,
                     echo=self._echo)
    else:
      after_checkpoint = None
      if mode == 'train_and_eval':
        after_checkpoint = lambda path: self._Evaluate(logdir, path)
      loop = train_loop.TrainLoop(
          self.Params, self._placement, logdir, max_steps=FLAGS.max_steps,
          seed=FLAGS.seed,
          checkpoint_every_n_steps=FLAGS.checkpoint_every_n_steps,
          log_every_n_steps=FLAGS.log_every_n_steps,
          trace_every_n_steps=FLAGS.trace_every_n_steps,
          after_checkpoint=after_checkpoint, echo=self._echo)
      step, path = loop.Run()
      if mode == 'train' and FLAGS.eval_after_train and path:
        _, metrics = self._Evaluate(logdir, path)
        for name in ('accuracy', 'top5_accuracy', 'bleu'):
          if name in metrics:
            self._echo('final test %s: %.4f (step %d, %d test examples)' %
                       (name, metrics[name], step, metrics['num_examples']))
      self._echo('TensorBoard: .venv/bin/tensorboard --logdir %s' % logdir)
    return 0


def main(argv):
  # `kill -USR1 <pid>` prints every thread's Python stack (a stuck run).
  faulthandler.register(signal.SIGUSR1, file=sys.__stderr__)
  if len(argv) > 1:
    raise app.UsageError('unexpected arguments: %s' % ' '.join(argv[1:]))
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel('WARNING')
  try:
    return Run().Main()
  except train_loop.WorkerLostError as e:
    print('trainer: error: %s' % e, file=sys.stderr, flush=True)
    sys.stdout.flush()
    # The session to the lost worker cannot be closed (it would wait for the
    # worker forever), so skip the interpreter's cleanup. The workers are
    # already stopped and every file is closed.
    os._exit(1)  # pylint: disable=protected-access
  except USER_ERRORS as e:
    print('trainer: error: %s' % e, file=sys.stderr, flush=True)
    return 1


if __name__ == '__main__':
  app.run(main)
