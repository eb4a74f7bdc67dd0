"""Decoding a checkpoint on the model's Test() input (Lingvo's decode mode).

Runs the task's ``Decode(input_batch)`` graph batch by batch, hands each
fetched batch to ``task.PostProcessDecodeOut`` with the metrics of
``task.CreateDecoderMetrics()`` (e.g. corpus BLEU for translation, accuracy
for classification), and writes the final metrics to TensorBoard under
``<logdir>/decode_<dataset>`` and the (key, value) outputs the task returns
to ``decode_<dataset>/decode_out_<step>.txt``.
"""

import os
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from tools.trainer import restored
from tools.trainer import summaries


def _Value(metric):
  value = metric.value
  return float(value) if value is not None else float('nan')


def Decode(run, dataset='Test', path=None, echo=print):
  """Decodes a checkpoint; returns (global step, {metric: value}).

  Args:
    run: the RunConfig (its `test` params hold the `dataset` input; its
      decode_max_batches bounds the batches, None: until the input ends).
    dataset: the input's name (for the output directory).
    path: checkpoint path (default: the newest in the run's logdir).
    echo: prints a line.
  """
  out_dir = os.path.join(run.logdir, 'decode_' + dataset.lower())
  os.makedirs(out_dir, exist_ok=True)
  max_batches = run.decode_max_batches
  batches = 0
  with restored.RestoredModel(run, run.test, 'decode', path) as model:
    metrics = model.task.CreateDecoderMetrics()
    start = time.time()
    step = model.step
    out_path = os.path.join(out_dir, 'decode_out_%d.txt' % step)
    with open(out_path, 'w') as out_file:
      while max_batches is None or batches < max_batches:
        run.placement.CheckAlive()
        try:
          out = model.sess.run(model.built.decode_out,
                               options=run.placement.RunOptions())
        except tf.errors.OutOfRangeError:
          break
        batches += 1
        for key, value in model.task.PostProcessDecodeOut(out, metrics) or []:
          out_file.write('%s\t%s\n' % (key, value))
    seconds = time.time() - start
  values = {name: _Value(m) for name, m in metrics.items()}
  writer = summaries.Writer(out_dir)
  writer.Scalars(step, values)
  writer.Close()
  echo('decode %s at step %d (%d batches): %s; outputs in %s; %.1f s '
       'decoding' % (dataset, step, batches, '  '.join(
           '%s %.4f' % (k, v) for k, v in sorted(values.items())), out_path,
                     seconds))
  return step, values
