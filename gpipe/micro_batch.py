"""Splitting a mini-batch into micro-batches and gathering it back.

Inputs may be a tensor, a tuple/list of tensors or a (nested) NestedMap; every
tensor is split along the same batch dimension, which must be static: the
stage functions are traced once for a fixed micro-batch shape. ``None``
entries (an optional input left out, as Lingvo layers take them) stay ``None``
in every micro-batch and in the merged output.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf


def StaticBatchSize(inputs, batch_dim):
  """The common static batch size of all tensors in `inputs`.

  Args:
    inputs: a nest of tensors.
    batch_dim: the batch dimension of every tensor.

  Returns:
    The batch size, an int.

  Raises:
    ValueError: no tensors, a tensor of too low rank, an unknown static batch
      size, or tensors that disagree on it.
  """
  flat = Present(inputs)
  if not flat:
    raise ValueError('the pipeline got no input tensors (only None entries)')
  sizes = {}
  for t in flat:
    if t.shape.rank is None or t.shape.rank <= batch_dim:
      raise ValueError(
          'input %s has shape %s: it has no batch dimension %d; every input '
          'of a pipeline is split into micro-batches along batch_dim' %
          (t.name, t.shape, batch_dim))
    size = t.shape[batch_dim]
    if size is None:
      raise ValueError(
          'input %s has an unknown static batch size (shape %s). The pipeline '
          'traces each stage once for a fixed micro-batch shape: give the '
          'input a static batch dimension (e.g. batch with drop_remainder=True'
          ' or tf.ensure_shape).' % (t.name, t.shape))
    sizes[t.name] = size
  if len(set(sizes.values())) > 1:
    raise ValueError('pipeline inputs disagree on the batch size along '
                     'dimension %d: %s' % (batch_dim, sizes))
  return next(iter(sizes.values()))


def Present(nest):
  """The tensors of `nest` in flatten order, leaving out its None entries."""
  return [t for t in tf.nest.flatten(nest) if t is not None]


def Repack(nest, tensors):
  """`nest` with its non-None leaves replaced by `tensors` (as `Present`)."""
  tensors = iter(tensors)
  return tf.nest.pack_sequence_as(
      nest, [None if t is None else next(tensors)
             for t in tf.nest.flatten(nest)])


def _PerPipeline(batch_size, num_micro_batches=None, micro_batch_size=None):
  """M of one pipeline from `num_micro_batches` and/or `micro_batch_size`.

  Either may be given, or both when they agree (num_micro_batches x
  micro_batch_size == batch_size), as Lingvo's PipeliningLayer accepts.

  Args:
    batch_size: the static mini-batch size.
    num_micro_batches: M, or None.
    micro_batch_size: examples per micro-batch, or None.

  Returns:
    M, an int.

  Raises:
    ValueError: neither given, or a count that does not divide the batch, or
      both given and disagreeing.
  """
  if num_micro_batches and micro_batch_size:
    if num_micro_batches * micro_batch_size != batch_size:
      raise ValueError(
          'num_micro_batches=%d and micro_batch_size=%d disagree with the '
          'batch of %d (%d x %d != %d): set one of them, or both so that '
          'their product is the batch' %
          (num_micro_batches, micro_batch_size, batch_size,
           num_micro_batches, micro_batch_size, batch_size))
    return num_micro_batches
  if not (num_micro_batches or micro_batch_size):
    raise ValueError(
        'set num_micro_batches or micro_batch_size (got '
        'num_micro_batches=%s, micro_batch_size=%s)' %
        (num_micro_batches, micro_batch_size))
  if micro_batch_size:
    if micro_batch_size < 1 or batch_size % micro_batch_size:
      raise ValueError(
          'batch %d is not divisible by micro_batch_size %d: choose a '
          'micro-batch size that divides the batch' %
          (batch_size, micro_batch_size))
    return batch_size // micro_batch_size
  if num_micro_batches < 1 or batch_size % num_micro_batches:
    raise ValueError(
        'batch %d is not divisible by %d micro-batches: choose a number of '
        'micro-batches that divides the batch (or set micro_batch_size)' %
        (batch_size, num_micro_batches))
  return num_micro_batches


def NumMicroBatches(batch_size, num_micro_batches=None, micro_batch_size=None,
                    num_replicas=1):
  """R x M: the micro-batches of the whole mini-batch over all replicas.

  Either count may be given, or both when they agree (num_micro_batches x
  micro_batch_size == batch_size / R), as Lingvo's PipeliningLayer accepts.

  Args:
    batch_size: N, the mini-batch's static batch size.
    num_micro_batches: M per replica (p.num_micro_batches), or None.
    micro_batch_size: examples per micro-batch, or None.
    num_replicas: R data-parallel replicas (``gpipe.replicas``).

  Returns:
    The total number of micro-batches, a multiple of R.

  Raises:
    ValueError: N not divisible by R x M (or by R x micro_batch_size).
  """
  if num_replicas == 1:
    return _PerPipeline(batch_size, num_micro_batches, micro_batch_size)
  if num_micro_batches and micro_batch_size:
    if num_replicas * num_micro_batches * micro_batch_size != batch_size:
      raise ValueError(
          '%d replicas x num_micro_batches=%d x micro_batch_size=%d != '
          'batch %d: set one of them, or both so that R x M x size is the '
          'batch' % (num_replicas, num_micro_batches, micro_batch_size,
                     batch_size))
    return num_replicas * num_micro_batches
  if micro_batch_size and not num_micro_batches:
    if batch_size % (num_replicas * micro_batch_size):
      raise ValueError(
          'batch %d is not divisible by R x micro_batch_size = %d x %d: '
          'each of the %d replicas takes an equal share of whole '
          'micro-batches; choose a batch size that is a multiple of %d' %
          (batch_size, num_replicas, micro_batch_size, num_replicas,
           num_replicas * micro_batch_size))
    return batch_size // micro_batch_size
  per_replica = _PerPipeline(batch_size, num_micro_batches, micro_batch_size)
  total = num_replicas * per_replica
  if batch_size % total:
    raise ValueError(
        'batch %d is not divisible by R x M = %d replicas x %d '
        'micro-batches = %d: choose a batch size that is a multiple of %d, '
        'or another number of micro-batches or replicas' %
        (batch_size, num_replicas, per_replica, total, total))
  return total


def _SplitOne(t, num_micro_batches, batch_dim):
  """The M parts of tensor `t` along `batch_dim`."""
  if t.dtype.is_floating or t.dtype.is_complex:
    return tf.split(t, num_micro_batches, axis=batch_dim)
  # TensorFlow's GPU Split kernel takes floats only: an integer or bool
  # tensor (token ids, labels) split on a GPU would fall back to the host
  # (or fail under hard placement). Slices run on the GPU for every dtype.
  size = StaticBatchSize([t], batch_dim) // num_micro_batches
  begin = [0] * t.shape.rank
  shape = [-1] * t.shape.rank
  shape[batch_dim] = size
  parts = []
  for m in range(num_micro_batches):
    begin[batch_dim] = m * size
    parts.append(tf.slice(t, list(begin), list(shape)))
  return parts


def Split(inputs, num_micro_batches, batch_dim):
  """Splits every tensor of `inputs`: a list of M nests like `inputs`."""
  flat = tf.nest.flatten(inputs)
  if num_micro_batches == 1:
    return [inputs]
  parts = [None if t is None else _SplitOne(t, num_micro_batches, batch_dim)
           for t in flat]
  return [
      tf.nest.pack_sequence_as(inputs,
                               [None if p is None else p[m] for p in parts])
      for m in range(num_micro_batches)
  ]


def Merge(micro_batches, batch_dim):
  """Concatenates a list of M nests of tensors back into one nest."""
  if len(micro_batches) == 1:
    return micro_batches[0]
  flats = [tf.nest.flatten(mb) for mb in micro_batches]
  merged = [
      None if flats[0][i] is None else
      tf.concat([f[i] for f in flats], axis=batch_dim)
      for i in range(len(flats[0]))
  ]
  return tf.nest.pack_sequence_as(micro_batches[0], merged)
