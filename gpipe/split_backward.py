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

from gpipe import lingvo_import  # pylint: disable=unused-import
from gpipe import micro_batch as micro_batch_lib
from gpipe import pipeline_tasks
from gpipe import stage as stage_lib
from lingvo import compat as tf

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


class _Piece:
  """A subset of G's ops as one graph function: feeds -> outputs."""

  def __init__(self, name, source_graph, ops, feeds, outputs, prefix_ops=(),
               prefix=''):
    self.name = name
    self.feeds = list(feeds)
    self.outputs = list(outputs)
    ordered = _Topological(ops)

    def Body(*xs):
      graph = tf.compat.v1.get_default_graph()
      for fn in getattr(source_graph, '_functions', {}).values():
        graph._add_function(fn)  # pylint: disable=protected-access
      env = {t.ref(): x for t, x in zip(self.feeds, xs)}
      copied = {}
      for op in ordered:
        attrs = {k: v for k, v in op.node_def.attr.items()
                 if k not in _DROPPED_ATTRS}
        op_name = (prefix + op.name) if op in prefix_ops else op.name
        new = graph._create_op_internal(  # pylint: disable=protected-access
            op.type, [env[t.ref()] for t in op.inputs],
            dtypes=[o.dtype for o in op.outputs],
            name=graph.unique_name(op_name), attrs=attrs, op_def=op.op_def)
        for control in op.control_inputs:
          if control in copied:
            new._add_control_input(copied[control])  # pylint: disable=protected-access
        copied[op] = new
        for old, out in zip(op.outputs, new.outputs):
          env[old.ref()] = out
      return [env[t.ref()] for t in self.outputs]

    specs = [tf.TensorSpec(t.shape, t.dtype) for t in self.feeds]
    self.fn = tf.function(
        Body, autograph=False,
        experimental_attributes=stage_lib.NO_INLINE).get_concrete_function(
            *specs)

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


