"""Checkpoints of a training run in its logdir: save, find, check, restore.

A checkpoint holds every global variable: weights, optimizer slots (Adam's
moments, RMSProp's accumulators...), batch-norm moving averages and the global
step. The global step is also the input position: each step consumes one
batch, so a resumed run skips that many batches (the input generator's
``skip_batches``) and sees exactly the data an uninterrupted run would.

Before restoring, the checkpoint's variables are compared with the graph's:
a checkpoint of another model is reported by name and left untouched, and one
whose files cannot be read is reported with the older checkpoints to go back
to.
"""

import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf

PREFIX = 'ckpt'


class CheckpointMismatchError(ValueError):
  """The newest checkpoint in logdir belongs to a different model."""


class CheckpointCorruptError(ValueError):
  """A checkpoint's files cannot be read (truncated, overwritten, missing)."""


class NoCheckpointError(ValueError):
  """Evaluation or decoding needs a trained checkpoint."""


def _Others(path):
  """The logdir's other checkpoints, newest first (from its state file)."""
  state = tf.train.get_checkpoint_state(os.path.dirname(path))
  listed = list(state.all_model_checkpoint_paths) if state else []
  return [p for p in reversed(listed) if os.path.basename(p) !=
          os.path.basename(path)]


def _Corrupt(path, error):
  others = _Others(path)
  if others:
    fix = ('To resume from the previous one, move %s.* out of the logdir and '
           'edit the first line of %s to model_checkpoint_path: "%s" (older '
           'ones: %s); or start over with a new --logdir.' % (
               os.path.basename(path),
               os.path.join(os.path.dirname(path), 'checkpoint'),
               os.path.basename(others[0]),
               ', '.join(os.path.basename(o) for o in others[1:]) or 'none'))
  else:
    fix = 'There is no other checkpoint; start over with a new --logdir.'
  # TensorFlow puts the reader's reason last, after the graph-execution
  # context and before the failing node's name in [[...]].
  lines = [l.strip() for l in str(getattr(error, 'message', error)).split('\n')]
  lines = [l for l in lines if l]
  node = [i for i, l in enumerate(lines) if l.startswith('[[')]
  reason = lines[node[0] - 1] if node and node[0] else (
      lines[-1] if lines else '')
  return CheckpointCorruptError(
      'the checkpoint %s cannot be read (%s: %s). Its files were left '
      'untouched. %s' % (path, type(error).__name__, reason, fix))


def Newest(logdir):
  """The path of the newest checkpoint in `logdir`, or None."""
  return tf.train.latest_checkpoint(logdir)


def Choose(logdir, path=None):
  """The checkpoint to evaluate or decode: `path`, else the newest in logdir.

  Raises:
    NoCheckpointError: logdir has none, with the command that makes one.
  """
  path = path or Newest(logdir)
  if not path:
    raise NoCheckpointError(
        'no checkpoint in --logdir=%s: train first (--mode=train or '
        'train_and_eval with the same --logdir)' % logdir)
  return path


def GlobalStepOf(path):
  """The global step stored in checkpoint `path`."""
  try:
    return int(tf.train.load_variable(path, 'global_step'))
  except (tf.errors.OpError, OSError) as e:
    raise _Corrupt(path, e) from None


def Compare(path, variables):
  """Differences between checkpoint `path` and `variables`.

  Args:
    path: a checkpoint path.
    variables: the graph's variables to restore.

  Returns:
    (missing, unexpected, mismatched): names in the graph but not the
    checkpoint (trainable ones first); names in the checkpoint but not the
    graph; and 'name: checkpoint shape vs graph shape' strings.
  """
  try:
    in_ckpt = dict(tf.train.list_variables(path))
  except (tf.errors.OpError, OSError) as e:
    raise _Corrupt(path, e) from None
  in_graph = {v.op.name: v.shape.as_list() for v in variables}
  # Weights first, then optimizer slots and other bookkeeping.
  trainable = {
      v.op.name for v in variables if getattr(v, 'trainable', False)
  }
  missing = sorted(set(in_graph) - set(in_ckpt),
                   key=lambda n: (n not in trainable, n))
  unexpected = sorted(set(in_ckpt) - set(in_graph))
  mismatched = [
      '%s: checkpoint %s vs model %s' % (n, in_ckpt[n], in_graph[n])
      for n in sorted(set(in_graph) & set(in_ckpt))
      if list(in_ckpt[n]) != list(in_graph[n])
  ]
  return missing, unexpected, mismatched


