"""Shared by the pipeline tests: toy dense layers and a pipeline of them."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe import pipeline
from lingvo import compat as tf
from lingvo.core import py_utils
from tests import graph_rewrites
from tests import toy_layers


def DenseLayers(num_layers=None, seed=100, init_scale=0.5, dims=None,
                **kwargs):
  """Params of toy_layers.DenseDropout layers 'dense0', 'dense1', ...

  Each has its own Gaussian init (seed + i), so the layers differ and a run
  is reproducible: large by default, so that every gradient is far from
  zero.

  Args:
    num_layers: how many (or give `dims`).
    seed: the init seed of the first layer.
    init_scale: the standard deviation of the Gaussian init.
    dims: widths [in, hidden..., out] (len(dims) - 1 layers), or None for
      DenseDropout's (8 wide).
    **kwargs: params set on every layer; dtype defaults to float64 (the
      tests compare pipelined and plain runs to 1e-10).

  Returns:
    A list of layer params.
  """
  kwargs.setdefault('dtype', tf.float64)
  if dims is not None:
    num_layers = len(dims) - 1
  if num_layers is None:
    raise ValueError('DenseLayers: give num_layers or dims')
  layers = []
  for i in range(num_layers):
    p = toy_layers.DenseDropout.Params().Set(
        name='dense%d' % i,
        params_init=py_utils.WeightInit.Gaussian(init_scale, seed=seed + i),
        **kwargs)
    if dims is not None:
      p.Set(input_dim=dims[i], output_dim=dims[i + 1])
    layers.append(p)
  return layers


def PipelineParams(layers, k, m=None, **kwargs):
  """Params of a PipeliningLayer 'pipe' of `layers`: K stages on CPUs, M.

  Args:
    layers: the layer params.
    k: stages (stage s on '/device:CPU:s' unless kwargs give stage_devices).
    m: micro-batches (None: micro_batch_size in kwargs, or the default).
    **kwargs: other params of the pipeline; dtype defaults to float64.

  Returns:
    The PipeliningLayer params.
  """
  p = pipeline.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_stages=k, num_micro_batches=m,
      stage_devices=graph_rewrites.CpuDevices(k), dtype=tf.float64)
  return p.Set(**kwargs)


def Pipeline(layers, k, m=None, **kwargs):
  """The instantiated PipelineParams(...) (call it inside a graph)."""
  return PipelineParams(layers, k, m, **kwargs).Instantiate()


def CachedReference(test, key):
  """The unpipelined values a case of `test`'s class stored under `key`.

  The unpipelined model does not depend on the schedule, the cut, remat,
  compilation or the stage devices: cases of one test class that run the
  same layers (same params, hence the same initial values) on the same
  inputs, targets and total micro-batches can compare with the values the
  first of them computed, instead of each building and running the
  reference again (a graph of every layer on every micro-batch and its
  gradients). A case of another class, or another shard's, computes its
  own.

  Args:
    test: the TestCase.
    key: a hashable naming the reference, or None (never cached).

  Returns:
    A dict (the class's cache) and the values stored under `key`, or None.
  """
  cls = type(test)
  if '_unpipelined_values' not in cls.__dict__:
    cls._unpipelined_values = {}  # pylint: disable=protected-access
  cache = cls._unpipelined_values  # pylint: disable=protected-access
  return cache, (None if key is None else cache.get(key))
