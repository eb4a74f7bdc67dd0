"""Per-micro-batch randomness that the recomputed forward pass reproduces.

GPipe recomputes each stage's forward pass during the backward pass. Dropout and
drop path must then draw exactly the same masks as in the first forward pass,
while different micro-batches must draw different masks. Stateful random ops
cannot do that, so every random op in a pipelined layer is *stateless*, seeded
from:

  * the micro-batch seed, a ``[2]`` int64 tensor the pipeline passes into each
    stage call (derived from the global step, so masks change every step, and
    the micro-batch index);
  * a stable per-call key: a CRC of the layer path plus a call counter, so two
    dropout layers (or two calls of one layer) in a stage differ.

Usage inside a layer's FProp::

    y = randomness.Dropout(x, keep_prob=0.9, key=self.path)

The pipeline opens ``MicroBatchSeedScope(seed)`` around each traced stage.
Unpipelined reference code opens the same scope around each micro-batch to
reproduce the pipelined masks exactly. Outside any scope, ``Dropout`` falls back
to ordinary (stateful) dropout, which is what plain Lingvo training would do.

The scope also resets Lingvo's step seed (``py_utils.ResetStepSeed``), so
Lingvo's deterministic layers (e.g. ``layers.DeterministicDropoutLayer``) get
the same per-micro-batch, recompute-stable behaviour.
"""

import contextlib
import zlib

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import thread_stack
from lingvo import compat as tf
from lingvo.core import py_utils

_SCOPES = thread_stack.ThreadLocalStack()


class _Scope:
  """An open seed scope: the seed tensor and a counter of random calls."""

  def __init__(self, seed):
    self.seed = seed
    self.calls = {}

  def NextOffset(self, key):
    count = self.calls.get(key, 0)
    self.calls[key] = count + 1
    # 31 bits keeps the sum inside int64 for any seed the pipeline makes.
    return zlib.crc32(('%s#%d' % (key, count)).encode('utf-8')) & 0x7fffffff


@contextlib.contextmanager
def MicroBatchSeedScope(seed):
  """Makes `seed` the micro-batch seed of the random ops created inside.

  Args:
    seed: an int64 tensor of shape [2], or a pair of Python ints.

  Yields:
    Nothing; random ops built in the block use the seed.
  """
  seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
  seed.shape.assert_is_compatible_with([2])
  with _SCOPES.Pushed(_Scope(seed)):
    py_utils.ResetStepSeed(seed[1])
    yield


def MicroBatchSeed(step, micro_batch, base_seed=0):
  """The seed the pipeline gives micro-batch `micro_batch` at `step`.

  Args:
    step: a scalar integer tensor (usually the global step) or int.
    micro_batch: the micro-batch index (int or scalar tensor).
    base_seed: a Python int mixed in (e.g. a layer's random_seed param).

  Returns:
    An int64 tensor of shape [2].
  """
  step = tf.cast(step, tf.int64)
  micro_batch = tf.cast(micro_batch, tf.int64)
  return tf.stack([step * 1000003 + base_seed, micro_batch * 7919 + base_seed])


def MicroBatchSeeds(step, micro_batches, base_seed=0):
  """MicroBatchSeed of each micro-batch index, the step's part made once.

  Args:
    step: a scalar integer tensor (usually the global step) or int.
    micro_batches: the micro-batch indices (Python ints).
    base_seed: a Python int mixed in.

  Returns:
    A list of int64 tensors of shape [2], equal to MicroBatchSeed's.
  """
  step_part = tf.cast(step, tf.int64) * 1000003 + base_seed
  return [tf.stack([step_part, tf.constant(m * 7919 + base_seed, tf.int64)])
          for m in micro_batches]


def CurrentSeed():
  """The innermost micro-batch seed, or None outside any scope."""
  scope = _SCOPES.Top()
  return scope.seed if scope else None


def SeedPair(key):
  """A fresh stateless seed pair for one random op keyed by `key`.

  Args:
    key: a string that identifies the calling layer (e.g. ``self.path``).

  Returns:
    An int64 [2] tensor, or None outside any MicroBatchSeedScope.
  """
  scope = _SCOPES.Top()
  if scope is None:
    return None
  return scope.seed + tf.constant([0, scope.NextOffset(key)], tf.int64)


