"""Evaluation of a checkpoint on a held-out input (the model's Test()).

Builds the model's eval graph (dropout and drop path off, batch norm on its
moving averages), restores a checkpoint of the run, and runs the task's
metrics over the input until it ends (an input with ``repeat=False``) or
until ``p.eval.samples_per_summary`` examples. Each metric is averaged with
its weights (e.g. accuracy weighted by batch size), written to TensorBoard
under ``<logdir>/eval_<dataset>`` and returned.
"""

import os

from gpipe import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from tools import checkpoints
from tools import model_graph
from tools import summaries


class NoCheckpointError(ValueError):
  """Evaluation or decoding needs a trained checkpoint."""


def CheckpointToUse(logdir, path=None):
  """`path`, or the newest checkpoint in logdir (a clear error if none)."""
  path = path or checkpoints.Newest(logdir)
  if not path:
    raise NoCheckpointError(
        'no checkpoint in --logdir=%s: train first (--mode=train or '
        'train_and_eval with the same --logdir)' % logdir)
  return path


def _ExampleBudget(task, input_params, dataset):
  """Examples to evaluate: p.eval.samples_per_summary (0: the whole input)."""
  budget = task.params.eval.samples_per_summary
  repeats = 'repeat' in input_params and input_params.repeat
  if repeats and not budget:
    raise ValueError(
        'the %s input repeats forever and p.eval.samples_per_summary is 0: '
        'set one of them so evaluation ends' % dataset)
  return budget


def Evaluate(cfg, placement, logdir, seed=1234, dataset='Test', path=None,
             echo=print):
  """Evaluates a checkpoint; returns (global step, {metric: value}).

  Args:
    cfg: model params with the `dataset` input.
    placement: a tools.placement.Placement.
    logdir: the run's directory.
    seed: graph-level random seed.
    dataset: the input's name (for the summary directory).
    path: checkpoint path (default: the newest in logdir).
    echo: prints a line.
  """
  path = CheckpointToUse(logdir, path)
  built = model_graph.Build(cfg, placement, 'eval', seed)
  task = built.task
  with built.graph.as_default():
    saver = checkpoints.Checkpointer(logdir, for_eval=True)
    metric_tensors = dict(task.eval_metrics)
    init = tf.group(tf.compat.v1.local_variables_initializer(),
                    tf.compat.v1.tables_initializer())
  budget = _ExampleBudget(task, cfg.input, dataset)
  totals, weights = {}, {}
  examples = 0
  with built.graph.as_default(), placement.NewSession(built.graph) as sess:
    sess.run(init)
    saver.RestoreFrom(sess, path)
    step = int(sess.run(built.global_step))
    while not budget or examples < budget:
      placement.CheckAlive()
      try:
        values = sess.run(metric_tensors, options=placement.RunOptions())
      except tf.errors.OutOfRangeError:
        break
      for name, (value, weight) in values.items():
        totals[name] = totals.get(name, 0.0) + float(value) * float(weight)
        weights[name] = weights.get(name, 0.0) + float(weight)
      examples += int(values['num_samples_in_batch'][0]) if (
          'num_samples_in_batch' in values) else cfg.input.batch_size
  if not examples:
    raise ValueError('the %s input gave no batch to evaluate (is it smaller '
                     'than one batch of %d?)' % (dataset, cfg.input.batch_size))
  metrics = {k: totals[k] / weights[k] for k in totals if weights[k]}
  metrics['num_examples'] = examples
  metrics.pop('num_samples_in_batch', None)
  writer = summaries.Writer(os.path.join(logdir, 'eval_' + dataset.lower()))
  writer.Scalars(step, metrics)
  writer.Close()
  echo('eval %s at step %d (%s, %d examples): %s' % (
      dataset, step, os.path.basename(path), examples, '  '.join(
          '%s %.4f' % (k, v) for k, v in sorted(metrics.items())
          if k != 'num_examples')))
  return step, metrics
