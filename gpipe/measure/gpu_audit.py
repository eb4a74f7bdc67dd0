"""Which ops of a pipeline's GPU stages would leave the GPU, found without one.

A built graph whose stages are placed on GPUs (``/device:GPU:i``, or
``/job:worker/replica:0/task:t/device:GPU:i``) is checked against
TensorFlow's kernel registry, which lists every op's kernels per device type
with their dtype constraints and host-memory arguments even in a process
that has no GPU (a CUDA build of TensorFlow registers its GPU kernels
whatever the machine). ``Audit`` walks the graph and every function it
calls (a stage's forward and backward are functions called through
``PartitionedCall``; a node the function body leaves unplaced runs on its
call's device) and reports, per GPU:

* ``no GPU kernel``: an op placed on the GPU with no GPU kernel for its
  dtypes (each type attribute checked against each kernel's constraints).
  Under soft placement (the trainer's ``allow_soft_placement=True``) it runs
  on the host, under hard placement the session fails to place it;
* ``Lingvo op``: the same for a Lingvo custom op (``lingvo.core.ops``, e.g.
  ``AssertSameDim0``), whose installed kernels are CPU-only;
* ``host crossing``: a tensor that crosses between the host (a CPU op,
  including one that fell back from the GPU) and a GPU within the graph or
  function body it is computed in: one copy per call, so per micro-batch for
  a stage function. Hand-overs between GPUs are not findings;
* ``host memory``: on one GPU, a tensor TensorFlow keeps in host memory
  (int32 tensors of most GPU kernels and of function arguments; the kernel's
  ``host_memory_arg``) read by a kernel that wants it in device memory, or
  the other way round: a copy between the GPU and its host per call (and a
  sync, for a device-to-host copy).

Each finding names the op, its type, dtypes, the layer (the op's name scope)
and the stage call it is in (``stage1 B``: the backward function of stage 1,
as the executor names its call ops); ``Report`` prints them as a table per
GPU with the copies per step. Memory types follow TensorFlow's own rules
(``tensorflow/core/framework/memory_types.cc``): a matched kernel's
host-memory arguments; int32 on the host for function calls
(``PartitionedCall``, ``While``, ...) and for function arguments and results;
strings and resource handles always on the host (never a finding).

What is not a finding, by design: int32 shape computations that stay in host
memory and feed host-memory arguments (no copy is made); in the graph
itself, everything but the stage tasks' ops (the split of the batch before
the stages, the merge and loss after them hand the whole batch over once
per step); and the predicates of data-dependent control flow (If, Case),
which TensorFlow reads on the host to choose a branch: counted per GPU in
the report, since a model chooses them (pipelined decoding's early stop).

The audit reads the graph as built, before Grappler: a constant expression
Grappler may fold at run time is reported like any other, so compute such
values in Python. Ids that GPU stages read are best int64 (an int32 tensor
handed to a stage arrives in host memory). Nothing runs: the audit reads the
GraphDef and the registry, so it needs no GPU, and the graph may name
devices the process does not have.
"""

import collections
import functools
import os
import re

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.compat import tf_internal
from lingvo import compat as tf

# The label of the graph's own ops (not in a function).
GRAPH = 'graph'

NO_GPU_KERNEL = 'no GPU kernel'
LINGVO_OP = 'Lingvo op'
HOST_CROSSING = 'host crossing'
HOST_MEMORY = 'host memory'
KINDS = (NO_GPU_KERNEL, LINGVO_OP, HOST_CROSSING, HOST_MEMORY)

# Kernels that run on a GPU: its own, and the device-independent ones
# TensorFlow falls back to when a device type has none (op_kernel.cc).
_GPU, _DEFAULT = 'GPU', 'DEFAULT'
# Ops whose int32 inputs and outputs TensorFlow keeps on the host although
# they have a (DEFAULT) kernel: calls of functions (memory_types.cc).
_FUNCTION_CALL_OPS = frozenset(
    ['SymbolicGradient', 'PartitionedCall', 'StatefulPartitionedCall',
     'While'])
# Always in host memory on every device (DataTypeAlwaysOnHost): never copied
# between a GPU and its host, so never a finding.
_ALWAYS_ON_HOST = frozenset(
    [tf.string.as_datatype_enum, tf.resource.as_datatype_enum])
