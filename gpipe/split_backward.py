"""A stage's backward as two tasks: B (input gradient) and W (weight gradient).

Zero-bubble schedules (``'zb_h1'``, ``'zb_v'``) run the gradient of a stage's
input (B: the previous stage waits for it) as soon as possible and the
gradient of its weights (W: nothing waits for it) later, in what would be a
bubble. ``SplitStageFunctions`` builds the three functions of a stage from
ONE trace of its forward and full backward:

1. Trace ``forward + tf.gradients(outputs, theta + inputs)`` once, in a
   scratch graph G (never run).
2. Sort G's ops: the forward ops (ancestors of the outputs), the ops of the
   input gradient (ancestors of d_inputs) and the rest of the weight
   gradient, W: typically one matmul per weight, dW = x^T dy.
3. W's inputs (x and dy of each weight op, read across the boundary) are
   what must be kept from B until W runs. B computes them and returns them
   beside d_inputs; with re-materialization B recomputes the forward once
   and keeps what W needs, so W never recomputes anything.
4. Copy each op set into its own graph function (``F``, ``B``, ``W``); each
   micro-batch calls them as three tasks.

Without re-materialization (``remat='never'``) F also returns the forward
activations B and W read, and B does not recompute.

Gradients are exactly those of the unsplit backward: the copied ops are G's
ops, only cut into three functions. The pieces are cut along data edges: an
op that only a control dependency reaches (e.g. an assertion attached with
``py_utils.with_dependencies``) is not run under these schedules, and an op
whose gradient computes the input and weight gradients together (a While
loop's) stays whole in B.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import micro_batch as micro_batch_lib
from gpipe import stage as stage_lib
from gpipe import weight_batching
from gpipe.compat import tf_internal
from gpipe.schedules import pipeline_tasks
from lingvo import compat as tf
import numpy as np

# Attributes that tie an op to others of its original graph.
_DROPPED_ATTRS = ('_class',)


def _Ancestors(tensors, stop_ops):
  """Ops that `tensors` are computed from by data edges, not past stop_ops."""
  seen = set()
  stack = [t.op for t in tensors]
  while stack:
    op = stack.pop()
    if op in seen or op in stop_ops:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
  return seen


def _Unique(tensors):
  out, seen = [], set()
  for t in tensors:
    if t.ref() not in seen:
      seen.add(t.ref())
      out.append(t)
  return out


def _BoundaryInputs(ops):
  """Tensors read by `ops` but produced outside them, in a stable order."""
  found = []
  for op in sorted(ops, key=lambda o: o.name):
    found += [t for t in op.inputs if t.op not in ops]
  return _Unique(found)


def _Topological(ops):
  """`ops` ordered so that every op comes after the ops it reads."""
  order, done = [], set()
  for root in sorted(ops, key=lambda o: o.name):
    stack = [(root, False)]
    while stack:
      op, expanded = stack.pop()
      if op in done:
        continue
      if expanded:
        done.add(op)
        order.append(op)
        continue
      stack.append((op, True))
      parents = [t.op for t in op.inputs] + list(op.control_inputs)
      stack.extend((p, False) for p in parents if p in ops and p not in done)
  return order


# Matmul ops whose operands a, w can be swapped (a w^T = (w a^T)^T):
# op type -> (the attr transposing a, the attr transposing w).
_SWAPPABLE = {'MatMul': ('transpose_a', 'transpose_b'),
              'BatchMatMulV2': ('adj_x', 'adj_y')}


def _SameConstant(a, b):
  """Whether tensors `a` and `b` are one Const of the stage, in two traces.

  The same op (by name: the feeds of the two traces are paired by position)
  with the same value.
  """
  if a.op.type != 'Const' or b.op.type != 'Const':
    return False
  if a.op.name != b.op.name or a.value_index != b.value_index:
    return False
  x = tf.make_ndarray(a.op.get_attr('value'))
  y = tf.make_ndarray(b.op.get_attr('value'))
  return (x.dtype == y.dtype and x.shape == y.shape and
          bool(np.array_equal(x, y, equal_nan=x.dtype.kind in 'fc')))


class _Piece:
  """A subset of G's ops as one graph function: feeds -> outputs."""

  def __init__(self, name, source_graph, ops, feeds, outputs, prefix_ops=(),
               prefix='', swapped=(), trace=None):
    """Constructor.

    Args:
      name: 'F', 'B', 'W' (or 'W*').
      source_graph: the graph G the ops belong to.
      ops: the ops to copy.
      feeds: the function's inputs: tensors of G.
      outputs: tensors of G it returns.
      prefix_ops: ops whose copies get `prefix` on their names.
      prefix: see prefix_ops.
      swapped: matmul ops of `ops` computing ``a w^T`` that are computed as
        ``(w a^T)^T`` instead (see _SmallTransposedMatMuls).
      trace: function(fn, specs, name, names) -> the concrete function of
        `fn` (the stage's ``_Function``: XLA-compiled by its mode; `names`
        maps the copies' op names to G's); default a plain tf.function.
    """
    self.name = name
    self.feeds = list(feeds)
    self.outputs = list(outputs)
    ordered = _Topological(ops)
    source_names = {}  # Copied op name -> G's op name.

    def Body(*xs):
      graph = tf.compat.v1.get_default_graph()
      for fn in tf_internal.GraphFunctions(source_graph).values():
        tf_internal.AddFunction(graph, fn)
      env = {t.ref(): x for t, x in zip(self.feeds, xs)}
      copied = {}
      for op in ordered:
        attrs = {k: v for k, v in op.node_def.attr.items()
                 if k not in _DROPPED_ATTRS}
        inputs = [env.get(t.ref()) for t in op.inputs]
        op_name = (prefix + op.name) if op in prefix_ops else op.name
        if op in swapped:
          inputs = inputs[::-1]
        # Keep the op's own device (e.g. a random op's shape arithmetic
        # on the host CPU), as the uncopied function has it.
        with tf.device(op.device or None):
          new = tf_internal.CreateOp(
              graph, op.type, inputs, [o.dtype for o in op.outputs],
              graph.unique_name(op_name), attrs, op.op_def)
        for control in op.control_inputs:
          if control in copied:
            tf_internal.AddControlInput(new, copied[control])
        outputs = new.outputs
        if op in swapped:
          outputs = [tf.linalg.matrix_transpose(new.outputs[0])]
          new = outputs[0].op
        copied[op] = new
        source_names[new.name] = op.name
        for old, out in zip(op.outputs, outputs):
          env[old.ref()] = out
      return [env[t.ref()] for t in self.outputs]

    specs = [tf.TensorSpec(t.shape, t.dtype) for t in self.feeds]
    if trace is None:
      self.fn = tf.function(
          Body, autograph=False,
          experimental_attributes=stage_lib.NO_INLINE).get_concrete_function(
              *specs)
    else:
      self.fn = trace(Body, specs, name, source_names)

  def Call(self, env):
    """Calls the function on env[feed]s; adds its outputs to env.

    Returns:
      (op, results): the op that stands for the task in the schedule's order
      (the call op, or a no-op when the piece has nothing to compute, e.g. W
      of a stage without weights, so the device's chain of tasks stays
      unbroken) and the call's outputs in the order of `outputs` (a tensor
      listed twice, e.g. a stage output that W also reads, is two outputs).
    """
    if not self.outputs:
      return tf.no_op(), []
    results = self.fn(*[env[t.ref()] for t in self.feeds])
    results = list(results) if isinstance(results, (list, tuple)) else [
        results]
    for t, r in zip(self.outputs, results):
      env.setdefault(t.ref(), r)
    return results[0].op, results


