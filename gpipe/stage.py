"""One pipeline stage: its layers, traced once into reusable graph functions.

A stage is a run of consecutive layers on one device. ``StageFunctions``
traces it into (at most) two ``tf.function`` concrete functions, once per
stage whatever the number of micro-batches:

  * ``forward(theta, inputs, seed, accumulators, step) -> outputs +
    batch-norm statistics + accumulators``;
  * ``backward(theta, inputs, seed, step, d_outputs) -> d_theta, d_inputs``,
    which
    recomputes the forward pass from the stage's boundary input and
    differentiates it (re-materialization).

Each micro-batch is then one call op of ``forward`` and, in the backward pass,
one call op of ``backward``: the graph grows with K x M call ops, not with
L x M copies of every layer. ``Call`` makes ``backward`` the gradient
function of each forward call op, so ordinary ``tf.gradients`` through the
pipeline uses the recomputing backward function. Without re-materialization
the backward op is TensorFlow's own gradient of the forward call (which makes
the forward call keep every intermediate activation).

``None`` entries among a stage's inputs and outputs (Lingvo layers return
tuples with absent parts) are not function arguments: they stay ``None``.

Inside a stage, ``py_utils.GetGlobalStep()`` is the ``step`` argument (the
global step, read once per stage on its device): Lingvo layers read it (e.g.
for their step seeds), and a function cannot read a variable that lives in
another worker process.

Lingvo accumulators of the stage's layers (``layer.accumulators``) are
threaded through the forward calls: micro-batch m's call starts from the value
micro-batch m-1's call left, so after the pipeline each accumulator holds what
Lingvo's own GPipe loop leaves (every micro-batch's updates, in order). The
recomputed forward of a backward task runs with accumulators disabled, as
Lingvo computes gradients.
"""

import collections
import contextlib
import re
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import batch_norm
from gpipe import micro_batch as micro_batch_lib
from gpipe import precision
from gpipe import randomness
from gpipe import xla
from gpipe.compat import tf_internal
from gpipe.schedules import pipeline_tasks
from lingvo import compat as tf
from lingvo.core import py_utils


# Grappler would inline the stage functions into the session graph; the
# inlined ops of micro-batch m+1 could then start before those of micro-batch m
# finish (e.g. all recomputations first), breaking the schedule's order and
# the memory bound of re-materialization. Each call stays one unit of work.
NO_INLINE = {'_noinline': True}



def ChainFProp(layers, thetas, args):
  """Runs `layers` in sequence; a tuple output is splatted into the next.

  Args:
    layers: a list of BaseLayers.
    thetas: their thetas, in the same order.
    args: the first layer's positional inputs (a tuple).

  Returns:
    The last layer's output, always as a tuple.
  """
  for layer, theta in zip(layers, thetas):
    # Ops are attributed to their layer for gpipe.xla's messages, and named
    # under it for traces and the GPU audit.
    with xla.LayerScope(layer), _LayerScope(layer):
      out = layer.FProp(theta, *args)
    args = out if isinstance(out, tuple) else (out,)
  return args


_SCOPE_NAME = re.compile(r'^[A-Za-z0-9.][A-Za-z0-9_.\-/]*$')


def _LayerScope(layer):
  """A name scope of the layer's name (if it can name one).

  Each layer's ops under its name: a stage function's ops (and an execution
  trace's or the GPU audit's rows) say which layer made them.
  """
  name = layer.params.name
  if name and _SCOPE_NAME.match(name):
    return tf.name_scope(name)
  return contextlib.nullcontext()


STEP_SPEC = tf.TensorSpec([], tf.int64)


def GlobalStepOrZero():
  """Lingvo's global step, or an int64 0 in a graph without one."""
  step = py_utils.GetGlobalStep()
  return tf.constant(0, tf.int64) if step is None else step


def StepOnDevice(device):
  """The global step (0 without one) as an int64 scalar read on `device`."""
  with tf.device(device):
    return tf.cast(tf.identity(GlobalStepOrZero()), tf.int64)


def Specs(tensors):
  """TensorSpecs of `tensors` (shape and dtype)."""
  return [tf.TensorSpec(t.shape, t.dtype) for t in tensors]