_INT32 = tf.int32.as_datatype_enum
_HOST, _DEVICE = 'host', 'device'
# The executor's call ops: 'stage1_F3/PartitionedCall', 'stage0_Wall0to7/...',
# 'stage1_merge_W3/...', and pipelined decoding's 'stage1_D2/...'
# (gpipe.schedules.pipeline_tasks.OpScope).
_STAGE_SCOPE = re.compile(
    r'(?:^|/)stage(\d+)_([A-Za-z_]*[A-Za-z])(\d+|all\d+to\d+)?/')
# The inputs by which control flow chooses what runs next: TensorFlow reads
# them on the host by design (the If/Case kernels take them in host memory),
# so a predicate computed on a GPU is copied to its host whatever the model
# does with it. Counted per GPU, apart from the findings: data-dependent
# control flow is the model's choice (e.g. pipelined decoding's early stop
# of a finished lane), not a missing kernel or a misplaced op.
_PREDICATES = {'If': 'cond', 'StatelessIf': 'cond', 'Case': 'branch_index',
               'StatelessCase': 'branch_index'}
# Name scopes that say how an op was made, not which layer it belongs to.
_NOISE_SCOPES = re.compile(r'^(gradients(_\d+)?|recompute'
                           r'|(Stateful)?PartitionedCall(_\d+)?)$')


class Finding(
    collections.namedtuple('Finding', [
        'kind', 'device', 'stage', 'node', 'op', 'dtype', 'layer', 'detail',
        'calls'
    ])):
  """One op or tensor of a GPU stage that leaves the GPU.

  Attributes:
    kind: one of KINDS.
    device: the GPU (full device string) the op was placed on.
    stage: where it is: 'stage1 B' (the function a stage's backward calls),
      'graph' (the graph itself) or a function name.
    node: the op's name (for a tensor: 'producer:output').
    op: the op type (for a tensor: the producer's type).
    dtype: the op's type attributes ('T=int64') or the tensor's dtype.
    layer: the op's name scope, the layer it belongs to.
    detail: what happens: where the op runs instead, or which op reads the
      tensor from which memory.
    calls: how many times one step runs it (the calls of its function).
  """

  __slots__ = ()


class AuditResult(
    collections.namedtuple('AuditResult', ['findings', 'devices'])):
  """What ``Audit`` found.

  Attributes:
    findings: a list of Findings, by device, stage and name.
    devices: {GPU device string: DeviceSummary} for every GPU the graph
      places an op on (with or without findings).
  """

  __slots__ = ()

  def Counts(self):
    """{kind: number of findings} over all devices."""
    counts = collections.Counter(f.kind for f in self.findings)
    return {kind: counts.get(kind, 0) for kind in KINDS}


class DeviceSummary(
    collections.namedtuple('DeviceSummary', [
        'stages', 'num_ops', 'micro_batches', 'predicates', 'unchecked'
    ])):
  """A GPU of the audited graph.

  Attributes:
    stages: the sorted stage indices whose calls run on it.
    num_ops: the ops placed on it (each function body counted once).
    micro_batches: the micro-batches its stages' calls name (0: none).
    predicates: control-flow predicates (If/Case) computed on it that the
      host reads, per step (a copy by design, not a finding).
    unchecked: the sorted types of its ops this process has no op
      definition for (a custom-op library not loaded): not audited.
  """

  __slots__ = ()


# --- The kernel registry -----------------------------------------------------

_KERNELS = {}
_LINGVO_OPS = None


def _Kernels(op_type):
  if op_type not in _KERNELS:
    _KERNELS[op_type] = tf_internal.RegisteredKernels(op_type)
  return _KERNELS[op_type]


def LingvoOps():
  """The names of the ops of Lingvo's custom-op library (``x_ops.so``)."""
  global _LINGVO_OPS
  if _LINGVO_OPS is None:
    from lingvo.core import ops  # pylint: disable=g-import-not-at-top
    path = os.path.join(os.path.dirname(ops.__file__), 'x_ops.so')
    _LINGVO_OPS = frozenset(
        op.name for op in tf_internal.LibraryOps(path)) if os.path.exists(
            path) else frozenset()
  return _LINGVO_OPS


def _Types(value):
  """The dtypes an AttrValue holds (a type or a list of types)."""
  if value.WhichOneof('value') == 'type':
    return [value.type]
  return list(value.list.type)


