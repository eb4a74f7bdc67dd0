"""Measuring a profile: each layer's task times and bytes, and the device.

``MeasureLayers`` builds each layer per micro-batch size and dtype in a
graph of its own, on random inputs of the shapes the previous layer hands
it, held in variables (so a run reads nothing from the client), and times
three session runs of it: the forward (F), the forward and the input
gradient, and the forward and both gradients. B and W are differences of
them as a split backward divides the work (each run's fastest of the
repeats, less an empty run's).
Bytes come from the graph, not from timing: the forward tensors the
gradient ops read (what ``remat='never'`` keeps), the tensors the weight
gradient alone reads (what a split backward keeps from B to W), the
inputs and outputs; the backward's temporaries from one traced run's
allocation records (``gpipe.measure.memory``).

Layers whose params are equal but for their name, on inputs of the same
shapes, are measured once: a deep stack of equal layers costs a few
measurements, and only one layer's variables exist at a time.
Run it where the devices of the plan are (the planner's command pins its
process to one core with one intra-op thread, like the benchmark's
workers), on an otherwise idle machine.

``MeasureDevice`` times what every task and step pays on that device: a
stage function call, memory bandwidth; ``MeasureHandover`` the latency and
bandwidth between two worker processes.
"""

import os
import statistics
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import batch_norm
from gpipe import micro_batch
from gpipe import precision
from gpipe import randomness
from gpipe import stage as stage_lib
from gpipe.measure import memory
from gpipe.measure import param_count
from gpipe.measure import run_time
from gpipe.plan import profile as profile_lib
from gpipe.runtime import background
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils


def PinToCore(core):
  """Pins every thread of this process, and those it starts, to `core`.

  Measure as the pipeline's devices run: the benchmark's and the trainer's
  local workers each run on one pinned core.
  """
  for tid in os.listdir('/proc/self/task'):
    try:
      os.sched_setaffinity(int(tid), {core})
    except OSError:
      pass  # A thread that ended meanwhile.


def _Bytes(tensors):
  total = 0
  for t in tensors:
    shape = t.shape.as_list()
    if None in shape:
      raise ValueError('cannot count the bytes of %s: its shape %s is not '
                       'static' % (t.name, shape))
    total += int(np.prod(shape)) * t.dtype.size
  return total


def _Unique(tensors):
  seen, out = set(), []
  for t in tensors:
    if t.ref() not in seen:
      seen.add(t.ref())
      out.append(t)
  return out


def _Ancestors(tensors, within):
  """Ops in `within` that `tensors` are computed from."""
  seen, stack = set(), [t.op for t in tensors]
  while stack:
    op = stack.pop()
    if op in seen or op not in within:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
  return seen


def _Descendants(tensors, within):
  """Ops in `within` computed from `tensors`."""
  seen, stack = set(), [op for t in tensors for op in t.consumers()]
  while stack:
    op = stack.pop()
    if op in seen or op not in within:
      continue
    seen.add(op)
    stack.extend(c for t in op.outputs for c in t.consumers())
  return seen


def _Ops(tensors):
  """The distinct ops of `tensors` (a session fetch that runs them)."""
  ops = []
  for t in tensors:
    if t.op not in ops:
      ops.append(t.op)
  return ops


def WithRows(specs, rows, batch_dim=0):
  """TensorSpecs (a nest) with the batch dimension set to `rows`."""
  def One(spec):
    shape = spec.shape.as_list()
    shape[batch_dim] = rows
    return tf.TensorSpec(shape, spec.dtype)
  return tf.nest.map_structure(One, specs)


def Variables(specs, name, compute_dtype, device=None):
  """Non-trainable variables holding sample values of `specs` (a nest).

  Args:
    specs: TensorSpecs (a nest; None entries stay None).
    name: the variables' name prefix.
    compute_dtype: the dtype of the floating ones.
    device: where they live (default: the current device scope).

  Returns:
    (the nest of their values as tensors, the flat list of variables).
  """
  variables = []

  def One(spec):
    if spec is None:
      return None
    dtype = spec.dtype
    if dtype.is_floating:
      dtype = compute_dtype
      init = tf.compat.v1.random_normal_initializer(seed=len(variables) + 1)
    else:
      init = tf.compat.v1.zeros_initializer()
    with tf.device(device):
      v = tf.compat.v1.get_variable(
          '%s_%d' % (name, len(variables)), spec.shape, dtype,
          initializer=init, trainable=False)
      variables.append(v)
      return v.read_value()
  return tf.nest.map_structure(One, specs), variables


