"""Builds and times training steps of the benchmark configurations.

A configuration (``Config``) is one way to train the same layer stack:

  * ``'gpipe'``: our ``gpipe.pipeline.PipeliningLayer`` with K stages on K
    local worker processes (``gpipe.runtime.local_cluster``), each pinned to
    its own core with one intra-op thread: one core per "device".
  * ``'lingvo'``: Lingvo's ``lingvo.core.gpipe.PipeliningLayer`` in its best
    working placement here: one worker process with K virtual CPU devices
    sharing all cores' threads (it cannot span worker processes: its
    Send/Recv pass device incarnation 0).
  * ``'plain'``: the layers in one unpipelined graph in one worker process
    using all cores (context: what intra-op threads alone give).
  * ``'inline'``: the same M micro-batches through the same layers as
    ordinary inline ops (``PipeliningLayer.FPropUnpipelined``: no stage
    functions, no remat) on one pinned one-core worker, like 'gpipe' K=1.
    Against 'gpipe' K=1 with remat='never' it isolates the pipeline's own
    per-micro-batch overhead from TensorFlow's cost of running the layers on
    smaller tensors.

Every configuration runs in worker processes started the same way (each in
its own session; this process only drives them), so they are treated alike
by the OS scheduler. With ``priority`` > 0 the workers' scheduling groups get
that much less niceness (Linux autogroups; needs root), so other processes
on a shared machine disturb the measurement less.

A training step is loss = mean(out^2), gradients colocated with their ops,
and an SGD update of every variable, fetched with the loss; the input is a
variable on the first stage's device, so no feeding from this process. ``Runner`` builds each
configuration in its own graph and session and times steps of several
configurations interleaved (a step of each in turn, repeated), so the load of
other processes on this shared machine hits them alike.
"""

import collections
import json
import os
import platform
import statistics
import time
import zlib

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import local_cluster
from gpipe import pipeline
from gpipe import precision
from gpipe import xla
from gpipe.schedules import registry as schedule_registry
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import gpipe as lingvo_gpipe
from lingvo.core import py_utils
import numpy as np
from tools.benchmark import lingvo_stack
from tools.benchmark import models

IMPLS = ('gpipe', 'inline', 'lingvo', 'plain')

# Threads of the unpinned workers (Lingvo's GPipe and plain TF): all cores.
ALL_CORES = os.cpu_count() or 1


class Config(
    collections.namedtuple('Config', [
        'impl', 'model', 'num_layers', 'batch', 'num_stages',
        'num_micro_batches', 'remat', 'width', 'stages_per_device',
        'schedule', 'fprop_dtype', 'replicas', 'batched_weights',
        'stage_sizes', 'task_costs', 'compile'
    ], defaults=(1, None, 'float32', 1, False, None, None, None))):
  """One benchmark configuration (see the module docstring).

  `schedule` (impl 'gpipe' only): None trains with the loss on the merged
  output (fill-drain, the loss after the pipeline); a name of
  the registry gpipe.schedules ends the pipeline with a per-example loss layer
  and runs that schedule ('zb_v' places the 2v stages in a V).
  `fprop_dtype` (impl 'gpipe' only): 'bfloat16' computes the layers in
  bfloat16 with float32 variables (gpipe.precision).

  `replicas` (impl 'gpipe' only): R data-parallel replicas of the pipeline
  (``p.replica_devices``) on R x K pinned one-core workers, each taking 1/R
  of the batch in M micro-batches; the variables live on the first replica.

  `batched_weights` (impl 'gpipe' only): each stage computes its weight
  gradients once per step (``p.batched_weight_gradients``).

  `stage_sizes` (impl 'gpipe' only): layers per stage, a tuple (default:
  as even as the layers allow); `task_costs`: measured task costs as JSON
  text (``p.task_costs``, for the schedules that order by cost), as a plan
  of ``gpipe.plan`` sets them.

  `compile` (impl 'gpipe' only): 'xla' compiles every stage function with
  XLA (``p.compile``, gpipe/xla.py); None: uncompiled.
  """

  @property
  def label(self):
    v = self.stages_per_device
    loop = ' v=%d' % v if v > 1 else ''
    sched = ' ' + self.schedule if self.schedule else ''
    dtype = '' if self.fprop_dtype == 'float32' else ' ' + self.fprop_dtype
    replicas = ' R=%d' % self.replicas if self.replicas > 1 else ''
    batched = ' batched-W' if self.batched_weights else ''
    cut = (' cut=%s' % ','.join(str(n) for n in self.stage_sizes)
           if self.stage_sizes else '')
    timed = ' measured-costs' if self.task_costs else ''
    xla = ' ' + self.compile if self.compile else ''
    return '%s%s%s K=%d%s M=%d %s%s%s%s%s%s' % (
        self.impl, sched, replicas, self.num_stages, loop,
        self.num_micro_batches, self.remat, dtype, batched, cut, timed, xla)

  @property
  def scope(self):
    """A unique variable scope: configurations share worker processes."""
    return '%s_%s_L%d_B%d_K%d_V%d_M%d_%s%s' % (
        self.impl, self.model, self.num_layers, self.batch, self.num_stages,
        self.stages_per_device, self.num_micro_batches, self.remat,
        '_' + self.schedule if self.schedule else '') + (
            '' if self.fprop_dtype == 'float32' else '_' + self.fprop_dtype) + (
            '_R%d' % self.replicas if self.replicas > 1 else '') + (
                '_bw' if self.batched_weights else '') + (
                    '_cut' + '_'.join(str(n) for n in self.stage_sizes)
                    if self.stage_sizes else '') + (
                        '_costs%08x' % zlib.crc32(self.task_costs.encode())
                        if self.task_costs else '') + (
                            '_' + self.compile if self.compile else '')

  @property
  def num_workers(self):
    """The worker processes (devices) it runs on: R x K for 'gpipe'."""
    return self.num_stages * (self.replicas if self.impl == 'gpipe' else 1)


