"""The kernel floor: what TensorFlow's kernels alone cost for a stage's work.

A pipeline cannot be faster than the kernels it calls. Micro-batching makes
those kernels smaller (a 1024-row matmul becomes M matmuls of 1024/M rows),
and on a CPU small matmuls run at a lower rate: oneDNN re-packs the 4 MiB
weight on every call whatever the number of rows. This module measures that
floor for the dense workload, with no pipeline at all: each stage's work is
written as plain TensorFlow ops in one graph (no stage functions, no
hand-overs between processes, no schedule):

  * M forward chains ``relu(x W + b)`` of B/M rows, in micro-batch order;
  * M input-gradient chains (the ReLU mask, then ``dy W^T``, computed as
    ``(W dy^T)^T`` when the micro-batch has at most
    ``split_backward.SMALL_MATMUL_ROWS`` rows, as the pipeline does);
  * one batched weight gradient per layer, ``concat(x)^T concat(dy)`` and the
    bias's ``sum(dy)`` (as ``batched_weight_gradients``), and the update.

Each graph runs on a pinned one-core worker process (intra-op 1, inter-op 2,
as the benchmark's pipeline workers). K=1 M=1 is the same code with all L
layers and one micro-batch. A stage's graph is timed alone and with the
other stage's graph running at the same time on the other core (the two
cores share caches and memory bandwidth), and its weight-gradient part
alone. With K=2 and fill-drain, the last stage starts one micro-batch's
forward late and the first stage waits for one micro-batch's backward, so
the best step any pipeline of these kernels can reach is about

  T(stage, both at once) + (T(stage alone) - T(W alone)) / M

and the K=2 ceiling is T(K=1 M=1) over that. ``python -m tools.benchmark
cost`` prints it beside the pipeline's own steps (dense, float32).
"""

import itertools
import statistics
import threading
import time

import numpy as np

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import local_cluster
from gpipe import split_backward
from lingvo import compat as tf


# Variables of graphs on the same worker process are shared by name across
# sessions: each graph gets its own name scope.
_GRAPH_IDS = itertools.count()


class Work:
  """One graph: a run of dense layers' forward, backward and update."""

  def __init__(self, device, target, num_layers, batch, width, micro_batches,
               weights_only=False, seed=0):
    """Builds the graph on `device` and a session on `target`.

    Args:
      device: the worker's device string.
      target: that worker's session target.
      num_layers: dense layers of the stage.
      batch: the mini-batch rows.
      width: input and output width of every layer.
      micro_batches: M (batch must divide into M).
      weights_only: build only the batched weight gradients and update
        (their inputs are stored variables), to time W alone.
      seed: the random initialization's seed.
    """
    if batch % micro_batches:
      raise ValueError('floor: batch %d does not divide into %d micro-batches'
                       % (batch, micro_batches))
    self.graph = tf.Graph()
    rows = batch // micro_batches
    with self.graph.as_default(), tf.device(device), tf.name_scope(
        'floor%d' % next(_GRAPH_IDS)):
      rng = np.random.RandomState(seed)

      def Var(shape, scale, trainable=True):
        return tf.Variable(
            (rng.standard_normal(shape) * scale).astype(np.float32),
            trainable=trainable)

      ws = [Var([width, width], width**-0.5) for _ in range(num_layers)]
      bs = [Var([width], 0.0) for _ in range(num_layers)]
      if weights_only:
        xs = [[Var([rows, width], 1.0, False)] * micro_batches
              for _ in range(num_layers)]
        gs = [[Var([rows, width], 1.0, False)] * micro_batches
              for _ in range(num_layers)]
        after = []
      else:
        self.x = Var([batch, width], 1.0, False)
        self.dy = Var([batch, width], 1.0, False)
        xs, gs, after = self._ForwardBackward(ws, bs, self.x, self.dy,
                                              micro_batches, rows)
      updates = []
      # The gradients of sum(output * dy) with respect to each layer's
      # weight and bias (tested against tf.gradients of the plain model).
      self.weights, self.biases, self.gradients = ws, bs, []
      with tf.control_dependencies(after):
        for l in range(num_layers):
          x = tf.concat([tf.convert_to_tensor(t) for t in xs[l]], 0)
          g = tf.concat([tf.convert_to_tensor(t) for t in gs[l]], 0)
          dw = tf.matmul(x, g, transpose_a=True)
          db = tf.reduce_sum(g, 0)
          self.gradients.append((dw, db))
          updates += [ws[l].assign_sub(1e-6 * dw), bs[l].assign_sub(1e-6 * db)]
      self.train_op = tf.group(*updates)
      init = tf.compat.v1.global_variables_initializer()
    self.session = tf.compat.v1.Session(target, graph=self.graph)
    self.session.run(init)

  @staticmethod
  def _ForwardBackward(ws, bs, x, dy, micro_batches, rows):
    """Per micro-batch forward and input-gradient chains, in order.

    Returns:
      (xs, gs, last): per layer, the M layer inputs and the M gradients at
      its pre-activation; `last` the final op of the chains.
    """
    num_layers = len(ws)
    reads = [w.read_value() for w in ws]
    swap = rows <= split_backward.SMALL_MATMUL_ROWS
    xs = [[] for _ in range(num_layers)]
    outs = [[] for _ in range(num_layers)]
    gs = [[None] * micro_batches for _ in range(num_layers)]
    prev = []
    for h in tf.split(x, micro_batches):
      with tf.control_dependencies(prev):
        h = tf.identity(h)
      for l in range(num_layers):
        xs[l].append(h)
        h = tf.nn.relu(tf.matmul(h, reads[l]) + bs[l])
        outs[l].append(h)
      prev = [h]
    dys = tf.split(dy, micro_batches)
    for m in reversed(range(micro_batches)):
      with tf.control_dependencies(prev):
        g = tf.identity(dys[m])
      for l in reversed(range(num_layers)):
        g = tf.where(outs[l][m] > 0, g, tf.zeros_like(g))
        gs[l][m] = g
        if l:  # The first layer's input gradient is not needed.
          g = (tf.transpose(tf.matmul(reads[l], g, transpose_b=True))
               if swap else tf.matmul(g, reads[l], transpose_b=True))
      prev = [g]
    return xs, gs, prev

  def Run(self):
    start = time.perf_counter()
    self.session.run(self.train_op)
    return time.perf_counter() - start

  def Close(self):
    self.session.close()


