"""XLA-compiled stage functions: the pipelining layer's ``compile`` param.

With ``p.compile = 'xla'`` every graph function a stage runs is traced with
``tf.function(..., jit_compile=True)``: the forward, the backward (its
recomputed forward included), the B and W functions of a split backward,
the batched W, the decoding step of ``gpipe.lanes`` and the encoder stages
of pipelined decoding. The function then
carries ``_XlaMustCompile``, and TensorFlow runs each of its call ops as one
XLA computation, compiled for the call's device (``XLA_CPU_JIT``,
``XLA_GPU_JIT``) at the call's first run and cached for later steps: the
stage's ops are fused (the whole stage is one executable) instead of run op
by op. This holds in TF1 graph mode too: a session run of such a call
executes no op of the function's body (a traced step's ``step_stats`` show
the call, not its matmuls), and a body op without an XLA kernel fails the
run with ``No registered 'Op' OpKernel for XLA_CPU_JIT devices``
(``//tests:xla_stages_test`` checks both).

What XLA cannot compile is found when the functions are traced, before
anything runs (without remat, TensorFlow's own gradient of a compiled
forward is compiled too: the stage traces its backward once more, uncalled,
so that its ops are checked with the forward's): an op (also inside a nested function, a ``tf.cond`` branch
or a loop body) with no XLA kernel for the stage's device type, or none for
its dtype (string ops, ``tf.py_function``/``tf.numpy_function``, Lingvo's
custom ``x_ops``, ``tf.print``...). ``FindUnsupported`` lists them from
TensorFlow's kernel registry. With ``compile='xla'`` that is an
``UncompilableError`` naming the stage, the function, the layer and the op;
with ``compile='xla_where_possible'`` every function of the stage that holds
such an op runs uncompiled (a warning names the op) and the other stages
stay compiled.

Random ops: the dropout and drop path of ``gpipe.randomness`` draw their
masks with a counter-based generator written in plain integer ops, which
XLA and TensorFlow's kernels compute alike: a compiled stage drops exactly
the units the uncompiled pipeline drops, so losses and gradients match it
with dropout on. TensorFlow's own random kernels do not have that property
(``tf.random.stateless_uniform`` under XLA draws other numbers for the same
seed and algorithm, and cuts seeds to 32 bits), so a layer that calls them
(e.g. Lingvo's ``DeterministicDropoutLayer``) drops other units compiled; a
stateful random op (Lingvo's ``DropoutLayer`` with ``tf.nn.dropout``) has no
seed that ties a recomputation's draw to the forward's, compiled or not:
use ``gpipe.randomness.Dropout``. Because of such ops a stage is compiled
whole or not at all, so that a recomputing backward runs the way its
forward did.

The session: Grappler's memory optimizer, when it runs over the session
graph, rewrites a large AddN inside a compiled function (a Transformer
stage's gradient sums) into TemporaryVariable ops that XLA has no kernel
for, and the first step fails ("No registered 'TemporaryVariable' OpKernel
for XLA_CPU_JIT"; seen on the benchmark's Transformer stack, L=8, width 256,
batch 64, in some runs and not others: the pass decides from its memory
estimate). With oneDNN, Grappler's remapper fuses a batch matmul and its
add inside a compiled function into ``_MklFusedBatchMatMulV2``, which XLA
has no kernel for either (seen in a decoding step on worker sessions).
``SessionConfig`` turns both passes off; the trainer runs its sessions
without Grappler unless ``--session_graph_optimizer``, and then with
``--xla`` uses ``SessionConfig``.

Data-dependent shapes inside a stage (``tf.boolean_mask``, ``tf.unique``, a
``tf.range`` of a computed length) are not refused: TensorFlow 2.15's XLA
compiles them with bounded dynamic shapes (verified on XLA_CPU_JIT). A
stage input of unknown shape compiles once per shape it meets (e.g. bucketed
sequence lengths: one compilation per bucket, at its first batch). Errors XLA
raises only when it compiles (a shape argument it needs as a compile-time
constant but cannot fold) come at the first run, naming the function
(``stage<k>_F`` and so on).

Not compiled: the layers before the pipeline (``before_tpl``), the split into
micro-batches and the merge, the running gradient sums
(``gpipe.accumulation``) and the batch-norm updates: they run once per
mini-batch or are identities and additions. TPU devices are not checked
(their kernels are not registered in a CPU/GPU TensorFlow); nothing here was
run on a TPU.
"""