class _TracedTensors(collections.namedtuple('_TracedTensors', [
    'theta', 'args', 'seed', 'step', 'acc_in', 'acc_out', 'd_outs', 'outs',
    'stats', 'd_theta', 'd_args'])):
  """The named tensors of a stage's trace G: placeholders and results.

  Attributes:
    theta, args, seed, step, acc_in, d_outs: G's placeholders (flat lists,
      or one tensor for seed and step).
    outs, stats, acc_out: the forward's outputs, batch-norm statistics and
      accumulator values.
    d_theta, d_args: the gradients of theta and of the float inputs.
  """

  __slots__ = ()


class _StageTrace(collections.namedtuple('_StageTrace', [
    'g', 'graph', 'captures', 'stop', 'forward', 'weight', 'w_feeds', 'b_ops',
    'b_targets', 'f_ops', 'f_targets', 'f_saved'])):
  """A stage's trace G and its ops sorted into the F, B and W pieces.

  Attributes:
    g: the _TracedTensors of G.
    graph: G.
    captures: (internal, external) tensor pairs G captured.
    stop: the placeholder ops of G (where ancestor walks stop).
    forward: the forward ops; weight: the ops only the weight gradient
      needs (W).
    w_feeds: the tensors W reads (computed once here).
    b_ops, b_targets: B's ops and what it returns.
    f_ops, f_targets, f_saved: F's ops, what it returns, and the forward
      activations it keeps for B and W (without remat).
  """

  __slots__ = ()