def _Time(works, steps, warmup):
  """Median seconds per step of each of `works`, all running at once."""
  for work in works:
    for _ in range(warmup):
      work.Run()
  barrier = threading.Barrier(len(works))
  times = [[] for _ in works]
  errors = []

  def Loop(i):
    try:
      for _ in range(steps):
        barrier.wait(timeout=600)
        times[i].append(works[i].Run())
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
      barrier.abort()

  threads = [threading.Thread(target=Loop, args=(i,)) for i in range(len(works))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if errors:
    raise errors[0]
  return [statistics.median(t) for t in times]


def Floor(num_layers, batch, width, micro_batches, steps=5, warmup=2,
          log=print):
  """The dense workload's kernel floor at K=2 for each M.

  Args:
    num_layers: L (even: two stages of L/2 layers).
    batch: the mini-batch rows.
    width: the layers' width.
    micro_batches: a list of M values.
    steps: timed steps (median).
    warmup: untimed steps first.
    log: a print-like function for progress lines.

  Returns:
    {'K1M1_ms': ..., 'M': [{'M', 'stage_alone_ms', 'stage_both_ms',
    'weights_alone_ms', 'bubble_ms', 'floor_step_ms', 'ceiling'}, ...]}.
  """
  if num_layers % 2:
    raise ValueError('floor: %d layers do not make two equal stages' %
                     num_layers)
  result = dict(M=[])
  cluster = local_cluster.LocalCluster(2, pin_cores=True, intra_op_threads=1,
                                       inter_op_threads=2)
  targets = ['grpc://' + a for a in cluster.cluster_def[local_cluster.JOB]]
  works = []  # Closed before the workers stop (or closing would hang).
  try:
    devices = cluster.devices

    def Make(k, layers, m, weights_only=False):
      works.append(Work(devices[k], targets[k], layers, batch, width, m,
                         weights_only=weights_only, seed=k))
      return works[-1]

    whole = Make(0, num_layers, 1)
    result['K1M1_ms'] = 1e3 * _Time([whole], steps, warmup)[0]
    log('floor: K=1 M=1 %.0f ms' % result['K1M1_ms'])
    half = num_layers // 2
    for m in micro_batches:
      stages = [Make(0, half, m), Make(1, half, m)]
      weights = Make(0, half, m, weights_only=True)
      alone = 1e3 * _Time(stages[:1], steps, warmup)[0]
      both = 1e3 * max(_Time(stages, steps, warmup))
      w_alone = 1e3 * _Time([weights], steps, warmup)[0]
      bubble = max(alone - w_alone, 0.0) / m
      rec = dict(M=m, stage_alone_ms=alone, stage_both_ms=both,
                 weights_alone_ms=w_alone, bubble_ms=bubble,
                 floor_step_ms=both + bubble,
                 ceiling=result['K1M1_ms'] / (both + bubble))
      result['M'].append(rec)
      log('floor: M=%d stage %.0f ms alone, %.0f ms both at once; K=2 '
          'ceiling %.2fx' % (m, alone, both, rec['ceiling']))
  finally:
    for work in works:
      work.Close()
    cluster.Stop()
  return result