def _Matches(kernel, attrs):
  """Whether `kernel`'s constraints and label accept a node's attrs."""
  for constraint in kernel.constraint:
    value = attrs.get(constraint.name)
    if value is None:
      return False
    allowed = set(_Types(constraint.allowed_values))
    if not all(t in allowed for t in _Types(value)):
      return False
  label = attrs.get('_kernel')
  return kernel.label == (label.s.decode() if label is not None else '')


def GpuKernel(op_type, attrs):
  """The kernel TensorFlow would run for an op on a GPU, or None.

  Args:
    op_type: the op's type.
    attrs: {name: AttrValue}, with the op's defaults filled in.

  Returns:
    The KernelDef of the GPU kernel that matches (the highest priority), else
    the matching device-independent (DEFAULT) one, else None.
  """
  # Thousands of a graph's ops share a type and the attrs its kernels'
  # constraints read: each such combination is matched once.
  kernels, names = _KernelsAndConstrainedAttrs(op_type)
  label = attrs.get('_kernel')
  key = (op_type, label.s if label is not None else None) + tuple(
      tuple(_Types(attrs[n])) if n in attrs else None for n in names)
  if key not in _GPU_KERNEL:
    _GPU_KERNEL[key] = None
    for device_type in (_GPU, _DEFAULT):
      matches = [k for k in kernels
                 if k.device_type == device_type and _Matches(k, attrs)]
      if matches:
        _GPU_KERNEL[key] = max(matches, key=lambda k: k.priority)
        break
  return _GPU_KERNEL[key]


# GpuKernel's results by (op type, kernel label, constrained attrs' types).
_GPU_KERNEL = {}
_CONSTRAINED = {}


def _KernelsAndConstrainedAttrs(op_type):
  """(the op type's kernels, the sorted attr names their constraints read)."""
  if op_type not in _CONSTRAINED:
    kernels = _Kernels(op_type)
    _CONSTRAINED[op_type] = (kernels, tuple(sorted(
        {c.name for k in kernels for c in k.constraint})))
  return _CONSTRAINED[op_type]


# --- Devices -----------------------------------------------------------------


def _Canonical(spec):
  """A DeviceSpec's string; this process's devices without their job.

  '/job:localhost/replica:0/task:0/device:GPU:1' and '/device:GPU:1' are
  the same device of a one-process session, and a graph built in one names
  it both ways (a stage's ops and the ops around them).
  """
  if spec.job == 'localhost' and spec.replica in (0, None) and spec.task in (
      0, None):
    spec = spec.replace(job=None, replica=None, task=None)
  return spec.to_string()


# Device strings repeat over thousands of ops: each is parsed once.
@functools.lru_cache(maxsize=None)
def _Merge(outer, inner):
  """`inner` (a node's device) completed by `outer` (its call's device)."""
  if not inner:
    return outer
  spec = tf.DeviceSpec.from_string(inner)
  if outer:
    spec = tf.DeviceSpec.from_string(outer).make_merged_spec(spec)
  return _Canonical(spec)


@functools.lru_cache(maxsize=None)
def _DeviceType(device):
  return tf.DeviceSpec.from_string(device).device_type if device else None


@functools.lru_cache(maxsize=None)
def _HostOf(device):
  """The CPU of `device`'s task: where soft placement moves a GPU-less op."""
  return _Canonical(tf.DeviceSpec.from_string(device).replace(
      device_type='CPU', device_index=0))


# --- One graph body ----------------------------------------------------------


class _Node:
  """An op (or a function argument) of one body, placed and typed."""

  def __init__(self, name, op, attrs, device, op_def=None):
    self.name = name
    self.op = op
    self.attrs = attrs
    self.device = device  # as placed (merged with the call's device)
    self.op_def = op_def
    self.kernel = None
    self.fallback = False  # placed on a GPU that has no kernel for it
    self.inputs = []
    self.colocate = []  # names of the nodes it is colocated with
    self.in_types = []  # [(arg name, dtype)] per input, flat
    self.out_types = []
    self.out_offsets = {}  # output arg name -> its first flat index

  @property
  def effective(self):
    """The device the op runs on under soft placement."""
    return _HostOf(self.device) if self.fallback else self.device

  def Memory(self, index, output):
    """'host' or 'device': where the input/output `index` lives."""
    types = self.out_types if output else self.in_types
    arg, dtype = types[index]
    if _DeviceType(self.effective) != _GPU:
      return _HOST
    if dtype in _ALWAYS_ON_HOST:
      return _HOST
    if self.op == '_Arg' or self.op == '_Retval':
      # Function arguments and results: int32 on the host (the _Arg and
      # _Retval kernels' host-memory int32 registrations).
      return _HOST if dtype == _INT32 else _DEVICE
    hostmem = self.attrs.get('_output_hostmem' if output else '_input_hostmem')
    if hostmem is not None and index in list(hostmem.list.i):
      return _HOST
    if self.kernel is None or self.op in _FUNCTION_CALL_OPS:
      return _HOST if dtype == _INT32 else _DEVICE
    return _HOST if arg in self.kernel.host_memory_arg else _DEVICE


