"""Prints stage 0's peak step memory of a K=2, M=8 pipeline (one schedule).

Run in a fresh process by memory_test: a step traced after other sessions in
the same process can be counted larger, so each schedule is measured alone.
Usage: python -m tests.schedule_memory_probe SCHEDULE
"""

import json
import os
import sys

# TensorFlow's BFC allocator keeps the byte counts; set before any session.
os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'

# pylint: disable=g-import-not-at-top,wrong-import-position
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.measure import memory
from lingvo import compat as tf
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import toy_layers

K, M, ROWS, WIDTH, LAYERS = 2, 8, 4096, 256, 8
STEPS = 3  # traced steps; the least peak is reported


def Measure(name):
  """Peak step bytes of CPU:0 (stage 0) with remat='never'."""
  tf.compat.v1.disable_eager_execution()
  # Grappler on: peak memory as users run the step.
  config = graph_rewrites.CpuConfig(2, grappler=True)
  with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
    layers = pipeline_testlib.DenseLayers(
        LAYERS, seed=0, init_scale=0.05, input_dim=WIDTH, output_dim=WIDTH,
        keep_prob=1.0, dtype=tf.float32)
    net = pipeline_testlib.Pipeline(
        layers, K, M, remat='never', schedule=name, dtype=tf.float32,
        stage_devices=graph_rewrites.CpuDevices(2),
        partition_cost='uniform',
        loss_tpl=toy_layers.SquaredErrorLoss.Params())
    x = tf.random.stateless_normal([ROWS, WIDTH], seed=[1, 2])
    out = net.FProp(net.theta, x, targets=tf.zeros_like(x))
    loss = tf.reduce_mean(out.per_example)
    grads = tf.gradients(loss, net.vars.Flatten(),
                         colocate_gradients_with_ops=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    peaks = []
    for _ in range(STEPS):
      metadata = tf.compat.v1.RunMetadata()
      sess.run([grads, loss], options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
      step = memory.PeakBytesPerDevice(metadata)
      peaks.append(
          max(v for d, v in step.items() if d.endswith('device:CPU:0')))
  # The schedule bounds what a step must hold; a busy machine can delay a
  # free past the next task's allocations and add a temporary on top. The
  # least of a few steps is the schedule's own figure, the largest what a
  # delay added.
  return min(peaks), max(peaks)


if __name__ == '__main__':
  least, largest = Measure(sys.argv[1])
  print(json.dumps({'peak_bytes': least, 'largest_peak_bytes': largest}))