def _Listed(names, limit=8):
  shown = ', '.join(names[:limit])
  if len(names) > limit:
    shown += ', ... (%d more)' % (len(names) - limit)
  return shown


def CheckCompatible(path, variables, allow_unexpected=False):
  """Raises CheckpointMismatchError naming the variables that differ.

  Args:
    path: a checkpoint path.
    variables: the graph's variables.
    allow_unexpected: accept checkpoint variables the graph lacks (an eval
      graph has no optimizer slots).
  """
  missing, unexpected, mismatched = Compare(path, variables)
  if allow_unexpected:
    unexpected = []
  if not (missing or unexpected or mismatched):
    return
  parts = []
  if missing:
    parts.append('%d variable(s) of this model are not in the checkpoint: %s'
                 % (len(missing), _Listed(missing)))
  if unexpected:
    parts.append('%d checkpoint variable(s) are not in this model: %s' %
                 (len(unexpected), _Listed(unexpected)))
  if mismatched:
    parts.append('%d variable(s) have other shapes: %s' %
                 (len(mismatched), _Listed(mismatched, 4)))
  raise CheckpointMismatchError(
      'the checkpoint %s was written by a different model (or different '
      'model params): %s. It was left untouched. Use a new --logdir for this '
      'model, or the --model/--model_params_override that wrote it.' %
      (path, '; '.join(parts)))


class Checkpointer:
  """Saves and restores all global variables under `logdir`/ckpt-<step>."""

  def __init__(self, logdir, max_to_keep=5, for_eval=False):
    """Creates the Saver; call after the model's graph is built.

    Args:
      logdir: the run's directory.
      max_to_keep: how many recent checkpoints to keep.
      for_eval: restore only (the checkpoint may hold training-only
        variables, such as optimizer slots, that this graph lacks).
    """
    self._logdir = logdir
    self._for_eval = for_eval
    self._variables = tf.compat.v1.global_variables()
    self._saver = tf.compat.v1.train.Saver(
        var_list=self._variables, max_to_keep=max_to_keep,
        save_relative_paths=True)
    # One op telling whether every float variable is finite: a state with a
    # NaN/Inf weight is never saved over the last good checkpoint.
    checks = [
        tf.reduce_all(tf.math.is_finite(v)) for v in self._variables
        if v.dtype.base_dtype.is_floating
    ]
    self._all_finite = tf.reduce_all(tf.stack(checks)) if checks else None

  @property
  def variables(self):
    return list(self._variables)

  def RestoreNewest(self, sess):
    """Restores the newest checkpoint, after checking it fits the model.

    Args:
      sess: the session.

    Returns:
      The restored checkpoint path, or None if logdir has none.
    """
    path = Newest(self._logdir)
    if path is None:
      return None
    self.RestoreFrom(sess, path)
    return path

  def RestoreFrom(self, sess, path):
    """Restores checkpoint `path` (checked like RestoreNewest)."""
    CheckCompatible(path, self._variables, allow_unexpected=self._for_eval)
    try:
      self._saver.restore(sess, path)
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError,
            tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
      raise _Corrupt(path, e) from None

  def AllFinite(self, sess, options=None):
    """True if every float variable holds only finite values."""
    if self._all_finite is None:
      return True
    return bool(sess.run(self._all_finite, options=options))

  def Save(self, sess, step, options=None):
    """Writes logdir/ckpt-<step>; returns its path.

    Args:
      sess: the session.
      step: the global step (the checkpoint's suffix).
      options: optional RunOptions for the finiteness check (a timeout).

    Raises:
      FloatingPointError: a variable holds NaN/Inf (nothing is written).
    """
    if not self.AllFinite(sess, options):
      raise FloatingPointError(
          'a model variable holds NaN or Inf at step %d: not saving it over '
          'the last good checkpoint (%s)' % (step, Newest(self._logdir)))
    return self._saver.save(
        sess, os.path.join(self._logdir, PREFIX), global_step=step,
        write_meta_graph=False)