def _WithDefaults(node_def, op_def):
  attrs = dict(node_def.attr)
  if op_def is not None:
    for attr in op_def.attr:
      if attr.name not in attrs and attr.HasField('default_value'):
        attrs[attr.name] = attr.default_value
  return attrs


def _ArgTypes(args, attrs):
  """[(arg name, dtype)] of an op's inputs or outputs, flat."""
  flat = []
  for arg in args:
    if arg.number_attr:
      count = attrs[arg.number_attr].i if arg.number_attr in attrs else 0
      dtype = arg.type or (attrs[arg.type_attr].type
                           if arg.type_attr in attrs else 0)
      flat += [(arg.name, dtype)] * count
    elif arg.type_list_attr:
      value = attrs.get(arg.type_list_attr)
      flat += [(arg.name, t) for t in (value.list.type if value else [])]
    else:
      dtype = arg.type or (attrs[arg.type_attr].type
                           if arg.type_attr in attrs else 0)
      flat.append((arg.name, dtype))
  # Reference types (old-style variables) live where their base type does.
  return [(name, t - 100 if t > 100 else t) for name, t in flat]


def _TypeAttrs(node):
  """'T=int64, Tidx=int32': the node's type attributes, for the report."""
  if node.op_def is None:
    return ''
  parts = []
  for attr in node.op_def.attr:
    if attr.type not in ('type', 'list(type)') or attr.name not in node.attrs:
      continue
    names = [tf.as_dtype(t).name for t in _Types(node.attrs[attr.name])
             if t]
    if attr.type == 'type':
      parts.append('%s=%s' % (attr.name, names[0] if names else '?'))
    elif names:
      parts.append('%s=[%s]' % (attr.name, ','.join(sorted(set(names)))))
  return ', '.join(parts)


def Layer(name):
  """The layer an op belongs to: its name scope, without how it was made.

  Args:
    name: an op name, e.g. 'gradients/recompute/stack_0/conv/Conv2D_grad/x'.

  Returns:
    'stack_0/conv': the scopes 'gradients', 'recompute', the call scopes and
    the gradient scopes of single ops ('Conv2D_grad', named after the
    forward op) dropped; '' at top level.
  """
  return '/'.join(p for p in name.split('/')[:-1]
                  if p and not _NOISE_SCOPES.match(p) and
                  not p.endswith('_grad'))