class Timer:
  """Seconds of session runs (median or fastest), less an empty run's."""

  def __init__(self, sess, repeats, warmup, statistic=statistics.median):
    """Constructor.

    Args:
      sess: the session.
      repeats: timed runs per fetch.
      warmup: untimed runs first.
      statistic: of the timed runs: the median, or ``min`` where other
        processes' work may slow some runs down and a difference of two
        figures must stay stable.
    """
    self._sess = sess
    self._repeats = repeats
    self._warmup = warmup
    self._statistic = statistic
    self._empty = None
    self._empty = self.Seconds(tf.no_op())

  @property
  def empty_seconds(self):
    """The seconds of a session run of nothing (subtracted from the rest)."""
    return self._empty

  def Seconds(self, fetch):
    seconds = run_time.RunSeconds(self._sess, fetch, None, self._repeats,
                                  self._warmup, self._statistic)
    return seconds if self._empty is None else max(seconds - self._empty,
                                                   0.0)


class _LayerGraph:
  """One layer's forward and gradients on variable inputs (one size)."""

  def __init__(self, layer, args, extra_args=()):
    """Builds F and both gradients of `layer`.

    Args:
      layer: a built Lingvo layer.
      args: its FProp arguments (a tuple of nests of variables' values).
      extra_args: more arguments that are not differentiated (a loss
        layer's targets).
    """
    graph = tf.compat.v1.get_default_graph()
    before = set(graph.get_operations())
    with randomness.MicroBatchSeedScope(tf.constant([1, 2], tf.int64)), \
        batch_norm.CollectStats():
      out = layer.FProp(layer.theta, *(tuple(args) + tuple(extra_args)))
    # As stage.ChainFProp hands it to the next layer.
    self.out_args = out if isinstance(out, tuple) else (out,)
    self.outputs = micro_batch.Present(self.out_args)
    forward_ops = set(graph.get_operations()) - before
    inputs = micro_batch.Present(args)
    float_inputs = [t for t in inputs if t.dtype.is_floating]
    weights = [v for v in layer.vars.Flatten() if v.trainable]
    floats = [o for o in self.outputs if o.dtype.is_floating]
    target = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in floats]
                      ) if floats else tf.constant(0.0)
    before = set(graph.get_operations())
    grads = tf.gradients(target, float_inputs + weights,
                         unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grad_ops = set(graph.get_operations()) - before
    # Fetched as ops (run as targets, nothing copied out): a NoOp with
    # control inputs on them would have its inputs pruned away.
    self.forward = _Ops(self.outputs)
    # The input gradient alone: tf.gradients builds only what it needs.
    self.input_grad = _Ops(tf.gradients(
        target, float_inputs,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)) if (
            float_inputs) else self.forward
    self.both = _Ops(grads) if grads else self.forward
    # What the gradient ops read of the forward's tensors computed from the
    # inputs, and the inputs (not the weights, their reads or casts).
    from_inputs = _Descendants(inputs, forward_ops)
    produced = {t.ref() for op in from_inputs for t in op.outputs} | {
        t.ref() for t in inputs}
    read = _Unique([t for op in grad_ops for t in op.inputs
                    if t.ref() in produced])
    self.activation_bytes = _Bytes(read)
    read = {t.ref() for t in read}
    self.input_read_bytes = _Bytes([t for t in _Unique(inputs)
                                    if t.ref() in read])
    self.output_read_bytes = _Bytes([t for t in _Unique(self.outputs)
                                     if t.ref() in read])
    # What the weight gradient alone reads of the forward's and B's tensors.
    b_ops = _Ancestors(grads[:len(float_inputs)], grad_ops)
    w_ops = _Ancestors(grads[len(float_inputs):], grad_ops) - b_ops
    produced |= {t.ref() for op in b_ops for t in op.outputs}
    self.weight_bytes = _Bytes(_Unique([
        t for op in w_ops for t in op.inputs
        if t.op not in w_ops and t.ref() in produced]))
    self.input_bytes = _Bytes(inputs)
    self.output_bytes = _Bytes(self.outputs)


def _Measure(layer_graph, timer, sess):
  """(forward, backward, weight) seconds and temporary bytes of one layer.

  As a split backward divides the work: B is F+B less F, everything the
  input gradient needs, which includes the gradients flowing through the
  layer that W reads too; W is F+B+W less F+B, what is left (the weight
  gradients' own products). F+W less F would count that shared chain in W
  as well: for a Transformer layer it is most of the backward.
  """
  forward = timer.Seconds(layer_graph.forward)
  forward_input = timer.Seconds(layer_graph.input_grad)
  both = timer.Seconds(layer_graph.both)
  metadata = tf.compat.v1.RunMetadata()
  sess.run(layer_graph.both, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
  try:
    peak = memory.MaxOverDevices(memory.PeakBytesPerDevice(metadata))
  except ValueError:
    peak = 0
  backward = forward_input - forward
  weight = both - forward_input
  return (forward, max(backward, 0.0), max(weight, 0.0),
          max(peak - layer_graph.activation_bytes, 0))


def _Key(p):
  """Equal for layer params that differ only in their name."""
  q = p.Copy()
  q.name = 'layer'
  return q.ToText()


def _Fold(last, loss):
  """The last layer's Measurement with its loss layer's work added."""
  return last._replace(
      forward=last.forward + loss.forward,
      backward=last.backward + loss.backward,
      weight=last.weight + loss.weight,
      output_bytes=loss.output_bytes,
      activation_bytes=(last.activation_bytes + loss.activation_bytes -
                        min(loss.input_read_bytes, last.output_read_bytes)),
      output_read_bytes=loss.output_read_bytes,
      weight_bytes=last.weight_bytes + loss.weight_bytes,
      temporary_bytes=max(last.temporary_bytes, loss.temporary_bytes))


def _Signature(specs):
  """A hashable text of a nest of TensorSpecs (None entries kept)."""
  return repr(tf.nest.map_structure(
      lambda x: None if x is None else (tuple(x.shape.as_list()),
                                        x.dtype.name), specs))


def _MeasureOne(p, arg_specs, rows, dtype, loss, batch_dim, repeats, warmup,
                session_config):
  """(Measurement, output specs) of one layer on random inputs of a size.

  Each layer is built in a graph of its own, so only one layer's variables
  exist at a time (a layer of a giant model fits where the model does not).
  """
  compute = precision.ParseFPropDtype(dtype)
  with tf.Graph().as_default(), tf.compat.v1.Session(
      config=session_config) as sess:
    py_utils.GetOrCreateGlobalStepVar()
    args, _ = Variables(arg_specs, 'input', compute)
    g = _LayerGraph(p.Instantiate(), args)
    out_specs = micro_batch.Repack(
        g.out_args, [tf.TensorSpec(t.shape, t.dtype) for t in g.outputs])
    loss_graph = None
    if loss is not None:
      loss_params, target_specs = loss
      targets, _ = Variables(WithRows(target_specs, rows, batch_dim),
                              'targets', tf.float32)
      # On inputs of its own: its runs must not run the layer again.
      loss_args, _ = Variables(out_specs, 'loss_input', compute)
      loss_graph = _LayerGraph(loss_params.Copy().Instantiate(), loss_args,
                               (targets,))
    sess.run(tf.compat.v1.global_variables_initializer())
    # The fastest runs: a difference of two medians moves with whatever
    # else the machine does; calibrate.py maps these to the executor's
    # typical step.
    timer = Timer(sess, repeats, warmup, statistic=min)
    got = []
    for graph in [g] + ([loss_graph] if loss_graph else []):
      f, b, w, temp = _Measure(graph, timer, sess)
      got.append(profile_lib.Measurement(
          rows=rows, dtype=dtype, forward=f, backward=b, weight=w,
          input_bytes=graph.input_bytes, output_bytes=graph.output_bytes,
          activation_bytes=graph.activation_bytes,
          weight_bytes=graph.weight_bytes, temporary_bytes=temp,
          input_read_bytes=graph.input_read_bytes,
          output_read_bytes=graph.output_read_bytes))
  if loss_graph is not None:
    return _Fold(got[0], got[1]), out_specs
  return got[0], out_specs


def _MeasureSize(layer_params, input_specs, rows, dtype, loss, batch_dim,
                 repeats, warmup, session_config, log):
  """Measurements of every layer (the loss in the last) at one size."""
  params = [p.Copy() for p in layer_params]
  for p in params:
    precision.SetFPropDtype(p, dtype)
  specs = tuple(WithRows(input_specs, rows, batch_dim))
  seen = {}
  out = []
  for i, p in enumerate(params):
    last = i == len(params) - 1
    key = (_Key(p), _Signature(specs), last)
    if key not in seen:
      start = time.time()
      seen[key] = background.RunIsolated(lambda p=p, specs=specs, last=last:
                                          _MeasureOne(
                                              p, specs, rows, dtype,
                                              loss if last else None,
                                              batch_dim, repeats, warmup,
                                              session_config))
      if log:
        log('  %s (%s) at %d rows in %s: %.1f s' % (
            p.name, p.cls.__name__, rows, dtype, time.time() - start))
    measurement, specs = seen[key]
    out.append(measurement)
  return out


def MeasureLayers(layer_params, input_specs, rows, dtypes=('float32',),
                  loss=None, batch_dim=0, repeats=5, warmup=2,
                  session_config=None, log=None):
  """Every layer's Measurements (see the module docstring).

  Args:
    layer_params: the pipeline's layer params, in order.
    input_specs: tf.TensorSpecs (a nest) of the first layer's inputs, any
      batch size (``batch_dim`` is replaced by each size).
    rows: micro-batch sizes to measure.
    dtypes: compute dtypes ('float32', 'bfloat16').
    loss: optional (loss layer params, target specs): a loss layer run at
      the end of the last stage, counted in the last layer.
    batch_dim: the batch dimension of the inputs and targets.
    repeats: timed runs per figure (the median).
    warmup: untimed runs first.
    session_config: a ConfigProto (e.g. one intra-op thread).
    log: a print-like function for progress, or None.

  Returns:
    A list of profile.Layer, one per layer.
  """
  if loss is not None and not loss[0].name:
    loss = (loss[0].Copy().Set(name='loss'), loss[1])
  param_bytes = LayerParamBytes(layer_params, loss[0] if loss else None)
  measurements = [[] for _ in layer_params]
  for dtype in dtypes:
    for r in rows:
      got = _MeasureSize(layer_params, input_specs, r, dtype, loss,
                         batch_dim, repeats, warmup, session_config, log)
      for i, m in enumerate(got):
        measurements[i].append(m)
  return [profile_lib.Layer(p.name or 'layer%d' % i, param_bytes[i],
                            measurements[i])
          for i, p in enumerate(layer_params)]


def LayerParamBytes(layer_params, loss_params=None):
  """Each layer's variable bytes (float32), as a profile counts them.

  Counted from the layers built in scratch graphs (nothing is allocated or
  timed; gpipe.measure.param_count), so a cap can be checked against the
  weights before any measuring.

  Args:
    layer_params: the pipeline's layer params, in order.
    loss_params: the params of a loss layer run after the last layer (its
      variables count in the last layer), or None.

  Returns:
    A list of bytes, one per layer.
  """
  if loss_params is not None and not loss_params.name:
    loss_params = loss_params.Copy().Set(name='loss')  # Layers need a name.
  out = []
  for i, p in enumerate(layer_params):
    layers = [p]
    if i == len(layer_params) - 1 and loss_params is not None:
      layers.append(loss_params)
    out.append(sum(int(np.prod(shape)) * 4 for q in layers
                   for shape, _ in param_count.VariableShapes(q).values()))
  return out


def _Chain(fn, x, n):
  """n calls of graph function `fn`, each on the previous one's output."""
  for _ in range(n):
    x = fn(x)
  return x.op


def MeasureDevice(session_config=None, repeats=7, warmup=2):
  """Seconds of a stage function call and the memory bandwidth, here.

  A call: the difference of 65 and 1 chained calls of a function of 16
  floats, over 64 (a stage's task is one such call; its own ops come on
  top). Bandwidth: 2 x 32 MiB / the seconds of x + 1 on 32 MiB.

  Args:
    session_config: a ConfigProto (e.g. one intra-op thread).
    repeats: timed runs (the median).
    warmup: untimed runs first.

  Returns:
    dict(call_seconds=..., memory_bandwidth=bytes/s).
  """
  def Run():
    with tf.Graph().as_default(), tf.compat.v1.Session(
        config=session_config) as sess:
      fn = tf.function(lambda x: x * 2.0, autograph=False,
                       experimental_attributes=stage_lib.NO_INLINE
                      ).get_concrete_function(tf.TensorSpec([16], tf.float32))
      x = tf.compat.v1.get_variable('x', [16], tf.float32)
      one, many = _Chain(fn, x.read_value(), 1), _Chain(fn, x.read_value(),
                                                        65)
      big = tf.compat.v1.get_variable('big', [8 << 20], tf.float32)
      add = (big.read_value() + 1.0).op
      sess.run(tf.compat.v1.global_variables_initializer())
      timer = Timer(sess, repeats, warmup)
      call = max(timer.Seconds(many) - timer.Seconds(one), 0.0) / 64
      seconds = max(timer.Seconds(add), 1e-9)
      return dict(call_seconds=call, memory_bandwidth=2 * 32 * (1 << 20) /
                  seconds)
  return background.RunIsolated(Run)


def MeasureHandover(target, devices, sizes=(1 << 12, 1 << 18, 1 << 22),
                    repeats=7, warmup=2):
  """Latency and bandwidth from devices[0] to devices[1]; a step's cost.

  For each size a tensor on the first device is read by an op on the
  second; the seconds less those of the same op on a tensor of its own
  device, fitted as latency + bytes / bandwidth (least squares).

  Args:
    target: the session target of the cluster holding both devices.
    devices: two device strings (e.g. two worker processes).
    sizes: bytes to hand over.
    repeats: timed runs per size (the median).
    warmup: untimed runs first.

  Returns:
    dict(handover=profile.Handover, step_seconds=an empty step's seconds
    on the cluster).
  """
  def Run():
    with tf.Graph().as_default(), tf.compat.v1.Session(target) as sess:
      remote, local = [], []
      for i, size in enumerate(sizes):
        with tf.device(devices[0]):
          src = tf.compat.v1.get_variable('src%d' % i, [size // 4],
                                          tf.float32)
        with tf.device(devices[1]):
          own = tf.compat.v1.get_variable('own%d' % i, [size // 4],
                                          tf.float32)
          remote.append(tf.reduce_max(src.read_value()).op)
          local.append(tf.reduce_max(own.read_value()).op)
      sess.run(tf.compat.v1.global_variables_initializer())
      timer = Timer(sess, repeats, warmup)
      seconds = [max(timer.Seconds(r) - timer.Seconds(l), 0.0)
                 for r, l in zip(remote, local)]
      slope, intercept = np.polyfit(np.array(sizes, np.float64),
                                    np.array(seconds), 1)
      return dict(handover=profile_lib.Handover(
          latency=max(float(intercept), 0.0),
          bandwidth=1.0 / max(float(slope), 1e-12)),
                  step_seconds=timer.empty_seconds)
  return background.RunIsolated(Run)


def MeasureModel(model, layer_params, input_specs, batch, rows,
                 dtypes=('float32',), loss=None, batch_dim=0,
                 loss_in_pipeline=True, optimizer_slots=0, update_traffic=3.0,
                 handover=None, step_seconds=None, session_config=None,
                 repeats=5, warmup=2, machine=None, notes='', log=None):
  """A whole profile.Profile of a pipeline's layers, measured here.

  Args:
    model: the model's name.
    layer_params: the pipeline's layer params.
    input_specs: TensorSpecs (a tuple nest) of the first layer's inputs.
    batch: examples per training step.
    rows: micro-batch sizes to measure.
    dtypes: compute dtypes to measure.
    loss: optional (loss layer params, target specs) (``loss_tpl``).
    batch_dim: the batch dimension.
    loss_in_pipeline: whether each micro-batch's loss is computed in the
      pipeline (every schedule), not after it.
    optimizer_slots: float32 slots per parameter (Adam 2, SGD 0).
    update_traffic: bytes the update reads and writes per parameter byte.
    handover: a profile.Handover (measured with ``MeasureHandover`` or
      given), or None for none (one device).
    step_seconds: a step's fixed seconds (``MeasureHandover``), or None for
      an empty session run here.
    session_config: the ConfigProto of the measuring sessions.
    repeats: timed runs per figure.
    warmup: untimed runs first.
    machine: a dict describing the machine.
    notes: free text.
    log: a print-like function, or None.

  Returns:
    A profile.Profile.
  """
  layers = MeasureLayers(layer_params, input_specs, rows, dtypes, loss,
                         batch_dim, repeats, warmup, session_config, log)
  device = MeasureDevice(session_config, repeats, warmup)
  if step_seconds is None:
    step_seconds = device['call_seconds']
  texts = [p.ToText() for p in layer_params]
  batched = not any('MicroBatchBatchNormLayer' in t for t in texts)
  return profile_lib.Profile(
      model=model, batch=batch, layers=layers,
      handover=handover or profile_lib.Handover(0.0, 1e30),
      call_seconds=device['call_seconds'],
      memory_bandwidth=device['memory_bandwidth'], step_seconds=step_seconds,
      loss_in_pipeline=loss_in_pipeline, batched_weights=batched,
      optimizer_slots=optimizer_slots, update_traffic=update_traffic,
      machine=machine or {}, notes=notes)
