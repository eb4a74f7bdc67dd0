"""PipeliningLayer: GPipe's micro-batch pipeline as a Lingvo layer."""

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import micro_batch
from gpipe import partition
from gpipe import pipeline_tasks
from gpipe import randomness
from gpipe import replicas
from gpipe import schedule
from gpipe import separability
from gpipe import split_backward
from gpipe import stage as stage_lib
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

REMAT_MODES = ('always', 'except_last', 'never')

# The child (and variable scope) name of the loss layer (p.loss_tpl).
LOSS_KEY = 'loss'



class PipeliningLayer(base_layer.BaseLayer):
  """Runs a sequence of layers as a K-stage, M-micro-batch GPipe pipeline.

  The mini-batch is split into M micro-batches along ``batch_dim``. Stage k
  (a run of consecutive layers on ``stage_devices[k]``) processes micro-batch
  m as soon as stage k-1 has handed it over, so the stages work like an
  assembly line. With the default ``schedule='gpipe'`` (fill-drain), for K=3
  and M=4 (Fm / Bm: forward / backward of micro-batch m)::

      time ->
      stage 0 | F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
      stage 1 | .  F0 F1 F2 F3 .  .  B3 B2 B1 B0 .
      stage 2 | .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .

  The '.' cells are the bubble: a fraction (K-1)/(M+K-1) of each stage's
  time, negligible once M >= 4K. Gradients of the M micro-batches add up
  into one gradient per variable, so one optimizer step per mini-batch gives
  exactly the update of unpipelined training. They are added one backward
  task at a time (``stage.AccumulationViews``), so a stage holds one running
  gradient sum, not M gradients of its weights.

  What is stored and what is recomputed (``remat``):

  * ``'always'`` (default): during the forward pass each stage keeps only its
    boundary input per micro-batch (N/M examples x M = the stage's input for
    the whole batch); Bm first recomputes the stage's forward pass for
    micro-batch m, then back-propagates through it. Peak activation memory is
    O(N + (L/K) x N/M) instead of O(N x L), for about one extra forward pass.
  * ``'except_last'``: like 'always' but the last stage, whose backward
    starts right after its forward, keeps its activations.
  * ``'never'``: every stage keeps every activation (no recomputation).

  Randomness (dropout, drop path through ``gpipe.randomness``) is seeded per
  (global step, micro-batch), so micro-batches draw different masks and the
  recomputed forward draws the same ones. Batch norm
  (``gpipe.batch_norm.MicroBatchBatchNormLayer``) normalizes with
  micro-batch statistics and updates its moving averages once per mini-batch.

  Several stages may share a device (a loop): with ``stage_devices`` =
  [d0, d1, d0, d1] each device holds v=2 stages of half the size and runs
  its tasks breadth-first (``schedule.DeviceOrders``). The bubble shrinks to
  (D-1)/(vM+D-1) for D devices, at the price of 2(v-1)D more hand-overs per
  micro-batch; stored activations grow with the number of stage boundaries.

  Other schedules (``schedule``; each drawn in ``gpipe/schedule.py``):

  * ``'1f1b'``: stage s starts micro-batch m's backward after K-1-s more
    forwards, so it holds at most K-s micro-batches' activations (GPipe: M),
    with GPipe's bubble. ``'interleaved_1f1b'``: the same with v stages per
    device (round-robin ``stage_devices``), bubble (D-1)/(vM+D-1).
  * ``'zb_h1'`` and ``'zb_v'`` (zero bubble): each backward is two tasks, B
    (the input gradient, which the previous stage waits for) and W (the
    weight gradient, which fills bubbles). With remat B recomputes the
    forward once and keeps what W needs until W runs
    (``gpipe.split_backward``). ``'zb_v'`` puts two stages per device in a V,
    ``stage_devices`` [d0, d1, ..., d1, d0].

  All but ``'gpipe'`` start a micro-batch's backward at the last stage right
  after its forward, so the loss of each micro-batch must be computed inside
  the pipeline: set ``loss_tpl`` to a layer returning per-example losses and
  call ``FProp(theta, *inputs, targets=labels)``::

      p.loss_tpl = MyLoss.Params()   # FProp(theta, logits, targets) -> [N]
      p.schedule = '1f1b'
      per_example = net.FProp(net.theta, images, targets=labels)
      loss = tf.reduce_mean(per_example)   # tf.gradients as usual

  A loss whose gradient for one micro-batch needs other micro-batches'
  forwards (e.g. computed on the merged logits) is refused with an error
  when gradients are built (``gpipe.separability``), never a hang. The
  schedule's order ties later forwards to earlier backward tasks: once
  gradients are built, fetching only the outputs still runs those backward
  tasks (build evaluation in its own graph, as the trainer does).

  Each stage is traced once into graph functions, and each micro-batch is one
  call: the graph holds K x M calls, not L x M copies of the layers.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define(
        'cell_tpl', None,
        'A list of K layer params, one per stage (each may be a sequential '
        'layer of its own). Exactly one of cell_tpl and layers is set.')
    p.Define(
        'layers', None,
        'A flat list of layer params, cut into num_stages consecutive stages '
        'by partition_cost (or stage_sizes). Variable names do not depend on '
        'the cut, so a checkpoint works for any num_stages.')
    p.Define('num_stages', None,
             'K, with `layers`: the number of stages to cut them into.')
    p.Define(
        'partition_cost', 'params',
        "How `layers` are balanced: 'flops' (FPropMeta, needs input_shapes), "
        "'params' (parameter bytes), 'time' (measured per layer, needs "
        "input_shapes as TensorSpecs; costs a few session runs at build "
        "time) or 'uniform' (equal layer counts).")
    p.Define('stage_sizes', None,
             'Explicit layers per stage (overrides partition_cost).')
    p.Define(
        'input_shapes', None,
        'Shapes of ONE micro-batch of the pipeline inputs (lists of ints, '
        "tshape.Shape or tf.TensorSpec), for partition_cost 'flops'/'time'.")
    p.Define(
        'num_micro_batches', None,
        'M: micro-batches per mini-batch (must divide the batch). More '
        'micro-batches shrink the bubble and the activation memory but add '
        'a call per stage each. Set this or micro_batch_size, not both.')
    p.Define('micro_batch_size', None,
             'Examples per micro-batch (M = batch / micro_batch_size).')
    p.Define('batch_dim', 0, 'The batch dimension of every input tensor.')
    p.Define(
        'stage_devices', None,
        'K device strings, one per stage: local CPUs/GPUs/TPU cores or '
        "'/job:worker/replica:0/task:i/device:CPU:0' of TensorFlow's "
        'distributed runtime. A device may hold several stages, e.g. '
        '[d0, d1, d0, d1]: it runs them breadth-first, which shrinks the '
        'bubble (see the class docstring). Default: the devices of the '
        "current Lingvo cluster's model split.")
    p.Define('remat', 'always',
             "Re-materialization: 'always', 'except_last' or 'never' (see the "
             'class docstring).')
    p.Define(
        'schedule', 'gpipe',
        "The pipeline schedule, a name in gpipe.schedule.SCHEDULES: 'gpipe' "
        "(fill-drain), '1f1b', 'interleaved_1f1b' (stage_devices round-robin, "
        "e.g. [d0, d1, d0, d1]), 'zb_h1' (zero bubble, split backward) or "
        "'zb_v' (zero bubble, stage_devices in a V: [d0, d1, d1, d0]). All "
        "but 'gpipe' need loss_tpl (see the class docstring).")
    p.Define(
        'loss_tpl', None,
        'Optional loss layer run at the end of the last stage on each '
        'micro-batch: FProp(theta, *last_layer_outputs, targets) returning '
        'per-example losses [batch] (or one per micro-batch, shape [1]), '
        'with anything else the '
        'caller needs (e.g. a NestedMap(loss=..., logits=...)). The targets '
        'are FProp\'s `targets` argument, split like the inputs. The caller '
        'reduces the merged output (tf.reduce_mean, tf.reduce_sum). With it, '
        "micro-batch m's backward can start right after its forward: every "
        "schedule but 'gpipe' needs it.")
    p.Define('seed', 0, 'Mixed into every micro-batch seed.')
    p.Define(
        'replica_devices', None,
        'Data parallelism: R lists of K stage devices, one pipeline replica '
        'per list, on R x K devices. The variables live on the first list '
        '(one copy; checkpoints do not depend on R), each replica reads them '
        'on its own devices, the mini-batch is split into R x M '
        'micro-batches (M = num_micro_batches per replica) and the R '
        'gradients of each weight are summed on its device: the loss, '
        'gradients and batch-norm moving averages of one pipeline with '
        'R x M micro-batches (see gpipe/replicas.py). None: one pipeline.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.remat not in REMAT_MODES:
      raise ValueError('%s: unknown remat %r; use one of %s' %
                       (p.name, p.remat, ', '.join(REMAT_MODES)))
    if p.schedule not in schedule.SCHEDULES:
      raise ValueError('%s: unknown schedule %r; known: %s' %
                       (p.name, p.schedule, ', '.join(schedule.SCHEDULES)))
    if p.num_micro_batches and p.micro_batch_size:
      raise ValueError(
          '%s: set either num_micro_batches (%d) or micro_batch_size (%d), '
          'not both' % (p.name, p.num_micro_batches, p.micro_batch_size))
    cut = partition.StageCut(p)
    self._layer_params = cut.layer_params
    self._stage_sizes = cut.sizes
    self._costs = cut.costs
    self._cost_name = cut.cost_name
    num_stages = len(self._stage_sizes)
    if p.replica_devices:
      self._replica_devices = replicas.Resolve(p.name, num_stages,
                                               p.replica_devices,
                                               p.stage_devices)
      self._devices = self._replica_devices[0]
    else:
      self._devices = self._ResolveDevices(num_stages)
      self._replica_devices = [self._devices]

    self._keys = cut.child_keys
    start = 0
    for k, size in enumerate(self._stage_sizes):
      with tf.device(self._devices[k]):
        for i in range(start, start + size):
          lp = self._layer_params[i].Copy()
          if not lp.name:
            lp.name = self._keys[i]
          self.CreateChild(self._keys[i], lp)
      start += size
    if p.loss_tpl is not None:
      with tf.device(self._devices[-1]):
        lp = p.loss_tpl.Copy()
        if not lp.name:
          lp.name = LOSS_KEY
        self.CreateChild(LOSS_KEY, lp)
    # Traced stage functions per (eval mode, micro-batch input signature):
    # training and eval graphs, or another batch size, need their own traces.
    self._stage_fns = {}

  def _ResolveDevices(self, num_stages):
    p = self.params
    if p.stage_devices:
      if len(p.stage_devices) < num_stages:
        raise ValueError(
            '%s: %d stages but only %d stage_devices (%s): give one device '
            'per stage or use fewer stages' %
            (p.name, num_stages, len(p.stage_devices), p.stage_devices))
      return list(p.stage_devices[:num_stages])
    cluster = self.cluster
    available = cluster.num_devices_per_split
    if available < num_stages:
      raise ValueError(
          '%s: %d stages but the current Lingvo cluster has %d device(s) per '
          'model split: set stage_devices, or run inside a cluster with '
          'split_size >= %d (e.g. cluster_factory.ForTestingWorker(cpus=%d, '
          'split_size=%d) with that many CPU devices)' %
          (p.name, num_stages, available, num_stages, num_stages, num_stages))
    return [cluster.WorkerDeviceInModelSplit(k) for k in range(num_stages)]

  @property
  def num_stages(self):
    return len(self._stage_sizes)

  @property
  def stage_sizes(self):
    """Layers per stage."""
    return list(self._stage_sizes)

  @property
  def stage_devices(self):
    return list(self._devices)

  @property
  def num_replicas(self):
    """R, the data-parallel replicas of the pipeline (1 without)."""
    return len(self._replica_devices)

  @property
  def replica_devices(self):
    """R lists of the K stage devices of each replica."""
    return [list(devices) for devices in self._replica_devices]

  def PartitionReport(self):
    """A table of the stages: layers, parameters and cost."""
    return partition.Report(self._layer_params, self._stage_sizes, self._costs,
                            self._cost_name)

  def _StageLayers(self, k):
    start = sum(self._stage_sizes[:k])
    keys = self._keys[start:start + self._stage_sizes[k]]
    return keys, [self.children[key] for key in keys]

  def _StageFns(self, micro_batch_inputs, replica=0):
    """The StageFunctions for this mode, input signature and replica."""
    key = (replica, self.do_eval, tuple(
        (tuple(t.shape.as_list()), t.dtype.name)
        for t in tf.nest.flatten(micro_batch_inputs)),
           str(tf.nest.map_structure(lambda _: 0, micro_batch_inputs)))
    if key not in self._stage_fns:
      p = self.params
      split = schedule.Spec(p.schedule).split_backward
      cls = (split_backward.SplitStageFunctions if split else
             stage_lib.StageFunctions)
      fns = []
      devices = self._replica_devices[replica]
      for k in range(self.num_stages):
        keys, layers = self._StageLayers(k)
        remat = p.remat == 'always' or (p.remat == 'except_last' and
                                        k < self.num_stages - 1)
        last = k == self.num_stages - 1 and p.loss_tpl is not None
        fns.append(
            cls(k, layers, keys, devices[k], remat,
                loss_layer=self.children[LOSS_KEY] if last else None,
                loss_key=LOSS_KEY if last else None))
      self._stage_fns[key] = fns
    return self._stage_fns[key]

  def _NumMicroBatches(self, inputs, targets=None):
    p = self.params
    if targets is not None:
      inputs = tuple(inputs) + (targets,)
    batch = micro_batch.StaticBatchSize(inputs, p.batch_dim)
    # R x M with data-parallel replicas.
    return replicas.NumMicroBatches(p.name, batch, self.num_replicas,
                                    p.num_micro_batches, p.micro_batch_size)

  def _Seeds(self, num_micro_batches):
    step = py_utils.GetGlobalStep()
    step = tf.constant(0, tf.int64) if step is None else step
    return [
        randomness.MicroBatchSeed(step, m, self.params.seed)
        for m in range(num_micro_batches)
    ]

  @staticmethod
  def _Unwrap(outputs):
    return outputs[0] if len(outputs) == 1 else outputs

  def _CheckTargets(self, targets):
    p = self.params
    if (p.loss_tpl is None) != (targets is None):
      raise ValueError(
          '%s: %s' % (p.name, 'pass the loss layer\'s targets: FProp(theta, '
                      '*inputs, targets=...)' if targets is None else
                      'FProp got targets but p.loss_tpl is not set: set a '
                      'loss layer to consume them'))

  def FProp(self, theta, *inputs, targets=None):
    """Runs the pipeline on a full mini-batch.

    Args:
      theta: this layer's theta.
      *inputs: the first layer's inputs (tensors and/or NestedMaps) with a
        static batch size along batch_dim.
      targets: with p.loss_tpl: the loss layer's targets (a tensor or nest,
        same batch size), split into micro-batches like the inputs.

    Returns:
      The last layer's full-batch output (a tuple if it returns several);
      with p.loss_tpl, the loss layer's.

    Raises:
      ValueError: a schedule that cannot run this placement or number of
        micro-batches, or (when gradients are taken) a loss that is not
        computed per micro-batch under a schedule that needs it.
    """
    p = self.params
    self._CheckTargets(targets)
    num_mb = self._NumMicroBatches(inputs, targets)
    spec = schedule.Spec(p.schedule)
    # Replica r runs micro-batches r*M .. r*M+M-1 (gpipe/replicas.py).
    per_replica = num_mb // self.num_replicas
    all_orders = []
    for devices in self._replica_devices:
      try:
        _, orders = schedule.Orders(p.schedule,
                                    [_Canonical(d) for d in devices],
                                    per_replica, schedule.RematCosts(
                                        p.remat != 'never'))
      except ValueError as e:
        raise ValueError('%s: %s' % (p.name, e)) from None
      all_orders.append(orders)
    registry = pipeline_tasks.TaskRegistry([
        order for r, orders in enumerate(all_orders)
        for order in replicas.ShiftOrders(orders, r * per_replica)
    ])
    weight_phase = (pipeline_tasks.WEIGHT if spec.split_backward else
                    pipeline_tasks.BACKWARD)
    check = None
    if spec.per_micro_batch_loss:
      check = separability.Checker(p.name, p.schedule, registry,
                                   self.num_stages, num_mb,
                                   p.loss_tpl is not None)
    seeds = self._Seeds(num_mb)
    with tf.device(self._devices[0]):
      inputs_mb = micro_batch.Split(tuple(inputs), num_mb, p.batch_dim)
    split_targets = [None] * num_mb
    if targets is not None:
      with tf.device(self._devices[-1]):
        split_targets = micro_batch.Split(targets, num_mb, p.batch_dim)
    outputs = []
    stage_stats = [[] for _ in range(self.num_stages)]
    stats_layers = [None] * self.num_stages
    for r, orders in enumerate(all_orders):
      first = r * per_replica
      current = inputs_mb[first:first + per_replica]
      for fns in self._StageFns(current[0], r):
        theta_k = stage_lib.ReadTheta(stage_lib.NestedTheta(theta, fns.keys),
                                      fns.device)
        weight_order = [
            t.micro_batch for order in orders for t in order
            if t.stage == fns.index and t.phase == weight_phase
        ]
        thetas = stage_lib.AccumulationViews(theta_k, weight_order,
                                             fns.device)
        last = fns.index == self.num_stages - 1
        outs = []
        for m in range(per_replica):
          out, st = fns.Call(
              thetas[m], current[m], seeds[first + m], first + m, registry,
              targets=split_targets[first + m] if last else None,
              check_d_outputs=check.Check if (check and last) else None)
          outs.append(out)
          stage_stats[fns.index].append(st)
        stats_layers[fns.index] = fns.stats_layers
        current = outs
      outputs += current
    # Batch-norm statistics summed over all replicas' micro-batches.
    bn_stats = []
    for k in range(self.num_stages):
      bn_stats += self._ApplyBatchNormUpdates(stats_layers[k], stage_stats[k],
                                              self._devices[k])
    with tf.device(self._devices[-1]):
      return self._Unwrap(
          self._DependOn(micro_batch.Merge(outputs, p.batch_dim), bn_stats))

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
    from gpipe import batch_norm  # pylint: disable=g-import-not-at-top
    p = self.params
    self._CheckTargets(targets)
    num_mb = self._NumMicroBatches(inputs, targets)
    seeds = self._Seeds(num_mb)
    layers = [self.children[key] for key in self._keys]
    thetas = [theta[key] for key in self._keys]
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
            out = stage_lib.ChainFProp([self.children[LOSS_KEY]],
                                       [theta[LOSS_KEY]],
                                       tuple(out) + (split_targets[m],))
          outs.append(out)
      layers_with_stats = [layer for layer, _ in collector.reports]
      stats.append([s for _, group in collector.reports for s in group])
    bn_stats = self._ApplyBatchNormUpdates(layers_with_stats, stats, None)
    return self._Unwrap(
        self._DependOn(micro_batch.Merge(outs, p.batch_dim), bn_stats))

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
      return tf.nest.map_structure(tf.identity, outputs)


def _Canonical(device):
  """One spelling per device, so repeated stage devices compare equal."""
  return tf.DeviceSpec.from_string(device or '').to_string()
