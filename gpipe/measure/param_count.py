"""Parameter counts of layer params, from the built graph, without weights.

A layer is instantiated in a scratch ``tf.Graph``: graph-mode variables are
ops with shapes, and nothing allocates their memory until an initializer runs,
which never happens here. Identical layer params (a deep stack repeats one
layer hundreds of times) are built once and counted from a cache, so even the
83.9B-parameter Transformer-L 1663 config is counted in seconds.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import background
import numpy as np
from lingvo import compat as tf

_CACHE = {}


def _Key(layer_params):
  return layer_params.cls.__module__ + '.' + layer_params.cls.__name__ + (
      '\n' + layer_params.ToText())


# Deprecated, kept for one release: use gpipe.runtime.background.RunIsolated
# (it serves every scratch build, not only counting).
RunIsolated = background.RunIsolated


def _BuildShapes(layer_params):
  with tf.Graph().as_default():
    layer_params.Copy().Instantiate()
    trainable = {id(v) for v in tf.compat.v1.trainable_variables()}
    return {
        v.name: (tuple(v.shape.as_list()), id(v) in trainable)
        for v in tf.compat.v1.global_variables()
        if v.name != 'global_step:0'
    }


def VariableShapes(layer_params):
  """{variable name: (shape, trainable)} of a layer built in a scratch graph."""
  key = _Key(layer_params)
  if key not in _CACHE:
    _CACHE[key] = background.RunIsolated(lambda: _BuildShapes(layer_params))
  return _CACHE[key]


def CountParams(layer_params, trainable_only=True):
  """The number of (trainable) parameters of the layer `layer_params` makes."""
  return int(sum(
      int(np.prod(shape)) for shape, trainable in
      VariableShapes(layer_params).values() if trainable or not trainable_only))