class SplitStageFunctions(stage_lib.StageFunctions):
  """A stage whose backward is two tasks, B and W (see the module doc)."""

  BUILD_BACKWARD = False

  def _Build(self, theta_flat, args_flat, acc_flat):
    # Output structure, float args.
    super()._Build(theta_flat, args_flat, acc_flat)
    out_flat = micro_batch_lib.Present(self._out_struct)
    theta_specs = stage_lib.Specs(theta_flat)
    arg_specs = stage_lib.Specs(args_flat)
    seed_spec = tf.TensorSpec([2], tf.int64)
    d_out_specs = [tf.TensorSpec(out_flat[i].shape, out_flat[i].dtype)
                   for i in self._float_outs]
    g = {}

    def Full(theta_ph, args_ph, seed_ph, acc_ph, step_ph, d_outs_ph):
      outs, stats, acc_out = self._Body(theta_ph, args_ph, seed_ph, step_ph,
                                        True, acc_in=acc_ph)
      ys = [outs[i] for i in self._float_outs]
      xs = list(theta_ph) + [args_ph[i] for i in self._float_args]
      grads = tf.gradients(ys, xs, grad_ys=list(d_outs_ph),
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
      # A gather's weight gradient is IndexedSlices: densify it inside W.
      grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices)
               else g for g in grads]
      g.update(theta=list(theta_ph), args=list(args_ph), seed=seed_ph,
               step=step_ph, acc_in=list(acc_ph), acc_out=acc_out,
               d_outs=list(d_outs_ph), outs=outs, stats=stats,
               d_theta=grads[:len(theta_ph)], d_args=grads[len(theta_ph):])
      return outs + stats + acc_out + grads

    full = tf.function(Full, autograph=False).get_concrete_function(
        theta_specs, arg_specs, seed_spec, stage_lib.Specs(acc_flat),
        stage_lib.STEP_SPEC, d_out_specs)
    graph = full.graph
    self._g = g
    self._captures = [(internal, external)
                      for external, internal in graph.captures]
    placeholders = (g['theta'] + g['args'] + [g['seed']] + g['acc_in'] +
                    [g['step']] + g['d_outs'] +
                    [internal for internal, _ in self._captures])
    stop = {t.op for t in placeholders}
    forward = _Ancestors(g['outs'] + g['stats'] + g['acc_out'], stop)
    input_grad = _Ancestors(g['d_args'], stop)
    weight = _Ancestors(g['d_theta'], stop) - input_grad - forward
    w_feeds = _Unique(_BoundaryInputs(weight) +
                      [t for t in g['d_theta'] if t.op not in weight])

    def Produced(tensors, ops):
      return [t for t in tensors if t.op in ops]

    if self.remat:
      # B recomputes the forward and keeps what W needs.
      b_targets = _Unique(g['d_args'] + [t for t in w_feeds
                                         if t.op not in stop])
      b_ops = _Ancestors(b_targets, stop)
      f_saved = []
    else:
      b_targets = _Unique(g['d_args'] + [t for t in w_feeds if t.op not in
                                         stop and t.op not in forward])
      b_ops = _Ancestors(b_targets, stop) - forward
      f_saved = _Unique(Produced(_BoundaryInputs(b_ops), forward) +
                        Produced(b_targets, forward) +
                        Produced(w_feeds, forward))
    f_targets = _Unique(g['outs'] + g['stats'] + g['acc_out'] + f_saved)
    f_ops = _Ancestors(f_targets, stop)
    self._num_stats = len(g['stats'])
    self._pieces = {}
    self._pieces['F'] = _Piece(
        'F', graph, f_ops,
        _Unique(_BoundaryInputs(f_ops) + Produced(f_targets, stop)),
        g['outs'] + g['stats'] + g['acc_out'] + f_saved)
    self._pieces['B'] = _Piece(
        'B', graph, b_ops,
        _Unique(_BoundaryInputs(b_ops) + [t for t in b_targets
                                          if t.op not in b_ops]),
        b_targets, prefix_ops=forward, prefix=stage_lib.RECOMPUTE_SCOPE + '/')
    self._pieces['W'] = _Piece(
        'W', graph, weight,
        _Unique(_BoundaryInputs(weight) + [t for t in g['d_theta']
                                           if t.op not in weight]),
        g['d_theta'])

  def Call(self, theta, args, seed, step, micro_batch, registry,
           targets=None, check_d_outputs=None, accumulator_values=()):
    """Runs the stage on one micro-batch as tasks F, then B and W.

    Args and returns as ``StageFunctions.Call``; the backward of the call is
    two tasks, registered as phases 'B' and 'W'.
    """
    accumulator_values = list(accumulator_values)
    theta_flat, args_flat = self._Prepare(theta, args, targets,
                                          accumulator_values)
    g = self._g
    env = {}
    for placeholder, value in zip(
        g['theta'] + g['args'] + [g['seed']] + g['acc_in'] + [g['step']],
        list(theta_flat) + list(args_flat) + [seed] + accumulator_values +
        [step]):
      env[placeholder.ref()] = value
    for internal, external in self._captures:
      env[internal.ref()] = external

    def Run(phase):
      task = pipeline_tasks.Task(self.index, micro_batch, phase)
      with tf.name_scope(pipeline_tasks.OpScope(self.index, phase,
                                                micro_batch)):
        with tf.device(self.device):
          op, results = self._pieces[phase].Call(env)
      registry.Register(task, [op])
      return op, results

    call_op, results = Run(pipeline_tasks.FORWARD)
    forward = self._pieces['F']
    feeds = forward.feeds
    grad_of = {}
    for placeholder, grad in zip(g['theta'], g['d_theta']):
      grad_of[placeholder.ref()] = grad
    for i, grad in zip(self._float_args, g['d_args']):
      grad_of[g['args'][i].ref()] = grad

    def Gradient(op, *d_results):
      """The B and W tasks of this stage and micro-batch."""
      d_outs = [d_results[i] for i in self._float_outs]
      if check_d_outputs is not None:
        check_d_outputs(micro_batch, d_outs)
      for placeholder, d in zip(g['d_outs'], d_outs):
        env[placeholder.ref()] = d
      Run(pipeline_tasks.BACKWARD)
      Run(pipeline_tasks.WEIGHT)
      grads = [env[grad_of[t.ref()].ref()] if t.ref() in grad_of else None
               for t in feeds]
      return grads + [None] * (len(op.inputs) - len(feeds))

    call_op._gradient_function = Gradient  # pylint: disable=protected-access
    # Positionally: the gradient function's d_results follow the call's
    # outputs, and an output may also be listed again (saved for B or W).
    num_outs, num_stats = len(g['outs']), len(g['stats'])
    outs = micro_batch_lib.Repack(self._out_struct, results[:num_outs])
    return (outs, results[num_outs:num_outs + num_stats],
            results[num_outs + num_stats:num_outs + num_stats +
                    len(g['acc_out'])])