# The default of PipeliningLayer's swap_small_matmul_rows (see its doc).
SMALL_MATMUL_ROWS = 64


def _SmallTransposedMatMuls(ops, theta, stop, max_rows):
  """Small matmuls of `ops` that read a weight transposed: a set of ops.

  A weight (a tensor computed from theta alone) read transposed by a matmul
  (``MatMul`` or a batch matmul) of at most `max_rows` rows, e.g. the
  input gradient dy W^T of a dense layer at a small micro-batch, is re-packed
  on every call of the function, at about the cost of the product. B
  computes these as ``(W dy^T)^T``: the weight read in place as the first
  operand, only the small operand and the result transposed.
  """
  theta_ops = {t.op for t in theta}
  found = set()
  for op in ops:
    if op.type not in _SWAPPABLE:
      continue
    a_attr, w_attr = _SWAPPABLE[op.type]
    if op.get_attr(a_attr) or not op.get_attr(w_attr):
      continue
    weight = op.inputs[1]
    rows = op.inputs[0].shape
    if (weight.shape.rank is None or weight.shape.rank < 2 or
        rows.rank is None or rows[-2] is None or
        rows[-2] > max_rows):
      continue
    sources = {t.op for t in _BoundaryInputs(_Ancestors([weight], stop))}
    if weight.op in stop:
      sources = {weight.op}
    if sources and sources <= theta_ops:
      found.add(op)
  return found