_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: spreads consecutive counters.
_SECOND = 0x7F4A7C15  # Another odd constant: the second key's own start.
# Significand bits (with the implicit one) of the floats shorter than 24.
_MANTISSA_BITS = {tf.bfloat16: 8, tf.float16: 11}


def _U32(value):
  return tf.constant(value, tf.uint32)


class _Mixer:
  """MurmurHash3's 32-bit finalizer, its constants made once per generator.

  Every input bit flips each output bit with probability about one half
  (uint32 arithmetic wraps). A dropout builds six of these; sharing the
  four constants keeps the graph small (its build time is the cost).
  """

  def __init__(self):
    self._s16, self._s13 = _U32(16), _U32(13)
    self._m1, self._m2 = _U32(0x85EBCA6B), _U32(0xC2B2AE35)

  def __call__(self, h):
    xor, shift = tf.bitwise.bitwise_xor, tf.bitwise.right_shift
    h = xor(h, shift(h, self._s16)) * self._m1
    h = xor(h, shift(h, self._s13)) * self._m2
    return xor(h, shift(h, self._s16))


def _SeedWords(seed):
  """The four 32-bit words of an int64 [2] seed (all 64 bits of each)."""
  low = tf.cast(tf.bitwise.bitwise_and(seed, 0xFFFFFFFF), tf.uint32)
  high = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(seed, 32),
                                        0xFFFFFFFF), tf.uint32)
  return low[0], high[0], low[1], high[1]


def _Keys(words, mix):
  """Two independent 32-bit keys, each hashing all four seed words.

  Key a folds the words in the order 3, 2, 1, 0 from the start
  ``w3 + _GOLDEN``; key b in the order 0, 1, 2, 3 from ``w0 + _SECOND``.
  Both chains run side by side in one uint32 [2] vector (slices and stacks
  only: uint32 Reverse and Unpack have no GPU kernel).

  Args:
    words: the four uint32 scalar words of the seed.
    mix: a _Mixer.

  Returns:
    The uint32 scalars key_a, key_b.
  """
  w = words
  keys = mix(tf.stack([w[3], w[0]]) +
             tf.constant([_GOLDEN, _SECOND], tf.uint32))
  for i in (1, 2, 3):
    keys = mix(tf.bitwise.bitwise_xor(keys, tf.stack([w[3 - i], w[i]])))
  return keys[0], keys[1]


def StatelessUniform(shape, seed, dtype):
  """Uniform numbers in [0, 1) that are the same compiled or not, on any device.

  A counter-based generator written in plain integer ops: element i of the
  output hashes (i, seed) through MurmurHash3's finalizer, twice, with two
  32-bit keys that each hash all four words of the seed (two seeds collide
  only if both keys do), and keeps as many top bits as `dtype` holds
  exactly (24 for float32 and float64, 11 for float16, 8 for bfloat16), so
  every value is ``k / 2**bits`` and below 1.

  Why not ``tf.random.stateless_uniform``: XLA's kernels draw other numbers
  than TensorFlow's for the same seed and algorithm, and cut seeds to 32
  bits, so an XLA-compiled stage (``p.compile='xla'``) would drop other
  units than the uncompiled pipeline, and its losses would differ. These
  ops (uint32 multiply, xor, shift, an int64 range) mean the same in every
  TensorFlow kernel and in XLA, and have GPU kernels that keep their
  tensors in device memory; the shape and the counter's bounds are
  computed on the host, where a GPU's Range and Reshape read them (no
  host-device copy per random op: gpipe.measure.gpu_audit checks).
  Elements past 2**32 repeat the first ones' numbers. Quality is what
  dropout needs: uncorrelated across neighbouring elements and
  neighbouring seeds (tested), not cryptographic.

  The generator's ops are a graph function (``_Generator``), traced once
  per dtype and process: each draw adds a call op and a reshape to the
  graph, not the generator's ~110 ops (a graph build's cost grows with its
  ops, and an unpipelined model or a stage trace draws once per dropout
  layer and micro-batch). Called inside an XLA-compiled function, XLA
  compiles the call with it.

  Args:
    shape: the output shape (a list or an integer tensor).
    seed: an int64 [2] tensor.
    dtype: a float dtype.

  Returns:
    A tensor of `shape` uniform in [0, 1), in steps of 2**-24 (float32 and
    float64; coarser for 16-bit floats).
  """
  dtype = tf.as_dtype(dtype)
  shape = tf.cast(shape, tf.int32)
  on_gpu = tf.DeviceSpec.from_string(
      seed.op.device or '').device_type == 'GPU'
  flat = _Generator(dtype, on_gpu)(shape, tf.cast(seed, tf.int64))
  # Outside the function, so the result's static shape is inferred from
  # `shape` as before (a function's output shape is only its rank's).
  return tf.reshape(flat, shape)