import collections
import contextlib
import re

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import thread_stack
from gpipe.compat import tf_internal
from lingvo import compat as tf

XLA = 'xla'
XLA_WHERE_POSSIBLE = 'xla_where_possible'
# The values of the ``compile`` param.
MODES = (None, XLA, XLA_WHERE_POSSIBLE)

# The JIT device type of each device type whose kernels are checked.
_JIT_DEVICES = {'CPU': 'XLA_CPU_JIT', 'GPU': 'XLA_GPU_JIT'}

# Attribute of a function (and of its call ops) that XLA must compile.
MUST_COMPILE_ATTR = '_XlaMustCompile'

# Ops listed per function in an error.
_MAX_LISTED = 5


class UncompilableError(ValueError):
  """A stage function that XLA cannot compile, with compile='xla'."""


def CheckMode(name, mode):
  """Refuses an unknown ``compile`` value of layer `name`, naming the known."""
  if mode not in MODES:
    raise ValueError(
        '%s: unknown compile=%r; use None (no XLA), %r (every stage function '
        'compiled, an op XLA cannot compile is an error) or %r (functions '
        'holding such an op run uncompiled)' %
        (name, mode, XLA, XLA_WHERE_POSSIBLE))


def Compiles(mode):
  """Whether `mode` (a ``compile`` value) compiles stage functions."""
  return mode in (XLA, XLA_WHERE_POSSIBLE)


def JitDevice(device):
  """The XLA JIT device type for `device` ('XLA_CPU_JIT'), or None (TPU).

  Args:
    device: a device string ('/device:GPU:1', '/job:worker/task:0/device:CPU:0')
      or None/'' (the default device: a CPU).
  """
  spec = tf.DeviceSpec.from_string(device or '')
  return _JIT_DEVICES.get((spec.device_type or 'CPU').upper())


_RECORDERS = thread_stack.ThreadLocalStack()


@contextlib.contextmanager
def RecordLayers():
  """Inside a trace: records which layer's FProp made each op.

  Yields:
    A dict {op name: layer path}, filled by ``LayerScope`` blocks inside.
  """
  with _RECORDERS.Pushed({}) as owners:
    yield owners


@contextlib.contextmanager
def LayerScope(layer):
  """The ops made in the block are `layer`'s (when ``RecordLayers`` is on)."""
  owners = _RECORDERS.Top()
  if owners is None:
    yield
    return
  graph = tf.get_default_graph()
  before = len(graph.get_operations())
  try:
    yield
  finally:
    path = getattr(layer, 'path', None) or layer.params.name
    for op in graph.get_operations()[before:]:
      # An inner scope has already claimed its ops: the innermost layer wins.
      owners.setdefault(op.name, path)


# 'gradients/dense0/MatMul_grad/MatMul_1' is the gradient of 'dense0/MatMul'.
_GRADIENT_OP = re.compile(r'^(?:.*/)?gradients(?:_\d+)?/(.*?)_grad/')
_RECOMPUTE = re.compile(r'^(?:.*/)?recompute/')


def LayerOf(owners, op_name):
  """The layer path that made op `op_name` (or its forward op), or None."""
  name = _RECOMPUTE.sub('', op_name)
  if name in owners:
    return owners[name]
  match = _GRADIENT_OP.match(name)
  if match:
    return owners.get(_RECOMPUTE.sub('', match.group(1)))
  return None