class _Body:
  """The nodes of the graph or of one function body at one call device."""

  def __init__(self, label, node_defs, device, library, function=None):
    self.label = label
    self._functions = library
    self.nested = None  # (function, call device, label) of its calls
    self.nodes = {}
    signature = function.signature if function is not None else None
    # A function's arguments and results, as the _Arg and _Retval nodes
    # TensorFlow adds on the call's device when it runs the body.
    for arg in (signature.input_arg if signature is not None else []):
      node = _Node(arg.name, '_Arg', {}, device)
      node.out_types = _ArgTypes([arg], {})
      node.out_offsets = {arg.name: 0}
      self.nodes[arg.name] = node
    for arg in (signature.output_arg if signature is not None else []):
      node = _Node('%s/_Retval' % arg.name, '_Retval', {}, device)
      node.in_types = _ArgTypes([arg], {})
      node.inputs = [function.ret[arg.name]]
      self.nodes[node.name] = node
    for node_def in node_defs:
      self._Add(node_def, device, library)
    self._Colocate()
    for node in self.nodes.values():
      self._Place(node)

  def _Add(self, node_def, device, library):
    if node_def.op in library:
      op_def = library[node_def.op].signature
    else:
      op_def = tf_internal.OpDef(node_def.op)
    attrs = _WithDefaults(node_def, op_def)
    node = _Node(node_def.name, node_def.op, attrs,
                 _Merge(device, node_def.device), op_def)
    node.inputs = [i for i in node_def.input if not i.startswith('^')]
    node.colocate = [
        c.decode()[len('loc:@'):] for c in attrs['_class'].list.s
        if c.startswith(b'loc:@')
    ] if '_class' in attrs and not node_def.device else []
    if op_def is not None:
      node.in_types = _ArgTypes(op_def.input_arg, attrs)
      node.out_types = _ArgTypes(op_def.output_arg, attrs)
      offset = 0
      for arg in op_def.output_arg:
        node.out_offsets[arg.name] = offset
        offset += len(_ArgTypes([arg], attrs))
    self.nodes[node.name] = node

  def _Colocate(self):
    """Unplaced nodes colocated with a placed one ('_class') go there."""
    for node in self.nodes.values():
      for other in node.colocate:
        if other in self.nodes and self.nodes[other].device:
          node.device = self.nodes[other].device
          break

  def _Place(self, node):
    if node.op in ('_Arg', '_Retval') or _DeviceType(node.device) != _GPU:
      return
    if node.op_def is None:
      return
    if node.op in self._functions:
      return  # A direct function call: its body is audited.
    node.kernel = GpuKernel(node.op, node.attrs)
    node.fallback = node.kernel is None and bool(_Kernels(node.op))

  def Producer(self, ref):
    """(node, flat output index) of an input reference, or (None, None)."""
    parts = ref.split(':')
    node = self.nodes.get(parts[0])
    if node is None:
      return None, None
    if len(parts) == 1:
      return node, 0
    if len(parts) == 2:  # GraphDef: 'node:3'
      return node, int(parts[1])
    # FunctionDef: 'node:output_arg:3'.
    return node, node.out_offsets.get(parts[1], 0) + int(parts[2])


def _FunctionRefs(node, library):
  """The library functions a node calls (attrs 'f', 'body', 'branches'...)."""
  names = [node.op] if node.op in library else []
  for value in node.attrs.values():
    kind = value.WhichOneof('value')
    if kind == 'func':
      names.append(value.func.name)
    elif kind == 'list':
      names += [f.name for f in value.list.func]
  return [n for n in names if n in library]


def _StageMatch(name):
  """The innermost stage task scope of an op name (a regex match) or None."""
  matches = list(_STAGE_SCOPE.finditer(name + '/'))
  return matches[-1] if matches else None


def _CallLabel(call_name, parent):
  """Where a called function's ops are, for the report.

  Args:
    call_name: the call op's name.
    parent: the label of the body the call is in.

  Returns:
    'stage1 B' for the executor's stage calls (the innermost stage scope of
    the name: a backward call's name holds its forward's too), else the
    parent's label, or for a call in the graph itself its scope
    ('weights_fork' for the gradient accumulation's calls).
  """
  match = _StageMatch(call_name)
  if match:
    return 'stage%s %s' % (match.group(1), match.group(2))
  if parent != GRAPH:
    return parent
  scope = Layer(call_name).split('/')[-1]
  return re.sub(r'_\d+$', '', scope) or GRAPH


def _MicroBatch(call_name):
  match = _StageMatch(call_name)
  if match and match.group(3) and match.group(3).isdigit():
    return int(match.group(1)), int(match.group(3))
  return None