def Accumulators(layers):
  """The Lingvo accumulators of `layers` and their children, in order."""
  return [acc for layer in layers for acc in layer.accumulators.Flatten()]


@contextlib.contextmanager
def TracedAccumulators(accumulators, values):
  """Inside a function trace: `accumulators` start from `values`.

  The Python accumulator objects would otherwise keep tensors of the function
  graph after the trace (which the outer graph cannot use). Their values are
  restored on exit.

  Args:
    accumulators: Lingvo Accumulator objects.
    values: their starting values (tensors of the traced graph), or None to
      disable them (a recomputation must not count twice).

  Yields:
    Nothing.
  """
  saved = [acc._value for acc in accumulators]  # pylint: disable=protected-access
  for i, acc in enumerate(accumulators):
    if values is None:
      acc.Disable()
    else:
      acc.SetValue(values[i])
  try:
    yield
  finally:
    for acc, value in zip(accumulators, saved):
      if values is None:
        acc.Enable()
      acc._value = value  # pylint: disable=protected-access


class MicroBatchCall(
    collections.namedtuple('MicroBatchCall', [
        'theta', 'args', 'seed', 'step', 'micro_batch', 'targets',
        'check_d_outputs', 'accumulator_values'
    ])):
  """What one call of a stage on one micro-batch takes.

  Attributes:
    theta: the stage's NestedMap {key: layer theta} of tensors on device.
    args: the micro-batch inputs (a tuple nest of tensors).
    seed: the micro-batch seed, an int64 [2] tensor.
    step: the global step as an int64 scalar on the stage's device
      (StepOnDevice).
    micro_batch: the micro-batch index m (for op names and ordering).
    targets: the loss layer's micro-batch targets (last stage with a loss
      layer only), else None.
    check_d_outputs: optional function(micro_batch, d_outputs) called with
      the gradients of the outputs before the backward task is built.
    accumulator_values: the accumulators' values before this call (from
      InitialAccumulatorValues or the previous call).
  """

  __slots__ = ()


class StageResult(
    collections.namedtuple('StageResult', [
        'outputs', 'stats', 'accumulator_values', 'stats_layers'
    ])):
  """What one call of a stage on one micro-batch gives.

  Attributes:
    outputs: the stage outputs (a tuple nest).
    stats: the flat list of batch-norm statistics (count, sum, sum_sq per
      reporting layer).
    accumulator_values: the accumulators' values after this call.
    stats_layers: the batch-norm layers that reported `stats`, in order.
  """

  __slots__ = ()


