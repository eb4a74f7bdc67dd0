"""Weight gradients summed across micro-batches, as their tasks finish.

Every micro-batch's call of a stage reads the stage's weights, so
``tf.gradients`` has M weight gradients per variable to add. Given one theta
tensor read by all M calls, it would add them with one ``add_n`` that waits
for the last: M gradient copies of the stage's weights alive at once.
Instead each micro-batch reads its own *view* of theta, and the views form a
chain that ends at the micro-batch whose weight-gradient task runs first::

    theta -> fork -> fork -> ... -> fork -> view of o[0]
               |       |              |
      view of o[M-1]  view of o[M-2]  view of o[1]

(o: the micro-batches in the order their weight-gradient tasks run). The
gradient of a fork is its two inputs' gradients added, so the gradient
flowing up the chain is a running sum in that order: one running sum per
stage, each micro-batch's gradient added as soon as its task is done.

A fork is one call of a small graph function (identity forward; its
gradient one call that adds all of the stage's weight gradients), not one
op per variable: a stage of V variables adds 2 ops to the session graph
per micro-batch instead of V ``add_n`` ops and an ``IdentityN``. The session
graph (which the master optimizes, partitions and sends to the workers)
then grows with stages x micro-batches, not with variables x micro-batches.
Identities forward their buffers: the forward pass copies nothing.
"""

import weakref

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import precision
from gpipe.compat import tf_internal
from lingvo import compat as tf

# Kept whole: an inlined fork would be V ops per micro-batch again.
_NO_INLINE = {'_noinline': True}

# graph -> {signature: concrete function}: forks and adders are traced once
# per graph and shape signature, whatever the number of calls.
_TRACED = weakref.WeakKeyDictionary()


def _Signature(tensors):
  return tuple((t.dtype, tuple(t.shape.as_list())) for t in tensors)


def _Traced(kind, tensors, make):
  """The graph's concrete function `kind` for `tensors`, traced on first use."""
  cache = _TRACED.setdefault(tf.compat.v1.get_default_graph(), {})
  key = (kind, _Signature(tensors))
  if key not in cache:
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
    # Traced with no device or colocation: the body runs where its call is
    # placed, so stages on other devices share it.
    with tf.device(None), tf.compat.v1.colocate_with(None,
                                                     ignore_existing=True):
      cache[key] = tf.function(
          make, autograph=False,
          experimental_attributes=_NO_INLINE).get_concrete_function(specs)
  return cache[key]


def _Flat(outputs):
  return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _Fork(flat, device):
  """(passed on, view): two identities of `flat`, one call op."""
  n = len(flat)
  fork = _Traced('fork', flat, lambda xs: [tf.identity(x) for x in xs] +
                 [tf.identity(x) for x in xs])
  with tf.device(device), tf.name_scope('weights_fork'):
    outs = _Flat(fork(flat))
  call = outs[0].op

  def Gradient(unused_op, *grads):
    """The gradients of both outputs, added (one call op)."""
    passed, view = grads[:n], grads[n:]
    summed = list(passed)
    both = [i for i in range(n)
            if passed[i] is not None and view[i] is not None]
    for i in range(n):
      if passed[i] is None:
        summed[i] = view[i]
    if both:
      pairs = [passed[i] for i in both] + [view[i] for i in both]
      half = len(both)
      add = _Traced('add', pairs,
                    lambda xs: [a + b for a, b in zip(xs[:half], xs[half:])])
      with tf.device(device):
        added = _Flat(add(pairs))
      for i, t in zip(both, added):
        summed[i] = t
    return summed

  tf_internal.SetGradientFunction(call, Gradient)
  return outs[:n], outs[n:]


def AccumulationViews(theta, backward_order, device, low_dtypes=None):
  """Per-micro-batch views of a stage's theta that sum gradients in order.

  Args:
    theta: the stage's NestedMap of theta tensors (read on `device`).
    backward_order: the micro-batches in the order their weight-gradient
      tasks run.
    device: the stage's device.
    low_dtypes: optional, theta's structure: the dtype (bfloat16) each leaf
      is computed in, or None (see gpipe.precision). Such leaves are cast
      once; each view hands the cast to its call and its gradient, cast to
      float32, to the float32 chain: the running sum stays float32.

  Returns:
    A list: the theta view of each micro-batch index.
  """
  flat = theta.Flatten()
  views = [None] * len(backward_order)
  with tf.device(device):
    low = [None] * len(flat)
    if low_dtypes is not None:
      low = [None if d is None else tf.cast(t, d)
             for t, d in zip(flat, low_dtypes.Flatten())]
    mixed = [i for i, d in enumerate(low) if d is not None]
    for j, m in enumerate(reversed(backward_order)):
      if flat and j < len(backward_order) - 1:
        flat, view = _Fork(flat, device)
      else:
        # The end of the chain: the micro-batch whose task runs first.
        view = list(flat)
      attached = precision.AttachLowPrecision([view[i] for i in mixed],
                                              [low[i] for i in mixed])
      for i, t in zip(mixed, attached):
        view[i] = t
      views[m] = theta.Pack(view)
  return views
