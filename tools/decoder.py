"""Decoding a checkpoint on the model's Test() input (Lingvo's decode mode).

Runs the task's ``Decode(input_batch)`` graph batch by batch, hands each
fetched batch to ``task.PostProcessDecodeOut`` with the metrics of
``task.CreateDecoderMetrics()`` (e.g. corpus BLEU for translation, accuracy
for classification), and writes the final metrics to TensorBoard under
``<logdir>/decode_<dataset>`` and the (key, value) outputs the task returns
to ``decode_<dataset>/decode_out_<step>.txt``.
"""

import os

from gpipe import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from tools import checkpoints
from tools import evaler
from tools import model_graph
from tools import summaries


def _Value(metric):
  value = metric.value
  return float(value) if value is not None else float('nan')


def Decode(cfg, placement, logdir, seed=1234, dataset='Test', path=None,
           max_batches=None, echo=print):
  """Decodes a checkpoint; returns (global step, {metric: value}).

  Args:
    cfg: model params with the `dataset` input.
    placement: a tools.placement.Placement.
    logdir: the run's directory.
    seed: graph-level random seed.
    dataset: the input's name (for the output directory).
    path: checkpoint path (default: the newest in logdir).
    max_batches: stop after this many batches (None: until the input ends).
    echo: prints a line.
  """
  path = evaler.CheckpointToUse(logdir, path)
  built = model_graph.Build(cfg, placement, 'decode', seed)
  task = built.task
  with built.graph.as_default():
    saver = checkpoints.Checkpointer(logdir, for_eval=True)
    init = tf.group(tf.compat.v1.local_variables_initializer(),
                    tf.compat.v1.tables_initializer())
  metrics = task.CreateDecoderMetrics()
  out_dir = os.path.join(logdir, 'decode_' + dataset.lower())
  os.makedirs(out_dir, exist_ok=True)
  batches = 0
  with built.graph.as_default(), placement.NewSession(built.graph) as sess:
    sess.run(init)
    saver.RestoreFrom(sess, path)
    step = int(sess.run(built.global_step))
    out_path = os.path.join(out_dir, 'decode_out_%d.txt' % step)
    with open(out_path, 'w') as out_file:
      while max_batches is None or batches < max_batches:
        placement.CheckAlive()
        try:
          out = sess.run(built.decode_out, options=placement.RunOptions())
        except tf.errors.OutOfRangeError:
          break
        batches += 1
        for key, value in task.PostProcessDecodeOut(out, metrics) or []:
          out_file.write('%s\t%s\n' % (key, value))
  values = {name: _Value(m) for name, m in metrics.items()}
  writer = summaries.Writer(out_dir)
  writer.Scalars(step, values)
  writer.Close()
  echo('decode %s at step %d (%d batches): %s; outputs in %s' % (
      dataset, step, batches, '  '.join(
          '%s %.4f' % (k, v) for k, v in sorted(values.items())), out_path))
  return step, values
