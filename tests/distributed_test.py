"""A 2-stage pipeline across 2 local TensorFlow worker processes."""

from gpipe import lingvo_import  # pylint: disable=unused-import

import os
import signal
import time

from gpipe import local_cluster
from gpipe import pipeline
from gpipe import timeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import toy_layers


def _Layers():
  return [
      toy_layers.DenseDropout.Params().Set(
          name='dense%d' % i, dtype=tf.float64,
          params_init=py_utils.WeightInit.Gaussian(0.5, seed=10 + i))
      for i in range(4)
  ]


class DistributedPipelineTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cluster = local_cluster.LocalCluster(2)

  @classmethod
  def tearDownClass(cls):
    cls.cluster.Stop()
    super().tearDownClass()

  def testGradientsAcrossWorkerProcessesMatchUnpipelined(self):
    x_np = np.random.RandomState(0).randn(16, 8)
    with tf.Graph().as_default():
      net = pipeline.PipeliningLayer.Params().Set(
          name='pipe', layers=_Layers(), num_stages=2, num_micro_batches=4,
          stage_devices=self.cluster.devices, dtype=tf.float64).Instantiate()
      # Each stage's variables live in its worker process.
      for var in net.vars.Flatten():
        task = 0 if 'dense0' in var.name or 'dense1' in var.name else 1
        self.assertIn('/job:worker/replica:0/task:%d' % task, var.device)
      x = tf.constant(x_np)
      out = net.FProp(net.theta, x)
      loss = tf.reduce_sum(tf.square(out))
      grads = tf.gradients(loss, net.vars.Flatten(),
                           colocate_gradients_with_ops=True)
      ref_out = net.FPropUnpipelined(net.theta, x)
      ref_loss = tf.reduce_sum(tf.square(ref_out))
      ref_grads = tf.gradients(ref_loss, net.vars.Flatten())
      with tf.compat.v1.Session(self.cluster.target) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        metadata = tf.compat.v1.RunMetadata()
        values = sess.run(
            [loss] + grads,
            options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
            run_metadata=metadata)
        refs = sess.run([ref_loss] + ref_grads)
      for v, r in zip(values, refs):
        self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)
      # The trace shows every stage task ran in its own worker process.
      tasks = timeline.ParseStepStats(metadata.step_stats)
      self.assertLen(tasks, 2 * 2 * 4)
      for t in tasks:
        self.assertIn('/job:worker/replica:0/task:%d/' % t.stage, t.device)

  def testDeadWorkerIsReported(self):
    cluster = local_cluster.LocalCluster(1)
    try:
      cluster.CheckAlive()
      os.kill(cluster.pids[0], signal.SIGKILL)
      for _ in range(50):
        try:
          cluster.CheckAlive()
        except local_cluster.WorkerDiedError as e:
          self.assertIn('pipeline worker 0', str(e))
          self.assertIn('exited with code', str(e))
          break
        time.sleep(0.1)
      else:
        self.fail('the dead worker was not reported')
    finally:
      cluster.Stop()


if __name__ == '__main__':
  tf.test.main()
