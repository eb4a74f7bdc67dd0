"""Running a pipelining layer's stages over micro-batches (a layer mixin).

``PipelineExecutor`` is the half of a pipelining layer that builds the graph
of one mini-batch: the layers before the pipeline on the whole batch, the
split into micro-batches, one call per (stage, micro-batch) in the schedule's
order, gradient accumulation, batch-norm and accumulator updates, and the
merge. It does not decide which layers form a stage: the layer class mixing it
in does. ``gpipe.PipeliningLayer`` cuts its layers itself;
``gpipe.lingvo_adapter`` runs the cells that Lingvo's own GPipe layers (and
their stacks) built, with their variable names.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import accumulation
from gpipe import batch_norm
from gpipe import micro_batch
from gpipe import precision
from gpipe import randomness
from gpipe import replicas
from gpipe import separability
from gpipe import split_backward
from gpipe import stage as stage_lib
from gpipe import stage_layers
from gpipe import task_ops
from gpipe import weight_batching
from gpipe import xla
from gpipe.schedules import inference
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import registry as schedules
from gpipe.schedules import timed
from lingvo import compat as tf
from lingvo.core import py_utils


class StepSetup(
    collections.namedtuple('StepSetup', [
        'num_micro_batches', 'per_replica', 'replica_orders', 'scheduled_ops',
        'check', 'inputs', 'targets', 'weight_phase'
    ])):
  """A pipelined mini-batch before its first task (``_SetUpStep``).

  Attributes:
    num_micro_batches: R x M.
    per_replica: M.
    replica_orders: per replica, per device, its Tasks in run order (with
      the replica's global micro-batch indices).
    scheduled_ops: the task_ops.ScheduledOps imposing those orders.
    check: the separability.Checker of the schedule's per-micro-batch loss,
      or None.
    inputs: per micro-batch, the pipeline's inputs.
    targets: per micro-batch, the loss layer's targets (or None each).
    weight_phase: the phase whose order the weight gradients are summed in.
  """

  __slots__ = ()


class PipelineExecutor:
  """Builds a pipelined mini-batch from the stages a layer class defines.

  The class mixing this in (a ``base_layer.BaseLayer``) provides:

  * ``self.params`` with ``batch_dim``, ``num_micro_batches``,
    ``micro_batch_size``, ``remat``, ``schedule``, ``seed``, ``state_dtype``
    and ``nested_map_fprop``;
  * ``self.stage_devices`` (one device per stage) and ``self.num_stages``;
    optionally ``self.replica_devices``: R lists of K stage devices for R
    data-parallel replicas (``gpipe.replicas``; default one pipeline);
  * ``_StageLayers(k)`` -> (theta keys, layers) of stage k;
  * ``_BeforeLayers()`` -> (theta keys, layers) run on the whole batch on the
    first stage's device before the split;
  * ``_LossLayer()`` -> (theta key, layer) run at the end of the last stage
    on each micro-batch, or (None, None).
  """

  @property
  def replica_devices(self):
    """R lists of the K stage devices of each replica (here R = 1)."""
    return [self.stage_devices]

  @property
  def num_replicas(self):
    return len(self.replica_devices)

  def Stages(self, replica=0):
    """The pipeline's stages, first stage first: their layers and devices.

    The public view of the cut, for code that runs a stage's layers itself
    (e.g. a decoder's step per stage in lanes: ``gpipe/lanes.py``, and
    docs/INFERENCE.md)::

      for stage in net.Stages():
        with tf.device(stage.device):
          x = ...  # stage.layers on stage.Theta(theta)

    Args:
      replica: r, the replica whose devices the stages name (0: the first,
        or only, pipeline).

    Returns:
      A list of K ``stage_layers.StageLayers`` (index, device, keys, layers).
    """
    devices = self.replica_devices[replica]
    stages = []
    for k in range(self.num_stages):
      keys, layers = self._StageLayers(k)
      stages.append(stage_layers.StageLayers(k, devices[k], list(keys),
                                             list(layers)))
    return stages

  def _BatchedWeights(self):
    """Whether each stage computes its weight gradients once per step."""
    return (bool(getattr(self.params, 'batched_weight_gradients', False)) and
            not self._ForwardOnly())

  def _ForwardOnly(self):
    """Whether this pipeline runs inference: the layer is in eval mode.

    Inference runs the forward-only schedule (gpipe.schedules.inference):
    F tasks only, micro-batch after micro-batch on each stage's device,
    whatever training schedule p.schedule names, and the stage functions
    trace no backward pass (no re-materialization).
    """
    return bool(self.do_eval)

  def _StageFns(self, micro_batch_inputs, replica=0, num_micro_batches=1):
    """The StageFunctions for this mode, input signature and replica."""
    batched = self._BatchedWeights()
    key = (replica, self.do_eval, batched and num_micro_batches, tuple(
        (tuple(t.shape.as_list()), t.dtype.name)
        for t in micro_batch.Present(micro_batch_inputs)),
           str(tf.nest.map_structure(lambda t: t is None,
                                     micro_batch_inputs)))
    # Traced stage functions per (replica, eval mode, micro-batch input
    # signature): training and eval graphs, or another batch size, need
    # their own traces.
    cache = self.__dict__.setdefault('_stage_fns', {})
    if key not in cache:
      p = self.params
      split = (schedules.Get(p.schedule).split_backward or
               batched) and not self._ForwardOnly()
      cls = (split_backward.SplitStageFunctions if split else
             stage_lib.StageFunctions)
      extra = {}
      if split:
        extra = dict(batch_weights_over=num_micro_batches if batched else None,
                     batch_dim=p.batch_dim,
                     small_matmul_rows=getattr(
                         p, 'swap_small_matmul_rows',
                         split_backward.SMALL_MATMUL_ROWS))
      loss_key, loss_layer = self._LossLayer()
      devices = self.replica_devices[replica]
      fns = []
      for k in range(self.num_stages):
        keys, layers = self._StageLayers(k)
        remat = (not self._ForwardOnly() and
                 pipeline_tasks.RematerializesStage(p.remat, k,
                                                    self.num_stages))
        last = k == self.num_stages - 1 and loss_layer is not None
        fns.append(
            cls(k, layers, keys, devices[k], remat,
                loss_layer=loss_layer if last else None,
                loss_key=loss_key if last else None,
                compile=getattr(p, 'compile', None), **extra))
      cache[key] = fns
    return cache[key]

  def _NumMicroBatches(self, inputs, targets=None):
    p = self.params
    if targets is not None:
      inputs = tuple(inputs) + (targets,)
    batch = micro_batch.StaticBatchSize(inputs, p.batch_dim)
    try:
      # R x M with data-parallel replicas.
      return micro_batch.NumMicroBatches(batch, p.num_micro_batches,
                                         p.micro_batch_size, self.num_replicas)
    except ValueError as e:
      raise ValueError('%s: %s' % (p.name, e)) from None

  def _Seeds(self, num_micro_batches, step=None, first=0):
    """The seeds of micro-batches first .. first + num_micro_batches - 1.

    Args:
      num_micro_batches: how many.
      step: the global step to derive them from (default: Lingvo's, or 0).
      first: the index of the first.

    Returns:
      A list of int64 [2] tensors (randomness.MicroBatchSeed).
    """
    if step is None:
      step = stage_lib.GlobalStepOrZero()
    return randomness.MicroBatchSeeds(
        step, range(first, first + num_micro_batches), self.params.seed)

  @staticmethod
  def _Unwrap(outputs):
    return outputs[0] if len(outputs) == 1 else outputs

  def _CheckTargets(self, targets):
    p = self.params
    _, loss_layer = self._LossLayer()
    if (loss_layer is None) != (targets is None):
      raise ValueError(
          '%s: %s' % (p.name, 'pass the loss layer\'s targets: FProp(theta, '
                      '*inputs, targets=...)' if targets is None else
                      'FProp got targets but p.loss_tpl is not set: set a '
                      'loss layer to consume them'))

  def _CheckNestedMapInputs(self, inputs):
    p = self.params
    if p.nested_map_fprop and (len(inputs) != 1 or not isinstance(
        inputs[0], py_utils.NestedMap)):
      raise ValueError(
          '%s: nested_map_fprop=True takes exactly one NestedMap input (got '
          '%s); pass the inputs as one NestedMap or set nested_map_fprop='
          'False' % (p.name, [type(x).__name__ for x in inputs]))

  def _CheckStageOutputs(self, k, outputs):
    """Lingvo's contract for what a stage hands over (state_dtype, maps)."""
    p = self.params
    if p.nested_map_fprop and (len(outputs) != 1 or not isinstance(
        outputs[0], py_utils.NestedMap)):
      raise ValueError(
          '%s: with nested_map_fprop=True every stage must return one '
          'NestedMap, but stage %d returned %s; return a NestedMap from the '
          "stage's last layer or set nested_map_fprop=False" %
          (p.name, k, [type(x).__name__ for x in outputs]))
    if p.state_dtype is None:
      return
    want = tf.as_dtype(p.state_dtype)
    for t in micro_batch.Present(outputs):
      if t.dtype != want:
        raise ValueError(
            '%s: state_dtype is %s but stage %d hands over %s of dtype %s: '
            'cast it in the stage (or set state_dtype=%s, or None to allow '
            'any dtype)' % (p.name, want.name, k, t.name, t.dtype.name,
                            t.dtype.name))

  def _RunBeforeLayers(self, theta, inputs, device):
    keys, layers = self._BeforeLayers()
    if not layers:
      return tuple(inputs)
    with tf.device(device):
      return stage_lib.ChainFProp(layers, [theta[k] for k in keys],
                                  tuple(inputs))

  def _SetUpStep(self, theta, inputs, targets):
    """Everything a pipelined mini-batch needs before its first task.

    Runs the layers before the pipeline, casts to the compute dtype, resolves
    R x M, builds each replica's task orders (shifted to its micro-batches)
    and the ScheduledOps that imposes them, and splits inputs and targets.

    Args:
      theta: this layer's theta.
      inputs: the pipeline's inputs (a tuple).
      targets: the loss layer's targets, or None.

    Returns:
      A StepSetup.
    """
    p = self.params
    self._CheckTargets(targets)
    self._CheckNestedMapInputs(inputs)
    devices = self.stage_devices
    inputs = self._RunBeforeLayers(theta, inputs, devices[0])
    with tf.device(devices[0]):
      # Mixed precision: the stages compute in (and hand over) fprop_dtype.
      inputs = precision.CastFloats(inputs, precision.ComputeDtype(p))
    num_mb = self._NumMicroBatches(inputs, targets)
    spec = schedules.Get(p.schedule)
    forward_only = self._ForwardOnly()
    # Replica r runs micro-batches r*M .. r*M+M-1 (gpipe/replicas.py).
    per_replica = num_mb // self.num_replicas
    replica_orders = []
    for r, replica_devices in enumerate(self.replica_devices):
      devices_r = [replicas.Canonical(d) for d in replica_devices]
      try:
        if forward_only:
          _, orders = inference.ForwardOrders(devices_r, per_replica)
        else:
          _, orders = schedules.Orders(
              p.schedule, devices_r, per_replica, timed.PipelineCosts(
                  p.remat, self.num_stages, getattr(p, 'task_costs', None)))
      except ValueError as e:
        raise ValueError('%s: %s' % (p.name, e)) from None
      if self._BatchedWeights():
        orders = weight_batching.Orders(orders)
      replica_orders.append(replicas.ShiftOrders(orders, r * per_replica))
    scheduled_ops = task_ops.ScheduledOps(
        [order for orders in replica_orders for order in orders])
    check = None
    if spec.per_micro_batch_loss and not forward_only:
      check = separability.Checker(p.name, p.schedule, scheduled_ops,
                                   self.num_stages, num_mb,
                                   targets is not None)
    with tf.device(devices[0]):
      inputs_mb = micro_batch.Split(tuple(inputs), num_mb, p.batch_dim)
    split_targets = [None] * num_mb
    if targets is not None:
      with tf.device(devices[-1]):
        split_targets = micro_batch.Split(targets, num_mb, p.batch_dim)
    # The accumulation views follow the order of the weight gradients (one
    # batched W: the order of the B tasks, which each give theta nothing;
    # forward only: the order of the F tasks, there are no gradients).
    weight_phase = (pipeline_tasks.WEIGHT if spec.split_backward and
                    not self._BatchedWeights() else pipeline_tasks.BACKWARD)
    if forward_only:
      weight_phase = pipeline_tasks.FORWARD
    return StepSetup(
        num_micro_batches=num_mb, per_replica=per_replica,
        replica_orders=replica_orders, scheduled_ops=scheduled_ops,
        check=check, inputs=inputs_mb, targets=split_targets,
        weight_phase=weight_phase)

  def _RunStage(self, setup, theta, fns, replica, current, accumulated):
    """Stage `fns`'s calls for every micro-batch of one replica.

    Args:
      setup: the StepSetup.
      theta: this layer's theta.
      fns: the stage's StageFunctions for this replica.
      replica: r.
      current: the stage's per-micro-batch inputs.
      accumulated: the stage's accumulator values before these calls.

    Returns:
      The list of the calls' StageResults, in micro-batch order.
    """
    k = fns.index
    first = replica * setup.per_replica
    fns.BeginStep()
    theta_k, low_dtypes = precision.MasterTheta(
        stage_lib.NestedTheta(theta, fns.keys))
    theta_k = stage_lib.ReadTheta(theta_k, fns.device)
    # The replica's own micro-batches 0 .. M-1, in weight-gradient order.
    weight_order = [
        t.micro_batch - first for order in setup.replica_orders[replica]
        for t in order if t.stage == k and t.phase == setup.weight_phase
    ]
    thetas = accumulation.AccumulationViews(theta_k, weight_order, fns.device,
                                         low_dtypes)
    last = k == self.num_stages - 1
    step = stage_lib.StepOnDevice(fns.device)
    # Each stage computes the micro-batches' seeds on its own device from
    # its copy of the step: seeds made once on the host would be copied to
    # every stage's device in every call (gpipe.measure.gpu_audit).
    with tf.device(fns.device):
      seeds = self._Seeds(setup.per_replica, step, first)
    results = []
    for m in range(setup.per_replica):
      result = fns.Call(stage_lib.MicroBatchCall(
          theta=thetas[m], args=current[m], seed=seeds[m],
          step=step, micro_batch=first + m,
          targets=setup.targets[first + m] if last else None,
          check_d_outputs=(setup.check.Check if (setup.check and last) else
                           None),
          accumulator_values=accumulated), setup.scheduled_ops)
      accumulated = result.accumulator_values
      results.append(result)
    return results

  def _RunPipeline(self, theta, inputs, targets):
    """FProp of the pipeline (see gpipe.PipeliningLayer.FProp)."""
    p = self.params
    setup = self._SetUpStep(theta, inputs, targets)
    devices = self.stage_devices
    outputs = []
    stage_stats = [[] for _ in range(self.num_stages)]
    stats_layers = [[] for _ in range(self.num_stages)]
    # Each stage's accumulators go through its calls in order, replica
    # after replica (only layers with accumulators are chained so).
    accumulated = [None] * self.num_stages
    for r in range(self.num_replicas):
      first = r * setup.per_replica
      current = setup.inputs[first:first + setup.per_replica]
      for fns in self._StageFns(current[0], r, setup.per_replica):
        k = fns.index
        if accumulated[k] is None:
          accumulated[k] = fns.InitialAccumulatorValues()
        results = self._RunStage(setup, theta, fns, r, current, accumulated[k])
        if r == 0 and not (k == self.num_stages - 1 and targets is not None):
          self._CheckStageOutputs(k, results[0].outputs)
        accumulated[k] = results[-1].accumulator_values
        stage_stats[k] += [result.stats for result in results]
        stats_layers[k] = results[-1].stats_layers
        if r == self.num_replicas - 1:
          for acc, value in zip(fns.accumulators, accumulated[k]):
            acc.SetValue(value)
        current = [result.outputs for result in results]
      outputs += current
    # Batch-norm statistics summed over all replicas' micro-batches.
    bn_stats = []
    for k in range(self.num_stages):
      bn_stats += self._ApplyBatchNormUpdates(stats_layers[k], stage_stats[k],
                                              devices[k])
    with tf.device(devices[-1]):
      merged = precision.ToMasterDtype(
          p, micro_batch.Merge(outputs, p.batch_dim))
      return self._Unwrap(self._DependOn(merged, bn_stats))

  def FPropUnpipelined(self, theta, *inputs, targets=None):
    """The reference: the same layers, micro-batches and randomness, inline.

    Runs every micro-batch through all layers in the current device scope,
    without graph functions, re-materialization or stages. Gradients of this
    output equal those of FProp.

    Args:
      theta: this layer's theta.
      *inputs: as for FProp.
      targets: as for FProp.

    Returns:
      As FProp.
    """
    p = self.params
    self._CheckTargets(targets)
    self._CheckNestedMapInputs(inputs)
    inputs = self._RunBeforeLayers(theta, inputs, None)
    inputs = precision.CastFloats(inputs, precision.ComputeDtype(p))
    num_mb = self._NumMicroBatches(inputs, targets)
    seeds = self._Seeds(num_mb)
    keys, layers = [], []
    for k in range(self.num_stages):
      stage_keys, stage_layers = self._StageLayers(k)
      keys += stage_keys
      layers += stage_layers
    thetas = [theta[key] for key in keys]
    loss_key, loss_layer = self._LossLayer()
    split_targets = [None] * num_mb
    if targets is not None:
      split_targets = micro_batch.Split(targets, num_mb, p.batch_dim)
    outs, stats = [], []
    layers_with_stats = []
    for m, args in enumerate(micro_batch.Split(tuple(inputs), num_mb,
                                               p.batch_dim)):
      with randomness.MicroBatchSeedScope(seeds[m]):
        with batch_norm.CollectStats() as collector:
          out = stage_lib.ChainFProp(layers, thetas, args)
          if targets is not None:
            out = precision.CastFloats(tuple(out), py_utils.FPropDtype(
                loss_layer.params))
            out = stage_lib.ChainFProp([loss_layer], [theta[loss_key]],
                                       tuple(out) + (split_targets[m],))
          outs.append(out)
      layers_with_stats = [layer for layer, _ in collector.reports]
      stats.append([s for _, group in collector.reports for s in group])
    bn_stats = self._ApplyBatchNormUpdates(layers_with_stats, stats, None)
    merged = precision.ToMasterDtype(p, micro_batch.Merge(outs, p.batch_dim))
    return self._Unwrap(self._DependOn(merged, bn_stats))

  @staticmethod
  def _ApplyBatchNormUpdates(layers, stats_per_micro_batch, device):
    """Sums each layer's statistics over micro-batches; one update each.

    Args:
      layers: the batch-norm layers that reported statistics, in order.
      stats_per_micro_batch: per micro-batch, the flat list of their
        (count, sum, sum_sq).
      device: where to add them up (the stage's device).

    Returns:
      The mini-batch statistics the updates assign from.
    """
    summaries = []
    with tf.device(device):
      for i, layer in enumerate(layers):
        summed = [
            tf.add_n([stats[3 * i + j] for stats in stats_per_micro_batch])
            for j in range(3)
        ]
        summaries += layer.AccumulatedUpdates(*summed)
    return summaries

  @staticmethod
  def _DependOn(outputs, stats):
    """`outputs`, computed only once the batch-norm statistics exist.

    Lingvo's train op runs the batch-norm updates whose statistics the loss
    depends on (py_utils.FindRelevantBatchNormUpdates). The statistics are
    summed outside the stage calls, so a control dependency of the outputs on
    them makes the updates count as part of the loss's computation. It costs
    nothing: the last stage's outputs are ready after every stage's forward.

    Args:
      outputs: the merged outputs (a tuple nest of tensors).
      stats: the statistic tensors.

    Returns:
      `outputs` through identities that depend on `stats`.
    """
    if not stats:
      return outputs
    with tf.control_dependencies(stats):
      return tf.nest.map_structure(
          lambda t: None if t is None else tf.identity(t), outputs)


REMAT_MODES = pipeline_tasks.REMAT_MODES


def DefineParams(p):
  """Defines the executor's own params on a pipelining layer's Params `p`."""
  p.Define(
      'stage_devices', None,
      'K device strings, one per stage: local CPUs/GPUs/TPU cores or '
      "'/job:worker/replica:0/task:i/device:CPU:0' of TensorFlow's "
      'distributed runtime. A device may hold several stages, e.g. '
      '[d0, d1, d0, d1]: it runs them breadth-first, which shrinks the '
      'bubble (see gpipe.PipeliningLayer). Default: the devices of the '
      "current Lingvo cluster's model split.")
  p.Define('remat', 'always',
           "Re-materialization: 'always', 'except_last' or 'never' (see "
           "gpipe.PipeliningLayer). 'except_last' recomputes every stage but "
           'the last *stage* (whose backward starts right after its forward); '
           "torchgpipe's checkpoint='except_last' instead skips the last "
           '*micro-batch*.')
  p.Define(
      'schedule', 'gpipe',
      'The pipeline schedule, a name in the registry gpipe.schedules: ' +
      schedules.ParamDoc() + '. All but the ones without a per-micro-batch '
      'loss need the loss computed per micro-batch in the last stage '
      '(gpipe.PipeliningLayer.loss_tpl).')
  p.Define('seed', 0, 'Mixed into every micro-batch seed.')
  p.Define(
      'task_costs', None,
      'Measured task costs the schedules that order tasks by cost use '
      "('zb_auto', 'zb_h1', 'zb_v'): a dict of per-stage lists 'F', 'B', "
      "'W' (any unit; B with its recomputed forward under remat), optional "
      "'handover' (K-1 boundaries) and memory limits 'max_in_flight' / "
      "'max_awaiting_weight' (micro-batches per stage between F and B / W); "
      'see gpipe.schedules.timed.StageCosts. Written by the planner '
      '(gpipe.plan, python -m tools.plan). None: equal costs, a B that '
      're-materializes costing two. Gradients do not depend on it.')
  p.Define(
      'batched_weight_gradients', False,
      'Compute each stage\'s weight gradients once per step for all '
      'micro-batches, after its last backward task, instead of once per '
      'micro-batch (gpipe.weight_batching): one large matmul per weight '
      'instead of M small ones and no running sum; costs the memory of what '
      'the weight gradients read until the end of the backward pass.')
  p.Define(
      'swap_small_matmul_rows', split_backward.SMALL_MATMUL_ROWS,
      'Under split-backward schedules, an input-gradient matmul dy W^T of at '
      'most this many rows that reads a weight transposed is computed as '
      '(W dy^T)^T, the weight read in place. Why: oneDNN re-packs a '
      "matmul's second operand on every call, and at a few rows that copy of "
      'the weight costs about as much as the product (figures: '
      'docs/BENCHMARKS.md, per-micro-batch cost). 0 turns the rewrite off.')
  p.Define(
      'compile', None,
      "None, 'xla' or 'xla_where_possible': compile every stage function "
      'with XLA (tf.function(jit_compile=True); gpipe/xla.py): the forward, '
      'the backward and its recomputation, B and W of a split backward, the '
      'batched W, and in pipelined decoding the encoder stages and the '
      'decoding steps (gpipe.lanes); each call is one fused XLA computation '
      'on its device (CPU, GPU), under every schedule, remat mode, replicas '
      'and fprop_dtype. Costs: XLA compiles each function at its first run, '
      'and again for each new input shape (the first step takes longer, '
      "seconds per stage); the session graph does not grow. Dropout through "
      'gpipe.randomness draws the same masks compiled or not (TensorFlow\'s '
      'own random ops do not: see gpipe/xla.py). '
      'Not compiled: before_tpl, the micro-batch split and merge, the '
      'gradient sums. An op without an XLA kernel for the stage\'s device '
      '(string ops, py_function, Lingvo custom ops, tf.print) is, with '
      "'xla', an error when the graph is built naming the stage, layer and "
      "op; with 'xla_where_possible' that stage's functions all run "
      'uncompiled (a warning names the op) and the other stages are '
      'compiled. TPU devices are not checked.')


def CheckParams(p):
  """Refuses unknown remat modes and schedules, naming the known ones."""
  if p.remat not in REMAT_MODES:
    raise ValueError('%s: unknown remat %r; use one of %s' %
                     (p.name, p.remat, ', '.join(REMAT_MODES)))
  try:
    schedules.Get(p.schedule)
  except ValueError as e:
    raise ValueError('%s: %s' % (p.name, e)) from None
  xla.CheckMode(p.name, getattr(p, 'compile', None))


def ResolveDevices(p, cluster, num_stages):
  """The stage devices: p.stage_devices, else the cluster's model split."""
  if p.stage_devices:
    if len(p.stage_devices) < num_stages:
      raise ValueError(
          '%s: %d stages but only %d stage_devices (%s): give one device '
          'per stage or use fewer stages' %
          (p.name, num_stages, len(p.stage_devices), p.stage_devices))
    return list(p.stage_devices[:num_stages])
  available = cluster.num_devices_per_split
  if available < num_stages:
    raise ValueError(
        '%s: %d stages but the current Lingvo cluster has %d device(s) per '
        'model split: set stage_devices, or run inside a cluster with '
        'split_size >= %d (e.g. cluster_factory.ForTestingWorker(cpus=%d, '
        'split_size=%d) with that many CPU devices)' %
        (p.name, num_stages, available, num_stages, num_stages, num_stages))
  return [cluster.WorkerDeviceInModelSplit(k) for k in range(num_stages)]
