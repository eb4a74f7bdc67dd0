"""Every private TensorFlow call the library makes, in one place.

The executor builds graphs below TensorFlow's public API in four ways:

* ``SetGradientFunction``: a stage's call op gets its own gradient function
  (the backward task, or the split B and W tasks), through the op's
  ``_gradient_function`` attribute that ``tf.gradients`` reads first;
* ``CreateOp``: the split backward copies a traced op into a new function
  graph with its attributes and op_def (``Graph._create_op_internal``);
* ``AddFunction``: that graph needs the functions the copied ops call
  (``Graph._add_function``), listed by ``GraphFunctions``;
* ``AddControlInput``: the task registry chains ops that already exist
  (``Operation._add_control_input``), since tasks are created before their
  neighbours in the schedule's order.

The XLA option of the stages (``gpipe.xla``) asks which ops XLA can compile:
``XlaKernels`` reads the kernel registry (``tensorflow.python.framework.
kernels``) after registering XLA's JIT kernels there
(``tensorflow.python.util.pywrap_xla_ops``: they are registered lazily, at
the first XLA compilation, and the registry lists none before), and
``FunctionDefinition`` reads a nested function's ops.

And a worker lists its devices with ``LocalDevices``
(``tensorflow.python.client.device_lib``), which has no public equivalent
that takes a session config.

The GPU audit (gpipe/measure/gpu_audit.py) reads the kernel registry with
``RegisteredKernels`` (``tensorflow.python.framework.kernels``: every op's
kernels per device type with their dtype constraints, also in a process
without a GPU), op definitions with ``OpDef`` (``op_def_registry``) and the
ops a custom-op library defines with ``LibraryOps``
(the C API's ``TF_LoadLibrary``/``TF_GetOpList``, which ``tf.load_op_library``
calls without returning the list).

``//tests:tf_internal_test`` exercises each on the installed TensorFlow, so a
version that renames or changes one fails there, loudly and by name, not deep
inside a pipeline.
"""

import tensorflow as _tf
from tensorflow.core.framework import op_def_pb2 as _op_def_pb2
from tensorflow.python.client import device_lib as _device_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import kernels as _kernels  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.client import pywrap_tf_session as _pywrap_tf_session  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import op_def_registry as _op_def_registry  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops as _tf_ops  # pylint: disable=g-direct-tensorflow-import


def _Missing(internal):
  """The error for an internal this TensorFlow does not have."""
  return RuntimeError(
      'TensorFlow %s has no %s, a private API gpipe relies on '
      '(gpipe/compat/tf_internal.py); install the TensorFlow version of '
      'third_party/requirements.txt, or port that module to this version' %
      (_tf.__version__, internal))


def SetGradientFunction(op, fn):
  """Makes tf.gradients call fn(op, *output_grads) for `op`."""
  op._gradient_function = fn  # pylint: disable=protected-access


def GetGradientFunction(op):
  """TensorFlow's registered gradient function of `op` (e.g. of a call)."""
  return _tf_ops.get_gradient_function(op)


def CreateOp(graph, op_type, inputs, dtypes, name, attrs, op_def):
  """A new op in `graph` from an existing op's type, attributes and op_def."""
  return graph._create_op_internal(  # pylint: disable=protected-access
      op_type, inputs, dtypes=dtypes, name=name, attrs=attrs, op_def=op_def)


def GraphFunctions(graph):
  """The graph functions defined in `graph` (name -> function).

  Args:
    graph: a tf.Graph.

  Returns:
    A new dict from function name to function.

  Raises:
    RuntimeError: this TensorFlow's graphs have no ``_functions``; the
      message names the TensorFlow version.
  """
  if not hasattr(graph, '_functions'):
    raise _Missing('Graph._functions (the functions defined in a graph)')
  return dict(graph._functions)  # pylint: disable=protected-access


def AddFunction(graph, fn):
  """Defines function `fn` (from another graph) in `graph`."""
  graph._add_function(fn)  # pylint: disable=protected-access


def AddControlInput(op, control):
  """Makes existing `op` run after existing op `control`."""
  op._add_control_input(control)  # pylint: disable=protected-access


def LocalDevices(config):
  """The devices this process would have under session config `config`.

  Args:
    config: a tf.compat.v1.ConfigProto (e.g. its CPU device count).

  Returns:
    DeviceAttributes protos, each with ``name`` and ``device_type``.
  """
  return _device_lib.list_local_devices(config)


_XLA_KERNELS_REGISTERED = []


def XlaKernels(jit_device, op_type):
  """The kernels XLA has for ops of `op_type` on `jit_device`.

  Args:
    jit_device: 'XLA_CPU_JIT' or 'XLA_GPU_JIT'.
    op_type: an op type, e.g. 'MatMul'.

  Returns:
    A list of KernelDef protos (their ``constraint`` lists the dtypes each
    takes); empty if XLA cannot compile the op there.
  """
  if not _XLA_KERNELS_REGISTERED:
    # Imported here: only pipelines that compile need it.
    from tensorflow.python.util import pywrap_xla_ops  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
    # Registers every XLA JIT kernel in the global registry (both lists).
    pywrap_xla_ops.get_cpu_kernel_names()
    pywrap_xla_ops.get_gpu_kernel_names()
    _XLA_KERNELS_REGISTERED.append(True)
  return [k for k in _kernels.get_registered_kernels_for_op(op_type).kernel
          if k.device_type == jit_device]


def FunctionDefinition(fn):
  """The FunctionDef proto of a graph function (a GraphFunctions value)."""
  return fn.definition
def RegisteredKernels(op_type):
  """The KernelDefs registered for op `op_type` on every device type.

  Args:
    op_type: an op name, e.g. 'MatMul'.

  Returns:
    A list of KernelDef protos (device_type, constraint, host_memory_arg,
    label); empty for an op without kernels (or no op of that name).
  """
  try:
    return list(_kernels.get_registered_kernels_for_op(op_type).kernel)
  except _tf.errors.NotFoundError:
    return []


def OpDef(op_type):
  """The registered OpDef of op `op_type`, or None (no such op loaded)."""
  return _op_def_registry.get(op_type)


def LibraryOps(path):
  """The OpDefs a custom-op library defines (loading it, if not yet loaded).

  TensorFlow loads a library once per path: a library already loaded (e.g.
  by ``tf.load_op_library``) is not loaded again.

  Args:
    path: the library's .so file.

  Returns:
    A list of OpDef protos.
  """
  handle = _pywrap_tf_session.TF_LoadLibrary(path)
  return list(_op_def_pb2.OpList.FromString(
      _pywrap_tf_session.TF_GetOpList(handle)).op)
