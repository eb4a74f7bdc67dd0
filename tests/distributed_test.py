"""A 2-stage pipeline across 2 local TensorFlow worker processes.

Unlike most tests (tests/graph_rewrites.py), these runs keep Grappler on, as
a user's session has it: the order test below is the run-time check that
the stage functions stay uninlined calls whose order the schedule's
control edges fix.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import signal

from gpipe.runtime import local_cluster
from gpipe.schedules import pipeline_tasks
from gpipe import schedules
from gpipe.measure import timeline
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import pipeline_testlib
from tests import polling
from tests import toy_layers


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
      net = pipeline_testlib.Pipeline(
          pipeline_testlib.DenseLayers(4, seed=10), 2, 4,
          stage_devices=self.cluster.devices)
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

  def testEachWorkerRunsItsTasksInTheScheduleOrder(self):
    x_np = np.random.RandomState(1).randn(16, 8)
    d0, d1 = self.cluster.devices
    placements = {
        '1f1b': [d0, d1],
        'zb_h1': [d0, d1],
        'interleaved_1f1b': [d0, d1, d0, d1],
        'zb_v': [d0, d1, d1, d0],
    }
    for name, devices in placements.items():
      with tf.Graph().as_default():
        net = pipeline_testlib.Pipeline(
            pipeline_testlib.DenseLayers(4, seed=10), len(devices), 4,
            name='pipe_' + name, stage_devices=devices, schedule=name,
            partition_cost='uniform',
            loss_tpl=toy_layers.SquaredErrorLoss.Params().Set(
                dtype=tf.float64))
        x = tf.constant(x_np)
        losses = []
        for fprop in (net.FProp, net.FPropUnpipelined):
          loss = tf.reduce_mean(fprop(net.theta, x, targets=x * 0.5)
                                .per_example)
          losses.append([loss] + tf.gradients(
              loss, net.vars.Flatten(), colocate_gradients_with_ops=True))
        with tf.compat.v1.Session(self.cluster.target) as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          metadata = tf.compat.v1.RunMetadata()
          values = sess.run(
              losses[0], options=tf.compat.v1.RunOptions(
                  trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
              run_metadata=metadata)
          refs = sess.run(losses[1])
        for v, r in zip(values, refs):
          self.assertAllClose(r, v, rtol=1e-10, atol=1e-12)
        _, orders = schedules.Orders(name, devices, 4,
                                    schedules.simulate.RematCosts(True))
        tasks = timeline.ParseStepStats(metadata.step_stats)
        for device, order in zip((d0, d1), orders):
          ran = [pipeline_tasks.Task(t.stage, t.micro_batch, t.phase)
                 for t in sorted(tasks, key=lambda t: t.start)
                 if t.device.startswith(device.rsplit('/device', 1)[0])]
          self.assertEqual(
              [pipeline_tasks.Label(t) for t in order],
              [pipeline_tasks.Label(t) for t in ran], (name, device))

  def testDeadWorkerIsReported(self):
    cluster = local_cluster.LocalCluster(1)
    try:
      cluster.CheckAlive()
      os.kill(cluster.pids[0], signal.SIGKILL)

      def Reported():
        try:
          cluster.CheckAlive()
        except local_cluster.WorkerDiedError as e:
          return str(e)
        return None

      message = polling.WaitUntil(Reported, 'the dead worker to be reported',
                                  timeout_secs=10)
      self.assertIn('pipeline worker 0', message)
      self.assertIn('exited with code', message)
    finally:
      cluster.Stop()


if __name__ == '__main__':
  tf.test.main()
