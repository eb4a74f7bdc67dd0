"""PipeliningLayer: GPipe's micro-batch pipeline as a Lingvo layer."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import executor
from gpipe import partition
from gpipe import precision
from gpipe import replicas
from lingvo import compat as tf
from lingvo.core import base_layer

REMAT_MODES = executor.REMAT_MODES

# The child (and variable scope) name of the loss layer (p.loss_tpl).
LOSS_KEY = 'loss'



class PipeliningLayer(executor.PipelineExecutor, base_layer.BaseLayer):
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
  task at a time (``accumulation.AccumulationViews``), so a stage holds one running
  gradient sum, not M gradients of its weights.

  What is stored and what is recomputed (``remat``):

  * ``'always'`` (default): during the forward pass each stage keeps only its
    boundary input per micro-batch (N/M examples x M = the stage's input for
    the whole batch); Bm first recomputes the stage's forward pass for
    micro-batch m, then back-propagates through it. Peak activation memory is
    O(N + (L/K) x N/M) instead of O(N x L), for about one extra forward pass.
  * ``'except_last'``: like 'always' but the last *stage*, whose backward
    starts right after its forward, keeps its activations. (torchgpipe's
    ``checkpoint='except_last'`` means the last *micro-batch* instead.)
  * ``'never'``: every stage keeps every activation (no recomputation).

  Randomness (dropout, drop path through ``gpipe.randomness``) is seeded per
  (global step, micro-batch), so micro-batches draw different masks and the
  recomputed forward draws the same ones. Batch norm
  (``gpipe.batch_norm.MicroBatchBatchNormLayer``) normalizes with
  micro-batch statistics and updates its moving averages once per mini-batch.

  Several stages may share a device (a loop): with ``stage_devices`` =
  [d0, d1, d0, d1] each device holds v=2 stages of half the size and runs
  its tasks breadth-first (``gpipe.schedules.orders.DeviceOrders``). The
  bubble shrinks to (D-1)/(vM+D-1) for D devices, at the price of 2(v-1)D
  more hand-overs per micro-batch; stored activations grow with the number of
  stage boundaries.

  Other schedules (``schedule``): ``gpipe.schedules.registry`` lists every
  one (``Names()``, with its rules and a one-line description), and each is
  drawn in the docstring of its orders function in ``gpipe/schedules/``
  (``orders.py``; ``timed.py`` for the timing-aware ``'zb_auto'``). Among
  them:

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
  call: the graph holds K x M calls, not L x M copies of the layers. With
  ``compile='xla'`` each of those functions is compiled by XLA, each call one
  fused computation (``gpipe.xla``; what it costs and refuses is documented
  with the param).

  Lingvo's ``lingvo.core.gpipe.PipeliningLayer`` params mean the same here:
  ``cell_tpl`` (e.g. ``FeatureExtractionLayer`` cells, with
  ``act_fetch_layers``), ``before_tpl``, ``num_micro_batches`` and/or
  ``micro_batch_size``, ``batch_dim``, ``state_dtype``, ``nested_map_fprop``;
  ``None`` inputs pass through as absent and Lingvo accumulators of the stage
  layers are updated by every micro-batch. To keep a Lingvo GPipe layer or
  stack (its variable names and checkpoints) and only change the executor,
  see ``gpipe.lingvo_adapter.FromLingvo`` and docs/MIGRATING.md.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define(
        'before_tpl', [],
        'Layers run in sequence on the whole mini-batch, on the first '
        "stage's device, before it is split into micro-batches (as "
        "Lingvo's before_tpl). Each needs a name (its child name).")
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
        'a call per stage each. Set this or micro_batch_size (or both, '
        'when their product is the batch, as Lingvo allows).')
    p.Define('micro_batch_size', None,
             'Examples per micro-batch (M = batch / micro_batch_size).')
    p.Define('batch_dim', 0, 'The batch dimension of every input tensor.')
    p.Define(
        'state_dtype', None,
        'If set, the dtype every tensor handed from one stage to the next '
        "must have (Lingvo's state_dtype); a stage output of another dtype "
        'is an error. None: any dtypes.')
    p.Define(
        'nested_map_fprop', False,
        'As Lingvo: FProp takes exactly one NestedMap and every stage returns '
        'one NestedMap (None entries pass through as absent). Without it '
        'nests of any kind are accepted anyway.')
    executor.DefineParams(p)
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
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    executor.CheckParams(p)
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
      self._devices = executor.ResolveDevices(p, self.cluster, num_stages)
      self._replica_devices = [self._devices]

    self._keys = cut.child_keys
    for i, lp in enumerate(p.before_tpl):
      if not lp.name or lp.name in self._keys + [LOSS_KEY]:
        raise ValueError(
            '%s: before_tpl[%d] needs a name of its own (got %r; taken: %s)' %
            (p.name, i, lp.name, ', '.join(self._keys + [LOSS_KEY])))
      with tf.device(self._devices[0]):
        self.CreateChild(lp.name, lp)
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
        precision.KeepLossInMasterDtype(p, lp)
        self.CreateChild(LOSS_KEY, lp)

  @property
  def num_stages(self):
    return len(self._stage_sizes)

  @property
  def stage_sizes(self):
    """Layers per stage."""
    return list(self._stage_sizes)

  @property
  def layer_costs(self):
    """The per-layer costs of the cut (None when stage_sizes was given)."""
    return None if self._costs is None else list(self._costs)

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
    # The trainable parameters of the layers built here: counting them from
    # their params would build each layer again in a scratch graph.
    counts = [
        sum(v.shape.num_elements() for v in self.children[key].vars.Flatten()
            if v.trainable) for key in self._keys
    ]
    return partition.Report(self._layer_params, self._stage_sizes, self._costs,
                            self._cost_name, devices=self.stage_devices,
                            counts=counts)

  def _StageLayers(self, k):
    start = sum(self._stage_sizes[:k])
    keys = self._keys[start:start + self._stage_sizes[k]]
    return keys, [self.children[key] for key in keys]

  def _BeforeLayers(self):
    keys = [lp.name for lp in self.params.before_tpl]
    return keys, [self.children[key] for key in keys]

  def _LossLayer(self):
    if self.params.loss_tpl is None:
      return None, None
    return LOSS_KEY, self.children[LOSS_KEY]

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
    return self._RunPipeline(theta, inputs, targets)