def MachineInfo():
  """A dict describing the machine it runs on and the TensorFlow build."""
  info = {
      'cpus': os.cpu_count(),
      'platform': platform.platform(),
      'python': platform.python_version(),
      'tensorflow': tf.version.VERSION,
      'onednn': os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default (on)'),
  }
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          info['cpu_model'] = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  try:
    info['load_average'] = os.getloadavg()
  except OSError:
    pass
  return info


def _EvenStageSizes(num_layers, num_stages):
  base, extra = divmod(num_layers, num_stages)
  return [base + (1 if k < extra else 0) for k in range(num_stages)]


def _TrainOp(loss, variables, lr=1e-4):
  grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
  updates = []
  for v, g in zip(variables, grads):
    if g is None:
      continue
    with tf.compat.v1.colocate_with(v):
      if isinstance(g, tf.IndexedSlices):  # an embedding's gradient
        g = tf.convert_to_tensor(g)
      updates.append(tf.compat.v1.assign_sub(v, lr * g).op)
  return tf.group(*updates)


class Step:
  """One configuration's graph, session and training step."""

  def __init__(self, config, target, devices):
    """Builds the graph and initializes the variables.

    Args:
      config: a Config.
      target: the session target of the worker processes.
      devices: K device strings (one per stage; 'plain' uses the first);
        R x K for R replicas, replica r on devices[r K:(r+1) K].
    """
    self.config = config
    c = config
    if (c.impl == 'gpipe' and c.schedule and
        schedule_registry.Get(c.schedule).placement ==
        schedule_registry.V_SHAPE and c.stages_per_device != 2):
      # A V of K stages puts them on K/2 devices: with one stage per
      # device, half the workers would stay idle without a word.
      raise ValueError(
          '%s: %r places 2 stages on each device in a V; set '
          'stages_per_device=2 (v=%d given)' % (c.label, c.schedule,
                                                c.stages_per_device))
    self._target = target
    self.graph = tf.Graph()
    start = time.time()
    with self.graph.as_default():
      if c.model == lingvo_stack.MODEL:
        self._BuildLingvoStack(c, devices)
        return
      layers = models.ModelLayers(c.model, c.num_layers, c.width)
      shape = models.InputShape(c.model, c.batch, c.width)
      first = devices[0]
      with tf.compat.v1.variable_scope(c.scope):
        with tf.device(first):
          x = tf.compat.v1.get_variable(
              'input', shape,
              initializer=tf.compat.v1.random_normal_initializer(seed=1),
              trainable=False)
        if c.impl == 'gpipe':
          # With v stages per device, stage s runs where the schedule's
          # placement rule puts it: device s % K (a loop), or a V.
          num_stages = c.num_stages * c.stages_per_device
          where = schedule_registry.Placement(c.schedule or 'gpipe',
                                              num_stages, c.num_stages)
          p = pipeline.PipeliningLayer.Params().Set(
              name='pipe', layers=layers, num_stages=num_stages,
              stage_sizes=(list(c.stage_sizes) if c.stage_sizes else
                           _EvenStageSizes(c.num_layers, num_stages)),
              task_costs=json.loads(c.task_costs) if c.task_costs else None,
              num_micro_batches=c.num_micro_batches, remat=c.remat,
              stage_devices=[devices[d] for d in where],
              batched_weight_gradients=c.batched_weights,
              compile=c.compile)
          precision.SetFPropDtype(p, c.fprop_dtype)
          if c.replicas > 1:
            p.replica_devices = [[
                devices[r * c.num_stages + d] for d in where
            ] for r in range(c.replicas)]
          loss_device = devices[where[-1]]
          if c.schedule:
            p.Set(schedule=c.schedule,
                  loss_tpl=models.MeanSquareLoss.Params())
            net = p.Instantiate()
            with tf.device(loss_device):
              targets = tf.zeros([c.batch])
            out = net.FProp(net.theta, x, targets=targets)
          else:
            net = p.Instantiate()
            out = net.FProp(net.theta, x)
        elif c.impl == 'inline':
          with tf.device(first):
            net = pipeline.PipeliningLayer.Params().Set(
                name='pipe', layers=layers, num_stages=1,
                num_micro_batches=c.num_micro_batches,
                stage_devices=[first]).Instantiate()
            out = net.FPropUnpipelined(net.theta, x)
          loss_device = first
        elif c.impl == 'lingvo':
          with _LingvoCluster(devices):
            py_utils.GetOrCreateGlobalStepVar()
            net = lingvo_gpipe.PipeliningLayer.Params().Set(
                name='pipe',
                cell_tpl=models.LingvoCells(
                    layers, _EvenStageSizes(c.num_layers, c.num_stages)),
                num_micro_batches=c.num_micro_batches).Instantiate()
            out = net.FProp(net.theta, x)
            out = out[0] if isinstance(out, (tuple, list)) else out
          loss_device = devices[c.num_stages - 1]
        elif c.impl == 'plain':
          with tf.device(first):
            net = _Chain(layers)
            out = models.ChainFProp(net.layers, net.thetas, x)
          loss_device = first
        else:
          raise ValueError('unknown impl %r; use one of %s' % (c.impl, IMPLS))
        with tf.device(loss_device):
          # With a schedule the pipeline already returns per-example losses.
          self.loss = tf.reduce_mean(
              out if c.impl == 'gpipe' and c.schedule else tf.square(out))
        self.variables = net.vars.Flatten()
        # Run() fetches the loss with the update, as a trainer does: a
        # loss only grouped with the update would be pruned by Grappler, and
        # with a loss layer the last stage's forwards with it.
        self.train_op = _TrainOp(self.loss, self.variables)
      self._Finish(start, target)

  def _Finish(self, start, target):
    self.build_seconds = time.time() - start
    self.num_ops = len(self.graph.get_operations())
    self.session = tf.compat.v1.Session(
        target, graph=self.graph,
        config=xla.SessionConfig() if self.config.compile else None)
    self.session.run(tf.compat.v1.global_variables_initializer())
    self.times = []
    # The first step's seconds (XLA compiles the stage functions in it).
    self.first_seconds = None

  def GraphBytes(self):
    """The serialized size of the session's graph (its functions included)."""
    return self.graph.as_graph_def().ByteSize()

  def _BuildLingvoStack(self, c, devices):
    """Lingvo's GPipeTransformerStack on its executor or ours."""
    start = time.time()
    with tf.compat.v1.variable_scope(c.scope):
      net, self.loss = lingvo_stack.Build(c, devices[:c.num_stages],
                                          _LingvoCluster)
      self.variables = net.vars.Flatten()
      self.train_op = _TrainOp(self.loss, self.variables)
    self._Finish(start, self._target)

  def Run(self, trace=False):
    """Runs one training step; returns seconds (and RunMetadata if traced)."""
    if trace:
      metadata = tf.compat.v1.RunMetadata()
      options = tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
      start = time.time()
      self.session.run([self.train_op, self.loss], options=options,
                       run_metadata=metadata)
      return time.time() - start, metadata
    start = time.time()
    self.session.run([self.train_op, self.loss])
    seconds = time.time() - start
    if self.first_seconds is None:
      self.first_seconds = seconds
    return seconds

  def Close(self):
    self.session.close()