class _Auditor:
  """Walks the graph and the functions it calls; collects Findings."""

  def __init__(self, graph_def):
    self.library = {f.signature.name: f for f in graph_def.library.function}
    self.bodies = {}  # (function, device, label) -> _Body
    self.multiplicity = collections.Counter()
    self.findings = []
    self.stages = collections.defaultdict(set)
    self.micro_batches = collections.defaultdict(set)
    self.num_ops = collections.Counter()
    self.predicates = []  # (body key, GPU) of each predicate copy
    self.unchecked = collections.defaultdict(set)
    outer = _Body(GRAPH, graph_def.node, '', self.library)
    self._Visit(None, outer, 1)

  def _Body(self, function, device, label):
    key = (function, device, label)
    if key not in self.bodies:
      fdef = self.library[function]
      self.bodies[key] = _Body(label, fdef.node_def, device, self.library,
                               fdef)
    return self.bodies[key]

  def _Visit(self, key, body, calls):
    """Counts `calls` more runs of `body` and of the bodies it calls."""
    if key:
      self.multiplicity[key] += calls
    if body.nested is None:  # The first visit: check it, find its calls.
      body.nested = []
      for node in body.nodes.values():
        for function in _FunctionRefs(node, self.library):
          stage = _MicroBatch(node.name)
          if stage and _DeviceType(node.device) == _GPU:
            self.micro_batches[node.device].add(stage)
          body.nested.append(
              (function, node.device, _CallLabel(node.name, body.label)))
      self._Check(key, body)
    for inner_key in body.nested:
      self._Visit(inner_key, self._Body(*inner_key), calls)

  def _Check(self, key, body):
    """The findings of one body (once; their calls are counted later)."""
    for node in body.nodes.values():
      if _DeviceType(node.device) == _GPU and node.op not in ('_Arg',
                                                              '_Retval'):
        self.num_ops[node.device] += 1
        if node.op_def is None:
          self.unchecked[node.device].add(node.op)
        match = re.match(r'stage(\d+) ', body.label)
        if match:
          self.stages[node.device].add(int(match.group(1)))
      if node.fallback:
        lingvo = node.op in LingvoOps()
        self._Add(key, body.label, LINGVO_OP if lingvo else NO_GPU_KERNEL,
                  node.device, node.name, node.op, _TypeAttrs(node),
                  Layer(node.name),
                  'runs on %s (soft placement); hard placement fails%s' % (
                      _Short(node.effective),
                      ': the installed Lingvo registers it for CPU only'
                      if lingvo else ''))
    copied = set()
    for node in body.nodes.values():
      for index, ref in enumerate(node.inputs):
        producer, out = body.Producer(ref)
        if (producer is None or out >= len(producer.out_types) or
            index >= len(node.in_types)):
          continue
        self._Edge(key, body, producer, out, node, index, copied)

  def _Edge(self, key, body, producer, out, consumer, index, copied):
    dtype = producer.out_types[out][1]
    src, dst = producer.effective, consumer.effective
    if not src or not dst or dtype in _ALWAYS_ON_HOST:
      return
    src_type, dst_type = _DeviceType(src), _DeviceType(dst)
    if {src_type, dst_type} != {'CPU', _GPU} and src_type != dst_type:
      return
    label = body.label
    if key is None:
      stage = _StageMatch(consumer.name) or _StageMatch(producer.name)
      if not stage:
        # In the graph itself only the stage tasks' ops run per
        # micro-batch; the rest (the split before the stages, the merge
        # after them, the loss) hands the whole batch over once per step,
        # by design.
        return
      label = 'stage%s %s' % (stage.group(1), stage.group(2))
    src_mem = producer.Memory(out, output=True)
    dst_mem = consumer.Memory(index, output=False)
    tensor = '%s:%d' % (producer.name, out)
    if src_type != dst_type:
      # The GPU side's memory decides whether a device copy happens: an
      # int32 a GPU kernel keeps on the host moves host to host.
      gpu, gpu_mem = (src, src_mem) if src_type == _GPU else (dst, dst_mem)
      if gpu_mem == _HOST and _HostOf(gpu) == _HostOf(
          dst if gpu == src else src):
        return
      if (tensor, dst, dst_mem) in copied:
        return
      copied.add((tensor, dst, dst_mem))
      self._Add(key, label, HOST_CROSSING, gpu, tensor, producer.op,
                tf.as_dtype(dtype).name, Layer(consumer.name),
                '%s %s -> %s %s (%s)' % (
                    _Short(src), producer.op, _Short(dst), consumer.op,
                    consumer.name))
      return
    if src_type != _GPU or src != dst or src_mem == dst_mem:
      return
    if (tensor, dst, dst_mem) in copied:
      return
    copied.add((tensor, dst, dst_mem))
    if consumer.in_types[index][0] == _PREDICATES.get(consumer.op):
      self.predicates.append((key, src))
      return
    self._Add(key, label, HOST_MEMORY, src, tensor, producer.op,
              tf.as_dtype(dtype).name, Layer(consumer.name),
              '%s memory -> %s memory of %s (%s)' % (
                  src_mem, dst_mem, consumer.op, consumer.name))

  def _Add(self, key, label, kind, device, node, op, dtype, layer, detail):
    self.findings.append((key, Finding(kind, device, label, node, op, dtype,
                                       layer, detail, 0)))

  def Result(self):
    findings = []
    for key, f in self.findings:
      findings.append(f._replace(calls=self.multiplicity[key] if key else 1))
    findings.sort(key=lambda f: (f.device, f.stage, KINDS.index(f.kind),
                                 f.node))
    predicates = collections.Counter()
    for key, device in self.predicates:
      predicates[device] += self.multiplicity[key] if key else 1
    devices = {}
    for device in sorted(set(self.num_ops) | {f.device for f in findings}):
      devices[device] = DeviceSummary(
          stages=sorted(self.stages.get(device, ())),
          num_ops=self.num_ops.get(device, 0),
          micro_batches=len({m for _, m in self.micro_batches.get(device, ())}),
          predicates=predicates.get(device, 0),
          unchecked=sorted(self.unchecked.get(device, ())))
    return AuditResult(findings, devices)