class Unsupported(
    collections.namedtuple('Unsupported', ['op', 'type', 'dtypes', 'layer',
                                           'function'])):
  """An op XLA cannot compile.

  Attributes:
    op: its name in the traced function (the outer call op's for an op in a
      nested function: `function` names that one).
    type: its type.
    dtypes: the dtypes of its attributes when XLA has kernels for the op but
      not for these, else ''.
    layer: the layer that made it, or None if unknown.
    function: the nested function holding it, or None.
  """

  __slots__ = ()

  def Describe(self):
    where = " in function '%s' called by" % self.function if self.function else ''
    what = ('%s with %s' % (self.type, self.dtypes) if self.dtypes else
            self.type)
    layer = ', layer %s' % self.layer if self.layer else ''
    return "op%s '%s' (%s%s)" % (where, self.op, what, layer)


_KERNELS = {}  # (jit device, op type) -> [KernelDef]


def _JitKernels(jit_device, op_type):
  key = (jit_device, op_type)
  if key not in _KERNELS:
    _KERNELS[key] = tf_internal.XlaKernels(jit_device, op_type)
  return _KERNELS[key]


def _Dtypes(attr_value):
  kind = attr_value.WhichOneof('value')
  if kind == 'type':
    return [attr_value.type]
  if kind == 'list':
    return list(attr_value.list.type)
  return []


def _Supported(jit_device, op_type, attrs):
  """(whether an XLA kernel takes an op of these attrs, the dtypes it lacks)."""
  kernels = _JitKernels(jit_device, op_type)
  if not kernels:
    return False, ''
  for kernel in kernels:
    if all(
        all(t in c.allowed_values.list.type for t in _Dtypes(attrs[c.name]))
        for c in kernel.constraint if c.name in attrs):
      return True, ''
  dtypes = sorted({
      '%s=%s' % (c.name, ','.join(tf.as_dtype(t).name
                                 for t in _Dtypes(attrs[c.name])))
      for kernel in kernels for c in kernel.constraint if c.name in attrs})
  return False, ' '.join(dtypes)


def _CalledFunctions(op_type, attrs, functions):
  """Names of the graph functions a node runs (call, cond, loop)."""
  names = [op_type] if op_type in functions else []
  for value in attrs.values():
    kind = value.WhichOneof('value')
    if kind == 'func':
      names.append(value.func.name)
    elif kind == 'list':
      names += [f.name for f in value.list.func]
  return [n for n in names if n in functions]


def FindUnsupported(graph, jit_device, owners=None, ops=None, names=None):
  """The ops of a traced function graph that XLA cannot compile.

  Args:
    graph: the function's graph (``concrete_function.graph``).
    jit_device: 'XLA_CPU_JIT' or 'XLA_GPU_JIT'.
    owners: optional {op name: layer path} (``RecordLayers``), or a
      function(op name) -> layer path or None.
    ops: the ops to check (default: all of `graph`'s).
    names: optional {op name in `graph`: the name to report and look up in
      `owners`} (a copied op's original name).

  Returns:
    A list of Unsupported, in graph order; nested functions are checked
    once each.
  """
  if owners is None:
    owners = {}
  names = names or {}
  layer_of = owners if callable(owners) else (
      lambda name: LayerOf(owners, name))
  functions = tf_internal.GraphFunctions(graph)
  found = []
  seen = set()

  def Check(name, op_type, attrs, layer, function):
    # `name`: the op of the traced graph (the outer call for a nested op).
    supported, dtypes = _Supported(jit_device, op_type, attrs)
    if not supported and op_type not in functions:
      found.append(Unsupported(name, op_type, dtypes, layer, function))
    for fn_name in _CalledFunctions(op_type, attrs, functions):
      if fn_name in seen:
        continue
      seen.add(fn_name)
      for node in tf_internal.FunctionDefinition(functions[fn_name]).node_def:
        Check(name, node.op, node.attr, layer, fn_name)

  for op in graph.get_operations() if ops is None else ops:
    if op.type == 'Placeholder':  # The function's arguments.
      continue
    name = names.get(op.name, op.name)
    Check(name, op.type, op.node_def.attr, layer_of(name), None)
  return found