class _Chain:
  """The layers built as plain children of nothing: vars and thetas."""

  def __init__(self, layer_params):
    self.layers = [lp.Instantiate() for lp in layer_params]
    self.thetas = [layer.theta for layer in self.layers]
    self.vars = py_utils.NestedMap(
        {'layer%d' % i: layer.vars for i, layer in enumerate(self.layers)})


def _LingvoCluster(devices):
  """A Lingvo cluster whose model split is `devices` of worker task 0."""
  p = cluster_factory.Current().params.Copy()
  job = devices[0].split('/')[1]  # 'job:worker'
  p.worker.name = '/' + job
  p.worker.cpus_per_replica = len(devices)
  p.worker.devices_per_split = len(devices)
  return cluster_factory.Cluster(p)


def RaisePriority(pids, niceness):
  """Gives the autogroups of `pids` niceness -`niceness` (Linux, root).

  Returns:
    True if it worked for every pid.
  """
  ok = True
  for pid in pids:
    try:
      with open('/proc/%d/autogroup' % pid, 'w') as f:
        f.write(str(-niceness))
    except OSError:
      ok = False
  return ok


class Runner:
  """Worker clusters per K and the steps of many configurations."""

  def __init__(self, inter_op_threads=2, priority=0, log=print):
    """Constructor.

    Args:
      inter_op_threads: inter-op threads of the pinned one-core workers.
      priority: if > 0, raise the workers' scheduling priority by this much
        (see RaisePriority).
      log: a print-like function for progress lines.
    """
    self._clusters = {}
    self._inter_op = inter_op_threads
    self._priority = priority
    self._log = log
    self.priority_ok = None
    self.steps = []

  def Cluster(self, impl, num_stages):
    """The worker processes of an implementation and K (shared by its M).

    Args:
      impl: 'gpipe' (K pinned one-core workers), 'lingvo' (one unpinned
        worker with K virtual CPUs) or 'plain' (one unpinned worker).
      num_stages: K (for 'gpipe': the workers, R x K with replicas).

    Returns:
      A LocalCluster.
    """
    if impl == 'inline':
      impl = 'gpipe'  # the same pinned one-core worker as ours at K=1
    key = (impl, num_stages if impl != 'plain' else 1)
    if key not in self._clusters:
      if impl == 'gpipe':
        cluster = local_cluster.LocalCluster(
            num_stages, pin_cores=True, intra_op_threads=1,
            inter_op_threads=self._inter_op)
      else:
        cluster = local_cluster.LocalCluster(
            1, pin_cores=False, intra_op_threads=ALL_CORES,
            inter_op_threads=ALL_CORES,
            cpu_devices=num_stages if impl == 'lingvo' else 1)
      if self._priority > 0:
        ok = RaisePriority(cluster.pids, self._priority)
        self.priority_ok = ok if self.priority_ok is None else (
            self.priority_ok and ok)
      self._clusters[key] = cluster
    return self._clusters[key]

  def Devices(self, config):
    cluster = self.Cluster(config.impl, config.num_workers)
    if config.impl in ('gpipe', 'inline'):
      return cluster.devices
    device = cluster.devices[0]
    return [device[:-1] + str(k) for k in range(config.num_stages)]

  def Add(self, config):
    """Builds a configuration's step; returns the Step."""
    cluster = self.Cluster(config.impl, config.num_workers)
    step = Step(config, cluster.target, self.Devices(config))
    self._log('built %-28s in %5.1f s, %6d ops' %
              (config.label, step.build_seconds, step.num_ops))
    self.steps.append(step)
    return step

  def TimeInterleaved(self, steps, num_steps, warmup=2):
    """Times `num_steps` rounds of one step of each configuration in turn.

    Args:
      steps: Steps to compare.
      num_steps: timed rounds.
      warmup: untimed rounds first.

    Returns:
      {label: median seconds per step}.
    """
    for _ in range(warmup):
      for step in steps:
        step.Run()
    for r in range(num_steps):
      # Alternate the order so neither end of a round is favoured.
      for step in (steps if r % 2 == 0 else list(reversed(steps))):
        step.times.append(step.Run())
    return {s.config.label: statistics.median(s.times) for s in steps}

  def Close(self):
    for step in self.steps:
      step.Close()
    self.steps = []
    for cluster in self._clusters.values():
      cluster.Stop()
    self._clusters = {}


def Median(values):
  return float(np.median(values))
