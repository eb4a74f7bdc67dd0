"""gpipe.measure.memory: peak memory per device from a traced step."""

import json
import os
import subprocess
import sys

# TensorFlow's default CPU allocator keeps no byte counts; its BFC allocator
# does. Read when the process creates its first session, so set before any.
os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'

# pylint: disable=g-import-not-at-top,wrong-import-position
from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.measure import memory
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import polling
from tests import schedule_memory_probe

# Grappler on: peak memory as users run the step.
CONFIG = graph_rewrites.CpuConfig(2, grappler=True)
DEVICES = graph_rewrites.CpuDevices(2)
MIB = 1 << 20


def _TracedStep(sess, fetches):
  metadata = tf.compat.v1.RunMetadata()
  sess.run(
      fetches,
      options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
      run_metadata=metadata)
  return metadata


def _Device(name, index):
  return name.endswith('device:CPU:%d' % index)


class MemoryTest(test_utils.TestCase):

  def testKeptActivationsAreCountedOnTheirDevice(self):
    # Forward: 4 layers of relu(x w) on CPU:1, each [rows, 256] float32
    # output kept for the backward pass: >= 4 * rows KiB at once.
    peaks = {}
    for rows in (256, 2048):
      with self.session(graph=tf.Graph(), config=CONFIG) as sess:
        x = tf.random.stateless_normal([rows, 256], seed=[1, 2])
        with tf.device(DEVICES[1]):
          w = tf.Variable(tf.random.stateless_normal([256, 256], seed=[3, 4]))
          y = x
          for _ in range(4):
            y = tf.nn.relu(tf.matmul(y, w))
          loss = tf.reduce_sum(y)
        grad = tf.gradients(loss, [w], colocate_gradients_with_ops=True)[0]
        sess.run(tf.compat.v1.global_variables_initializer())
        metadata = _TracedStep(sess, grad)
      step = memory.PeakBytesPerDevice(metadata)
      total = memory.PeakAllocatorBytesPerDevice(metadata)
      cpu1 = [d for d in step if _Device(d, 1)]
      self.assertLen(cpu1, 1)
      peaks[rows] = step[cpu1[0]]
      self.assertGreaterEqual(peaks[rows], 4 * rows * 256 * 4)
      # The allocator total also holds the variable (256 KiB).
      self.assertGreaterEqual(total[cpu1[0]], peaks[rows])
    # 8x the rows: several times the memory (weight gradients are fixed).
    self.assertGreater(peaks[2048], 4 * peaks[256])
    self.assertEqual(memory.MaxOverDevices({'a': 3, 'b': 5}), 5)
    self.assertEqual(memory.MaxOverDevices({}), 0)

  def testRematPipelineNeedsLessActivationMemory(self):
    # 8 layers on one stage: without remat every layer's output of the
    # whole batch is kept; with remat and 8 micro-batches, only the input
    # plus one micro-batch's activations while recomputing. A large batch
    # keeps the (schedule-dependent) weight-gradient buffers a small share.
    peaks = {}
    for remat, num_mb in (('never', 1), ('always', 8)):
      with self.session(graph=tf.Graph(), config=CONFIG) as sess:
        layers = pipeline_testlib.DenseLayers(
            8, seed=0, init_scale=0.05, input_dim=256, output_dim=256,
            keep_prob=1.0, dtype=tf.float32)
        net = pipeline_testlib.Pipeline(
            layers, 1, num_mb, name='pipe_%s' % remat, remat=remat,
            dtype=tf.float32)
        x = tf.random.stateless_normal([4096, 256], seed=[1, 2])
        loss = tf.reduce_sum(tf.square(net.FProp(net.theta, x)))
        grads = tf.gradients(loss, net.vars.Flatten(),
                             colocate_gradients_with_ops=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        peaks[remat] = memory.MaxOverDevices(
            memory.PeakBytesPerDevice(_TracedStep(sess, grads)))
    # 8 kept [4096, 256] outputs are 32 MiB.
    self.assertGreater(peaks['never'], 32 * MIB)
    self.assertLess(peaks['always'], 0.5 * peaks['never'])

  def testOneFOneBHoldsAtMostKMicroBatchesOnStageZero(self):
    # remat='never': each forward keeps its stage's activations until its
    # backward. GPipe runs all M forwards first; 1F1B starts micro-batch m's
    # backward after K-1 more forwards, so stage 0 holds at most K. Each
    # schedule is measured in a fresh process (schedule_memory_probe).
    probe = schedule_memory_probe
    per_micro_batch = (probe.LAYERS // probe.K) * (
        probe.ROWS // probe.M) * probe.WIDTH * 4  # 2 MiB
    inputs = probe.ROWS * probe.WIDTH * 4
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='2')
    peaks, largest = {}, {}
    for name in ('gpipe', '1f1b'):
      result = subprocess.run(
          [sys.executable, '-m', 'tests.schedule_memory_probe', name],
          cwd=root, env=env, capture_output=True, text=True,
          timeout=polling.TimeLimit(300)[0],
          check=False)
      self.assertEqual(0, result.returncode, result.stderr[-2000:])
      measured = json.loads(result.stdout.strip().splitlines()[-1])
      peaks[name] = measured['peak_bytes']
      largest[name] = measured['largest_peak_bytes']
    # GPipe: the input plus (nearly) all M micro-batches' activations.
    self.assertGreater(peaks['gpipe'],
                       inputs + (probe.M - 2) * per_micro_batch)
    # 1F1B: the input plus at most K (and one in-flight temporary).
    self.assertLess(peaks['1f1b'], inputs + (probe.K + 1) * per_micro_batch)
    # Every step, also one whose frees a busy machine delayed, stays within
    # one micro-batch more: a schedule that lost its order in some steps
    # would hold up to M.
    self.assertLess(largest['1f1b'],
                    inputs + (probe.K + 2) * per_micro_batch)
    # About half: both hold the 4 MiB input; when in-flight temporaries
    # overlap, 1F1B has measured 0.41-0.52 of GPipe's 19-20 MiB here.
    self.assertLess(peaks['1f1b'], 0.6 * peaks['gpipe'])

  def testAllocatorWithoutCountsReportsNoTotal(self):
    # A step traced where the allocator keeps no counts (TensorFlow's default
    # CPU allocator): the replayed step peak is still exact, the allocator
    # total is absent rather than a wrong number.
    metadata = tf.compat.v1.RunMetadata()
    dev = metadata.step_stats.dev_stats.add(device='/device:CPU:0')
    for t, nbytes in ((1, 100), (2, 50), (3, -100), (4, 30), (5, -50)):
      mem = dev.node_stats.add(node_name='op%d' % t).memory.add(
          allocator_name='cpu', allocator_bytes_in_use=0)
      mem.allocation_records.add(alloc_micros=t, alloc_bytes=nbytes)
    self.assertEqual(memory.PeakBytesPerDevice(metadata),
                     {'/device:CPU:0': 150})
    self.assertEqual(memory.PeakAllocatorBytesPerDevice(metadata), {})
    mem.allocator_bytes_in_use = 4096
    self.assertEqual(memory.PeakAllocatorBytesPerDevice(metadata),
                     {'/device:CPU:0': 4096})

  def testUntracedStepIsAnError(self):
    with self.session(graph=tf.Graph()) as sess:
      metadata = tf.compat.v1.RunMetadata()
      sess.run(tf.constant(1.0) + 1.0, run_metadata=metadata)
    with self.assertRaisesRegex(ValueError, 'FULL_TRACE'):
      memory.PeakBytesPerDevice(metadata)


if __name__ == '__main__':
  tf.test.main()