class SplitStageFunctions(stage_lib.StageFunctions):
  """A stage whose backward is two tasks, B and W (see the module doc).

  With ``batch_weights_over=M`` the W tasks of the M micro-batches are one
  task (``gpipe.weight_batching``) that runs after the stage's last B.
  Small matmuls of B that read a weight transposed read it in place, their
  operands swapped (see ``_SmallTransposedMatMuls``).
  """

  BUILD_BACKWARD = False

  def __init__(self, *args, batch_weights_over=None, batch_dim=0,
               small_matmul_rows=SMALL_MATMUL_ROWS, **kwargs):
    super().__init__(*args, **kwargs)
    self._small_matmul_rows = small_matmul_rows
    self.batch_weights_over = batch_weights_over
    self._batch_dim = batch_dim
    self._pending = []

  def BeginStep(self):
    """Forgets the pending W feeds of a step."""
    self._pending = []

  def _TraceAndSort(self, theta_specs, arg_specs, acc_specs, d_out_specs,
                    collect_stats):
    """Traces the stage's forward + full backward in G and sorts G's ops.

    Args:
      theta_specs: the signature's theta,
      arg_specs: its inputs,
      acc_specs: its accumulator values,
      d_out_specs: and its output gradients (TensorSpecs).
      collect_stats: whether this trace defines the stage's output structure.

    Returns:
      A _StageTrace.
    """
    named = {}

    def Full(theta_ph, args_ph, seed_ph, acc_ph, step_ph, d_outs_ph):
      outs, stats, acc_out = self._Body(theta_ph, args_ph, seed_ph, step_ph,
                                        collect_stats, acc_in=acc_ph)
      ys = [outs[i] for i in self._float_outs]
      xs = list(theta_ph) + [args_ph[i] for i in self._float_args]
      grads = tf.gradients(ys, xs, grad_ys=list(d_outs_ph),
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
      # A gather's weight gradient is IndexedSlices: densify it inside W.
      grads = [tf.convert_to_tensor(d) if isinstance(d, tf.IndexedSlices)
               else d for d in grads]
      named.update(theta=list(theta_ph), args=list(args_ph), seed=seed_ph,
               step=step_ph, acc_in=list(acc_ph), acc_out=acc_out,
               d_outs=list(d_outs_ph), outs=outs, stats=stats,
               d_theta=grads[:len(theta_ph)], d_args=grads[len(theta_ph):])
      return outs + stats + acc_out + grads

    full = tf.function(Full, autograph=False).get_concrete_function(
        theta_specs, arg_specs, tf.TensorSpec([2], tf.int64), acc_specs,
        stage_lib.STEP_SPEC, d_out_specs)
    graph = full.graph
    g = _TracedTensors(**named)
    captures = [(internal, external) for external, internal in graph.captures]
    placeholders = (g.theta + g.args + [g.seed] + g.acc_in +
                    [g.step] + g.d_outs +
                    [internal for internal, _ in captures])
    stop = {t.op for t in placeholders}
    forward = _Ancestors(g.outs + g.stats + g.acc_out, stop)
    input_grad = _Ancestors(g.d_args, stop)
    weight = _Ancestors(g.d_theta, stop) - input_grad - forward
    w_feeds = _Unique(_BoundaryInputs(weight) +
                      [t for t in g.d_theta if t.op not in weight])

    def Produced(tensors, ops):
      return [t for t in tensors if t.op in ops]

    if self.remat:
      # B recomputes the forward and keeps what W needs.
      b_targets = _Unique(g.d_args + [t for t in w_feeds if t.op not in stop])
      b_ops = _Ancestors(b_targets, stop)
      f_saved = []
    else:
      b_targets = _Unique(g.d_args + [t for t in w_feeds if t.op not in stop
                                      and t.op not in forward])
      b_ops = _Ancestors(b_targets, stop) - forward
      f_saved = _Unique(Produced(_BoundaryInputs(b_ops), forward) +
                        Produced(b_targets, forward) +
                        Produced(w_feeds, forward))
    f_targets = _Unique(g.outs + g.stats + g.acc_out + f_saved)
    return _StageTrace(
        g=g, graph=graph, captures=captures, stop=stop,
        forward=forward, weight=weight, w_feeds=w_feeds, b_ops=b_ops,
        b_targets=b_targets, f_ops=_Ancestors(f_targets, stop),
        f_targets=f_targets, f_saved=f_saved)

  def _Build(self, theta_flat, args_flat, acc_flat):
    # Output structure, float args.
    super()._Build(theta_flat, args_flat, acc_flat)
    out_flat = micro_batch_lib.Present(self._out_struct)
    theta_specs = stage_lib.Specs(theta_flat)
    arg_specs = stage_lib.Specs(args_flat)
    d_out_specs = [tf.TensorSpec(out_flat[i].shape, out_flat[i].dtype)
                   for i in self._float_outs]
    t = self._TraceAndSort(theta_specs, arg_specs, stage_lib.Specs(acc_flat),
                           d_out_specs, True)
    g, graph = t.g, t.graph
    self._g = g
    self._captures = t.captures
    self._num_stats = len(g.stats)
    b_ops = t.b_ops
    b_feeds = _Unique(_BoundaryInputs(b_ops) +
                      [x for x in t.b_targets if x.op not in b_ops])
    self._pieces = {}
    self._pieces['F'] = _Piece(
        'F', graph, t.f_ops,
        _Unique(_BoundaryInputs(t.f_ops) +
                [x for x in t.f_targets if x.op in t.stop]),
        g.outs + g.stats + g.acc_out + t.f_saved, trace=self._Function)
    self._pieces['B'] = _Piece(
        'B', graph, b_ops, b_feeds, t.b_targets, prefix_ops=t.forward,
        prefix=pipeline_tasks.RECOMPUTE_SCOPE + '/',
        swapped=_SmallTransposedMatMuls(b_ops, g.theta, t.stop,
                                        self._small_matmul_rows),
        trace=self._Function)
    self._pieces['W'] = _Piece('W', graph, t.weight, t.w_feeds, g.d_theta,
                               trace=self._Function)
    if self.batch_weights_over:
      self._BuildBatchedWeights(t, theta_specs, arg_specs, acc_flat,
                                d_out_specs)

  def _BuildBatchedWeights(self, t, theta_specs, arg_specs, acc_flat,
                           d_out_specs):
    """Traces the stage on M micro-batches' shapes; its W is the W task."""
    m = self.batch_weights_over
    g = t.g

    def Whole(spec):
      dims = spec.shape.as_list()
      if not dims or dims[self._batch_dim] is None:
        return spec
      dims[self._batch_dim] *= m
      return tf.TensorSpec(dims, spec.dtype)

    whole = self._TraceAndSort(theta_specs, [Whole(s) for s in arg_specs],
                               stage_lib.Specs(acc_flat),
                               [Whole(s) for s in d_out_specs], False)
    wg = whole.g
    w_feeds = self._pieces['W'].feeds
    whole_feeds = whole.w_feeds
    prefix = 'stage %d (%s)' % (self.index, ', '.join(
        layer.params.name for layer in self.layers))
    if len(w_feeds) != len(whole_feeds):
      raise ValueError(
          '%s: its weight gradient reads %d tensors per micro-batch but %d '
          'for the whole batch: it cannot be batched over micro-batches. Set '
          'batched_weight_gradients=False' % (prefix, len(w_feeds),
                                              len(whole_feeds)))
    shared = {x.ref() for x in g.theta + [g.step]}
    shared |= {internal.ref() for internal, _ in self._captures}
    passed = {x.ref() for x in g.d_theta if x.op not in t.weight}
    self._w_merge = []
    for mb, wh in zip(w_feeds, whole_feeds):
      if mb.dtype != wh.dtype:
        raise ValueError(
            '%s: its weight gradient reads %s (%s) per micro-batch but %s (%s) '
            'for the whole batch. Set batched_weight_gradients=False' %
            (prefix, mb.name, mb.dtype.name, wh.name, wh.dtype.name))
      if mb.ref() in shared:
        self._w_merge.append(('shared', None))
      elif mb.ref() in passed:
        self._w_merge.append(('sum', None))
      elif _SameConstant(mb, wh):
        # A constant of the stage (e.g. a scale the layer multiplies by):
        # every micro-batch reads the same one.
        self._w_merge.append(('shared', None))
      else:
        try:
          axis = weight_batching.ConcatAxis(mb.name, mb.shape, wh.shape, m)
        except ValueError as e:
          raise ValueError('%s: %s' % (prefix, e)) from None
        self._w_merge.append(('concat', axis))
    self._pieces['W*'] = _Piece('W*', whole.graph, whole.weight,
                                whole_feeds, wg.d_theta, trace=self._Function)

  def Call(self, call, scheduled_ops):
    """Runs the stage on one micro-batch as tasks F, then B and W.

    Args and returns as ``StageFunctions.Call``; the backward of the call is
    two tasks, registered as phases 'B' and 'W' (with batched weight
    gradients, the last micro-batch's backward also runs the stage's one W
    task for all micro-batches).
    """
    theta, args, seed, step, micro_batch, targets, check_d_outputs = (
        call.theta, call.args, call.seed, call.step, call.micro_batch,
        call.targets, call.check_d_outputs)
    accumulator_values = list(call.accumulator_values)
    theta_flat, args_flat = self._Prepare(theta, args, targets,
                                          accumulator_values)
    g = self._g
    env = {}
    for placeholder, value in zip(
        g.theta + g.args + [g.seed] + g.acc_in + [g.step],
        list(theta_flat) + list(args_flat) + [seed] + accumulator_values +
        [step]):
      env[placeholder.ref()] = value
    for internal, external in self._captures:
      env[internal.ref()] = external

    passes = [0]  # tf.gradients calls over this task so far.

    def Run(phase, piece=None, m=micro_batch, values=None, gradient_pass=0):
      task = pipeline_tasks.Task(self.index, m, phase)
      with tf.name_scope(pipeline_tasks.OpScope(self.index, phase, m)):
        with tf.device(self.device):
          op, results = self._pieces[piece or phase].Call(
              env if values is None else values)
      scheduled_ops.Register(task, [op], gradient_pass)
      return op, results

    call_op, results = Run(pipeline_tasks.FORWARD)
    forward = self._pieces['F']
    feeds = forward.feeds
    grad_of = {}
    for placeholder, grad in zip(g.theta, g.d_theta):
      grad_of[placeholder.ref()] = grad
    for i, grad in zip(self._float_args, g.d_args):
      grad_of[g.args[i].ref()] = grad
    theta_refs = {t.ref() for t in g.theta}

    def Gradient(op, *d_results):
      """The B and W tasks of this stage and micro-batch."""
      gradient_pass = passes[0]
      passes[0] += 1
      d_outs = [d_results[i] for i in self._float_outs]
      if check_d_outputs is not None:
        check_d_outputs(micro_batch, d_outs)
      for placeholder, d in zip(g.d_outs, d_outs):
        env[placeholder.ref()] = d
      Run(pipeline_tasks.BACKWARD, gradient_pass=gradient_pass)
      if not self.batch_weights_over:
        Run(pipeline_tasks.WEIGHT, gradient_pass=gradient_pass)
      else:
        self._pending.append(
            (micro_batch, [env[x.ref()] for x in self._pieces['W'].feeds]))
        if len(self._pending) < self.batch_weights_over:
          # Its weight gradients come with the batched W task.
          return [None if t.ref() in theta_refs or t.ref() not in grad_of else
                  env[grad_of[t.ref()].ref()] for t in feeds] + [None] * (
                      len(op.inputs) - len(feeds))
        self._RunBatchedWeights(env, Run, gradient_pass)
      grads = [env[grad_of[t.ref()].ref()] if t.ref() in grad_of else None
               for t in feeds]
      return grads + [None] * (len(op.inputs) - len(feeds))

    tf_internal.SetGradientFunction(call_op, Gradient)
    # Positionally: the gradient function's d_results follow the call's
    # outputs, and an output may also be listed again (saved for B or W).
    num_outs, num_stats = len(g.outs), len(g.stats)
    outs = micro_batch_lib.Repack(self._out_struct, results[:num_outs])
    return stage_lib.StageResult(
        outs, list(results[num_outs:num_outs + num_stats]),
        list(results[num_outs + num_stats:num_outs + num_stats +
                     len(g.acc_out)]), list(self.stats_layers))

  def _RunBatchedWeights(self, env, run, gradient_pass):
    """The stage's one W task on all pending micro-batches' feeds.

    Its weight gradients are put in `env` as this micro-batch's d_theta.
    """
    indices = [m for m, _ in self._pending]
    pending = [feeds for _, feeds in self._pending]
    self._pending = []
    covered = pipeline_tasks.AllMicroBatches(min(indices), len(indices))
    if sorted(indices) != list(range(covered.first,
                                     covered.first + covered.count)):
      raise ValueError(
          'stage %d: its batched weight gradient would mix micro-batches %s; '
          'one tf.gradients pass over one FProp must give each micro-batch '
          'once (see README, Known limits)' % (self.index, sorted(indices)))
    whole = self._pieces['W*']
    values = {}
    with tf.name_scope(pipeline_tasks.OpScope(self.index, 'merge_W',
                                              covered)):
      with tf.device(self.device):
        for i, (feed, (kind, axis)) in enumerate(zip(whole.feeds,
                                                     self._w_merge)):
          column = [feeds[i] for feeds in pending]
          if kind == 'shared':
            value = column[-1]
          elif kind == 'sum':
            value = tf.add_n(column)
          else:
            value = tf.concat(column, axis)
          values[feed.ref()] = value
    _, results = run(pipeline_tasks.WEIGHT, piece='W*', m=covered,
                     values=values, gradient_pass=gradient_pass)
    for grad, result in zip(self._g.d_theta, results):
      env[grad.ref()] = result
