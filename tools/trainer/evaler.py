"""Evaluation of a checkpoint on a held-out input (the model's Test()).

Builds the model's eval graph (dropout and drop path off, batch norm on its
moving averages), restores a checkpoint of the run, and runs the task's
metrics over the input until it ends (an input with ``repeat=False``) or
until ``p.eval.samples_per_summary`` examples. Each metric is averaged with
its weights (e.g. accuracy weighted by batch size), written to TensorBoard
under ``<logdir>/eval_<dataset>`` and returned.
"""

import os

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from tools.trainer import restored
from tools.trainer import summaries


def _ExampleBudget(task, input_params, dataset):
  """Examples to evaluate: p.eval.samples_per_summary (0: the whole input)."""
  budget = task.params.eval.samples_per_summary
  repeats = 'repeat' in input_params and input_params.repeat
  if repeats and not budget:
    raise ValueError(
        'the %s input repeats forever and p.eval.samples_per_summary is 0: '
        'set one of them so evaluation ends' % dataset)
  return budget


def Evaluate(run, dataset='Test', path=None, echo=print):
  """Evaluates a checkpoint; returns (global step, {metric: value}).

  Args:
    run: the RunConfig (its `test` params hold the `dataset` input).
    dataset: the input's name (for the summary directory).
    path: checkpoint path (default: the newest in the run's logdir).
    echo: prints a line.
  """
  cfg = run.test
  totals, weights = {}, {}
  examples = 0
  with restored.RestoredModel(run, cfg, 'eval', path) as model:
    metric_tensors = dict(model.task.eval_metrics)
    budget = _ExampleBudget(model.task, cfg.input, dataset)
    while not budget or examples < budget:
      run.placement.CheckAlive()
      try:
        values = model.sess.run(metric_tensors,
                                options=run.placement.RunOptions())
      except tf.errors.OutOfRangeError:
        break
      for name, (value, weight) in values.items():
        totals[name] = totals.get(name, 0.0) + float(value) * float(weight)
        weights[name] = weights.get(name, 0.0) + float(weight)
      examples += int(values['num_samples_in_batch'][0]) if (
          'num_samples_in_batch' in values) else cfg.input.batch_size
    step, path = model.step, model.path
  if not examples:
    raise ValueError('the %s input gave no batch to evaluate (is it smaller '
                     'than one batch of %d?)' % (dataset, cfg.input.batch_size))
  metrics = {k: totals[k] / weights[k] for k in totals if weights[k]}
  metrics['num_examples'] = examples
  metrics.pop('num_samples_in_batch', None)
  writer = summaries.Writer(os.path.join(run.logdir,
                                         'eval_' + dataset.lower()))
  writer.Scalars(step, metrics)
  writer.Close()
  echo('eval %s at step %d (%s, %d examples): %s' % (
      dataset, step, os.path.basename(path), examples, '  '.join(
          '%s %.4f' % (k, v) for k, v in sorted(metrics.items())
          if k != 'num_examples')))
  return step, metrics