# (dtype name, whether on a GPU) -> the generator's concrete function.
_GENERATORS = {}


def _Generator(dtype, on_gpu):
  """The concrete function (shape, seed) -> the flat uniform numbers.

  Args:
    dtype: the float dtype of the numbers.
    on_gpu: whether it is called on a GPU: the shape arithmetic is then
      placed on the host's CPU.

  Returns:
    A concrete function of an int32 [rank] shape and an int64 [2] seed
    (cached: one trace per process for each dtype and placement).
  """
  key = (dtype.name, on_gpu)
  if key not in _GENERATORS:

    def Draw(shape, seed):
      return _FlatUniform(shape, seed, dtype, on_gpu)

    # Traced in a graph of its own: a trace inherits the colocation (and
    # device functions) of the graph it is made in, which a function
    # shared by every graph of the process must not.
    with tf.Graph().as_default():
      _GENERATORS[key] = tf.function(
          Draw, autograph=False).get_concrete_function(
              tf.TensorSpec([None], tf.int32), tf.TensorSpec([2], tf.int64))
  return _GENERATORS[key]


def _FlatUniform(shape, seed, dtype, on_gpu):
  """StatelessUniform's numbers, flat: the generator's body."""
  kept = min(24, _MANTISSA_BITS.get(dtype, 24))
  # On a GPU the shape and the counter's bounds stay in host memory, where
  # its Range reads them: int32 shapes live there, and the size is computed
  # on the host's CPU (no device-to-host copy, no stall). On a CPU stage
  # they stay on the call's own device.
  with tf.device('/device:CPU:0' if on_gpu else None):
    size = tf.cast(tf.reduce_prod(shape), tf.int64)
    start, delta = tf.constant(0, tf.int64), tf.constant(1, tf.int64)
  mix = _Mixer()
  key_a, key_b = _Keys(_SeedWords(seed), mix)
  counter = tf.cast(tf.range(start, size, delta), tf.uint32)
  bits = mix(tf.bitwise.bitwise_xor(counter * _U32(_GOLDEN), key_a))
  bits = mix(tf.bitwise.bitwise_xor(bits, key_b))
  top = tf.bitwise.right_shift(bits, _U32(32 - kept))
  return tf.cast(top, dtype) * tf.constant(2.0**-kept, dtype)


def Dropout(x, keep_prob, key, noise_shape=None):
  """Inverted dropout that is stable under recomputation.

  Args:
    x: a float tensor.
    keep_prob: a Python float in (0, 1]; 1 returns `x` unchanged.
    key: a string naming the caller, e.g. the layer's path.
    noise_shape: optional shape of the keep/drop mask, broadcast against `x`
      (e.g. ``[batch, 1, 1, 1]`` for drop path).

  Returns:
    A tensor like `x`.
  """
  if keep_prob >= 1.0:
    return x
  if noise_shape is None:
    noise_shape = tf.shape(x)
  seed = SeedPair(key)
  if seed is None:
    uniform = tf.random.uniform(noise_shape, dtype=x.dtype)
  else:
    uniform = StatelessUniform(noise_shape, seed, x.dtype)
  keep = tf.cast(uniform < keep_prob, x.dtype)
  return x * keep / tf.cast(keep_prob, x.dtype)