class StageFunctions:
  """The traced forward/backward functions of one stage and their calls."""

  # Subclasses that make their own backward tasks set this to False.
  BUILD_BACKWARD = True

  def __init__(self, index, layers, keys, device, remat, loss_layer=None,
               loss_key=None, compile=None):  # pylint: disable=redefined-builtin
    """Constructor.

    Args:
      index: the stage index k (used in op names).
      layers: the stage's BaseLayers, in order.
      keys: the theta keys of those layers in the pipeline's theta.
      device: the device string of this stage.
      remat: whether the backward pass recomputes the forward pass.
      loss_layer: the last stage's loss layer (FProp(theta, *outputs,
        targets)), or None.
      loss_key: its theta key.
      compile: None, or 'xla' / 'xla_where_possible': the stage's functions
        are XLA-compiled (gpipe.xla).
    """
    self.index = index
    self.compile = compile
    # Whether the functions being traced are compiled (the stage's functions
    # are compiled together or not at all: gpipe.xla.Resolve).
    self._jit = xla.Compiles(compile)
    # {op name: layer path} of the traced functions, for gpipe.xla's errors.
    self._owners = {}
    # {function: [xla.Unsupported]} of the functions traced so far.
    self._problems = {}
    self.layers = layers
    self.keys = keys + ([loss_key] if loss_layer is not None else [])
    self.device = device
    self.remat = remat
    self.loss_layer = loss_layer
    self._layer_keys = keys
    self._loss_key = loss_key
    self._num_diff_args = None
    self._forward = None
    self._backward = None
    self._theta_struct = None
    self._arg_struct = None
    self._out_struct = None
    self.stats_layers = []
    self.accumulators = Accumulators(
        layers + ([loss_layer] if loss_layer is not None else []))

  def _Body(self, theta_flat, args_flat, seed, step, collect_stats,
            acc_in=None):
    """The stage's forward computation inside a function trace.

    Args:
      theta_flat: the flat theta placeholders.
      args_flat: the flat (non-None) input placeholders.
      seed: the micro-batch seed placeholder.
      step: the global step placeholder (int64 scalar).
      collect_stats: whether this trace defines the output structure and the
        batch-norm layers (the forward trace).
      acc_in: the accumulators' starting values, or None to disable them.

    Returns:
      (outputs, stats, acc_out): the flat non-None outputs, the batch-norm
      statistics and the accumulators' values after the stage ([] if
      disabled).
    """
    theta = self._theta_struct.Pack(list(theta_flat))
    args = micro_batch_lib.Repack(self._arg_struct, list(args_flat))
    with tf.device(self.device), randomness.MicroBatchSeedScope(seed), \
        TracedAccumulators(self.accumulators, acc_in), \
        py_utils.GlobalStepContext(step), self._RecordLayers():
      with batch_norm.CollectStats() as collector:
        if self.loss_layer is None:
          outs = ChainFProp(self.layers, [theta[k] for k in self.keys], args)
        else:
          args, targets = args
          outs = ChainFProp(self.layers,
                            [theta[k] for k in self._layer_keys], args)
          # The loss in its own fprop dtype (float32 under mixed precision).
          outs = precision.CastFloats(
              tuple(outs), py_utils.FPropDtype(self.loss_layer.params))
          outs = ChainFProp([self.loss_layer], [theta[self._loss_key]],
                            tuple(outs) + (targets,))
      acc_out = ([acc.GetValue() for acc in self.accumulators]
                 if acc_in is not None else [])
    if collect_stats:
      self._out_struct = outs
      self.stats_layers = [layer for layer, _ in collector.reports]
    stats = [s for _, group in collector.reports for s in group]
    return micro_batch_lib.Present(outs), stats, acc_out

  @contextlib.contextmanager
  def _RecordLayers(self):
    """Records which layer made each op traced inside (with XLA only)."""
    if not xla.Compiles(self.compile):
      yield
      return
    with xla.RecordLayers() as owners:
      yield
    self._owners.update(owners)

  def Describe(self, what=''):
    """'stage k (its layers' paths)' and `what`, for messages."""
    layers = self.layers + ([self.loss_layer] if self.loss_layer else [])
    return ('stage %d (%s) %s' % (self.index, ', '.join(
        getattr(l, 'path', None) or l.params.name for l in layers),
                                  what)).strip()

  def _Function(self, fn, specs, phase, names=None):
    """The concrete function of `fn` for task `phase` (compiled: _jit).

    Args:
      fn: the Python function.
      specs: its argument specs.
      phase: 'F', 'B', 'W', 'W*' or 'BW' (the unsplit backward).
      names: optional {op name in its graph: the traced op it copies}, for
        messages (filled when `fn` is traced).

    Returns:
      The concrete function.
    """
    what = {'F': 'forward', 'B': 'backward (input gradient)',
            'W': 'weight gradient', 'W*': 'batched weight gradient',
            'BW': 'backward'}
    concrete = xla.Trace(
        fn, specs, self._jit,
        name='stage%d_%s' % (self.index, phase.replace('*', '_all')),
        attributes=NO_INLINE)
    self._problems[what.get(phase, phase) + ' function'] = xla.Problems(
        concrete, self.device, self._owners, names)
    return concrete

  def _BuildCompiled(self, theta_flat, args_flat, acc_flat):
    """_Build, compiled as p.compile says (gpipe.xla.Resolve)."""
    self._Build(theta_flat, args_flat, acc_flat)
    if self._jit and not xla.Resolve(self.compile, self.Describe(),
                                     self._problems, self.device):
      self._jit = False
      self._Build(theta_flat, args_flat, acc_flat)
    self._problems = {}

  def _Build(self, theta_flat, args_flat, acc_flat):
    """Traces the forward (and recomputing backward) function once."""
    theta_specs = Specs(theta_flat)
    arg_specs = Specs(args_flat)
    seed_spec = tf.TensorSpec([2], tf.int64)

    def Forward(theta_flat, args_flat, seed, acc_flat, step):
      outs, stats, acc_out = self._Body(theta_flat, args_flat, seed, step,
                                        True, acc_in=acc_flat)
      return outs + stats + acc_out

    self._forward = self._Function(
        Forward, [theta_specs, arg_specs, seed_spec, Specs(acc_flat),
                  STEP_SPEC], 'F')
    out_flat = micro_batch_lib.Present(self._out_struct)
    self._float_outs = [i for i, t in enumerate(out_flat) if t.dtype.is_floating]
    # Only the stage inputs are differentiated, not a loss layer's targets.
    self._float_args = [
        i for i, t in enumerate(args_flat[:self._num_diff_args])
        if t.dtype.is_floating
    ]
    if not self.BUILD_BACKWARD or not (self.remat or self._jit):
      return

    def Backward(theta_flat, args_flat, seed, step, d_outs):
      # The name scope lets execution traces tell recomputation apart.
      with tf.name_scope(pipeline_tasks.RECOMPUTE_SCOPE):
        outs, _, _ = self._Body(theta_flat, args_flat, seed, step, False)
      ys = [outs[i] for i in self._float_outs]
      xs = list(theta_flat) + [args_flat[i] for i in self._float_args]
      return tf.gradients(
          ys, xs, grad_ys=list(d_outs),
          unconnected_gradients=tf.UnconnectedGradients.ZERO)

    d_out_specs = [
        tf.TensorSpec(out_flat[i].shape, out_flat[i].dtype)
        for i in self._float_outs
    ]
    backward = self._Function(
        Backward, [theta_specs, arg_specs, seed_spec, STEP_SPEC, d_out_specs],
        'BW')
    if self.remat:
      self._backward = backward
    # Else TensorFlow differentiates the forward's call itself, with a
    # gradient function that copies its compile attribute but is traced
    # only when the gradients are built: the trace above (not called) lets
    # its ops be checked for XLA kernels now, with the forward's.

  def _Prepare(self, theta, args, targets, acc_values):
    """Flat theta and args of one call; traces the functions on first use."""
    theta_flat = theta.Flatten()
    if self.loss_layer is not None:
      args = (args, targets)  # PipeliningLayer checked they were given.
    args_flat = micro_batch_lib.Present(args)
    if self._num_diff_args is None:
      self._num_diff_args = len(micro_batch_lib.Present(
          args[0] if self.loss_layer is not None else args))
      self._theta_struct = theta
      self._arg_struct = args
      with _Tracing(self):
        self._BuildCompiled(theta_flat, args_flat, acc_values)
    return theta_flat, args_flat

  def BeginStep(self):
    """Called before a pipeline's calls of this stage (per FProp, replica)."""

  def InitialAccumulatorValues(self):
    """The accumulators' values before the first call (outer graph)."""
    with tf.device(self.device):
      return [acc.GetValue() for acc in self.accumulators]

  def Call(self, call, scheduled_ops):
    """Runs the stage on one micro-batch.

    Args:
      call: a MicroBatchCall.
      scheduled_ops: the task_ops.ScheduledOps that orders the ops of this
        stage's forward (F) and backward (B, W) tasks.

    Returns:
      A StageResult.
    """
    theta, args, seed, step, micro_batch, targets, check_d_outputs = (
        call.theta, call.args, call.seed, call.step, call.micro_batch,
        call.targets, call.check_d_outputs)
    accumulator_values = list(call.accumulator_values)
    theta_flat, args_flat = self._Prepare(theta, args, targets,
                                          accumulator_values)
    num_theta, num_args = len(theta_flat), len(args_flat)
    num_outs = len(micro_batch_lib.Present(self._out_struct))
    num_stats = len(self._forward.outputs) - num_outs - len(accumulator_values)
    with tf.name_scope(pipeline_tasks.OpScope(self.index, 'F', micro_batch)):
      with tf.device(self.device):
        results = self._forward(theta_flat, args_flat, seed,
                                accumulator_values, step)
    results = list(results) if isinstance(results, (list, tuple)) else [
        results
    ]
    call_op = results[0].op
    scheduled_ops.Register(
        pipeline_tasks.Task(self.index, micro_batch, pipeline_tasks.FORWARD),
        [call_op])
    # TensorFlow's own gradient of the call (used without remat): it rewrites
    # the forward call to also output the intermediates the backward needs.
    tf_gradient = tf_internal.GetGradientFunction(call_op)
    passes = [0]  # tf.gradients calls over this task so far.

    def Gradient(op, *d_results):
      """The backward task of this stage and micro-batch."""
      gradient_pass = passes[0]
      passes[0] += 1
      d_outs = [d_results[i] for i in self._float_outs]
      if check_d_outputs is not None:
        check_d_outputs(micro_batch, d_outs)
      with tf.name_scope(pipeline_tasks.OpScope(self.index, 'B', micro_batch)):
        with tf.device(self.device):
          if self.remat:
            grads = self._backward(theta_flat, args_flat, seed, step, d_outs)
            grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
            ops = [grads[0].op] if grads else []
          else:
            all_grads = tf_gradient(op, *d_results)
            ops = list({g.op for g in all_grads if g is not None})
            if not ops:
              # Nothing to compute: a no-op keeps the device's chain whole.
              ops = [tf.no_op()]
            grads = list(all_grads[:num_theta]) + [
                all_grads[num_theta + i] for i in self._float_args
            ]
      scheduled_ops.Register(
          pipeline_tasks.Task(self.index, micro_batch,
                              pipeline_tasks.BACKWARD), ops, gradient_pass)
      d_args = [None] * num_args
      for j, i in enumerate(self._float_args):
        d_args[i] = grads[num_theta + j]
      # Inputs: theta, args, seed, accumulators, step, then any tensors the
      # function captured.
      extra = len(op.inputs) - num_theta - num_args
      return list(grads[:num_theta]) + d_args + [None] * extra

    tf_internal.SetGradientFunction(call_op, Gradient)
    outs = micro_batch_lib.Repack(self._out_struct, results[:num_outs])
    return StageResult(outs, list(results[num_outs:num_outs + num_stats]),
                       list(results[num_outs + num_stats:]),
                       list(self.stats_layers))