def SessionConfig(config=None):
  """`config` (a new ConfigProto by default) fit for XLA-compiled stages.

  Turns off the two Grappler passes that rewrite the body of a compiled
  function into ops XLA has no kernel for (see the module doc): the memory
  optimizer (a large AddN into TemporaryVariable ops) and the remapper (with
  oneDNN, a batch matmul and its add into ``_MklFusedBatchMatMulV2``; seen
  in a decoding step's attention). The other passes stay as they are.

  Args:
    config: a tf.compat.v1.ConfigProto, changed in place, or None.

  Returns:
    The ConfigProto.
  """
  config = config or tf.compat.v1.ConfigProto()
  rewrites = config.graph_options.rewrite_options
  rewrites.memory_optimization = rewrites.NO_MEM_OPT
  rewrites.remapping = rewrites.OFF
  return config


def IsCompiled(op):
  """Whether call op `op` runs its function as one XLA computation."""
  attr = op.node_def.attr.get(MUST_COMPILE_ATTR)
  return attr is not None and attr.b


def Trace(fn, specs, compiled, name=None, attributes=None):
  """``tf.function(fn).get_concrete_function(*specs)``, XLA-compiled or not.

  Args:
    fn: the Python function to trace.
    specs: its argument specs (positional).
    compiled: whether XLA compiles it (``jit_compile=True``).
    name: when compiled, the function's name (e.g. 'stage1_B'), which XLA's
      errors and dumps show.
    attributes: its ``experimental_attributes`` (e.g. no inlining).

  Returns:
    The concrete function.
  """
  if compiled and name:
    fn.__name__ = name
  return tf.function(
      fn, autograph=False, jit_compile=True if compiled else None,
      experimental_attributes=attributes).get_concrete_function(*specs)


def Problems(concrete, device, owners=None, names=None):
  """The ops of compiled `concrete` that XLA cannot compile on `device`.

  Args:
    concrete: a concrete function (``Trace``).
    device: the device its calls run on (decides the JIT device checked).
    owners, names: see FindUnsupported.

  Returns:
    A list of Unsupported; empty if it is not compiled or its device type
    is not checked (TPU).
  """
  jit_device = JitDevice(device)
  attr = concrete.function_def.attr.get(MUST_COMPILE_ATTR)
  if jit_device is None or attr is None or not attr.b:
    return []
  return FindUnsupported(concrete.graph, jit_device, owners, names=names)


def Resolve(mode, what, problems, device):
  """What to do with a group of functions after their compiled trace.

  The functions of one stage are compiled together or not at all: a random
  op from TensorFlow's kernels (not gpipe.randomness) draws other numbers
  under XLA, so a recomputing backward must be compiled exactly when its
  forward is.

  Args:
    mode: the ``compile`` value.
    what: the group, for messages (e.g. 'stage 1 (pipe.dense2)').
    problems: {function description: [Unsupported]} of the compiled trace.
    device: their device.

  Returns:
    True to keep the compiled functions, False to trace them again
    uncompiled ('xla_where_possible' and some op XLA cannot compile).

  Raises:
    UncompilableError: mode 'xla' and some op XLA cannot compile.
  """
  problems = {k: v for k, v in problems.items() if v}
  if not Compiles(mode) or not problems:
    return True
  parts = []
  for function, found in problems.items():
    listed = '; '.join(u.Describe() for u in found[:_MAX_LISTED])
    if len(found) > _MAX_LISTED:
      listed += '; and %d more' % (len(found) - _MAX_LISTED)
    parts.append('in its %s: %s' % (function, listed))
  message = ('%s on %s: XLA (%s) has no kernel for these ops: %s' %
             (what, device or 'the default device', JitDevice(device),
              '; '.join(parts)))
  if mode == XLA:
    raise UncompilableError(
        message + ". Set the pipeline's compile='%s' to run this stage's "
        'functions uncompiled (the other stages stay compiled), or move the '
        'op out of the stage (into the input pipeline or before_tpl), or '
        'replace it with ops XLA compiles' % XLA_WHERE_POSSIBLE)
  tf.logging.warning('%s. Its functions run uncompiled (compile=%r)',
                     message, mode)
  return False