def _Short(device):
  """'task 1 GPU:0' (or 'GPU:0' without a task) for the report."""
  spec = tf.DeviceSpec.from_string(device)
  short = '%s:%s' % (spec.device_type, spec.device_index or 0)
  return short if spec.task is None else 'task %d %s' % (spec.task, short)


def Audit(graph):
  """Finds what leaves the GPUs in `graph` (see the module doc).

  Args:
    graph: a tf.Graph or a GraphDef (with its function library), its stages
      placed on GPU devices; nothing is run.

  Returns:
    An AuditResult.
  """
  graph_def = graph.as_graph_def() if isinstance(graph, tf.Graph) else graph
  return _Auditor(graph_def).Result()


_COLUMNS = (('kind', 'kind'), ('stage', 'where'), ('op', 'type'),
            ('dtype', 'dtype'), ('layer', 'layer'), ('node', 'op name'),
            ('calls', 'calls'), ('detail', 'detail'))


def _Table(rows):
  """Lines of a left-aligned table; rows[0] is the header."""
  widths = [max(len(str(row[i])) for row in rows)
            for i in range(len(rows[0]) - 1)]
  return ['  '.join([str(c).ljust(w) for c, w in zip(row, widths)] +
                    [str(row[-1])]).rstrip() for row in rows]


def Report(result, max_rows=None):
  """The audit as text: a line per GPU, then a table of its findings.

  Args:
    result: Audit's AuditResult.
    max_rows: print at most this many findings per GPU (None: all).

  Returns:
    A list of lines. The first says what was assumed and the totals; each
    GPU's line names its stages, ops, findings and the host-device copies a
    step (and a micro-batch) makes.
  """
  counts = result.Counts()
  total = sum(counts.values())
  lines = ['GPU audit: %d GPU(s), %s (from the kernel registry, nothing run; '
           'soft placement as the trainer sets it)' % (
               len(result.devices),
               ', '.join('%d %s' % (counts[k], k) for k in KINDS)
               if total else 'no findings')]
  by_device = collections.defaultdict(list)
  for f in result.findings:
    by_device[f.device].append(f)
  for device, summary in result.devices.items():
    found = by_device.get(device, [])
    copies = sum(f.calls for f in found if f.kind in (HOST_CROSSING,
                                                      HOST_MEMORY))
    stages = ('stage%s %s' % ('s' if len(summary.stages) > 1 else '',
                              ', '.join(map(str, summary.stages)))
              if summary.stages else 'no stage calls')
    line = '%s (%s, %d ops): ' % (device, stages, summary.num_ops)
    notes = ''
    if summary.predicates:
      notes += ('; %d control-flow predicate(s) per step read on the host '
                '(by design)' % summary.predicates)
    if summary.unchecked:
      notes += ('; not checked, no op definition in this process (load '
                'their library before auditing): %s' %
                ', '.join(summary.unchecked))
    if not found:
      lines.append(line + 'none' + notes)
      continue
    line += '%d finding(s); host-GPU copies per step: %d' % (len(found),
                                                            copies)
    if summary.micro_batches and copies:
      line += ' (%.3g per micro-batch of %d)' % (
          copies / summary.micro_batches, summary.micro_batches)
    lines.append(line + notes)
    shown = found if max_rows is None else found[:max_rows]
    rows = [[title for _, title in _COLUMNS]]
    rows += [[getattr(f, field) for field, _ in _COLUMNS] for f in shown]
    lines += ['  ' + row for row in _Table(rows)]
    if len(shown) < len(found):
      lines.append('  ... %d more (gpipe.measure.gpu_audit.Audit lists them '
                   'all)' % (len(found) - len(shown)))
  return lines