def ReadTheta(theta, device):
  """Reads a stage's theta (variables or tensors) once, on its device.

  Args:
    theta: a NestedMap, or any nest, of variables and tensors (other leaves
      pass unchanged).
    device: where the reads run.

  Returns:
    `theta` with each variable and tensor read (tf.identity) on `device`.
  """
  def Read(v):
    if isinstance(v, (tf.Variable, tf.Tensor)) or hasattr(v, 'handle'):
      return tf.identity(v)
    return v

  with tf.device(device):
    if isinstance(theta, py_utils.NestedMap):
      return theta.Transform(Read)
    return tf.nest.map_structure(Read, theta)


def NestedTheta(theta, keys):
  """The sub-NestedMap of `theta` holding `keys`."""
  return py_utils.NestedMap({k: theta[k] for k in keys})


# Called as fn(stage, seconds) after each stage is traced (OnTrace).
_TRACE_OBSERVERS = []


@contextlib.contextmanager
def OnTrace(fn):
  """Inside the body, calls fn(stage, seconds) after each stage is traced.

  Each stage's functions are traced once, at its first call, while the
  pipeline's graph is built: a tool times that (the trainer's start-up log)
  with this hook. Traces in every thread of the process are reported.

  Args:
    fn: called with the StageFunctions traced (``index``, ``device``) and
      the seconds its tracing took (every function of the stage: forward
      and backward, or the F, B and W pieces of a split backward).

  Yields:
    Nothing; on exit fn is no longer called.
  """
  _TRACE_OBSERVERS.append(fn)
  try:
    yield
  finally:
    _TRACE_OBSERVERS.remove(fn)


@contextlib.contextmanager
def _Tracing(stage):
  """Times the body, the tracing of `stage`, for the OnTrace observers."""
  started = time.time()
  yield
  seconds = time.time() - started
  for fn in list(_TRACE_OBSERVERS):
    fn(stage, seconds)
