"""A pipeline's stages as the layers they hold: the public view of the cut.

``PipeliningLayer.Stages()`` (any ``executor.PipelineExecutor``, so
``FromLingvo``'s layers too) returns one ``StageLayers`` per stage: its index,
its device, its layers and their keys in the pipeline's theta. Code that runs
a stage's layers itself, outside the training schedule, starts from these:
e.g. a decoder's step per stage (``gpipe/lanes.py``), which reads each
stage's theta with ``Theta`` and keeps only some layers with ``Only``.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo.core import py_utils


class StageLayers(
    collections.namedtuple('StageLayers',
                           ['index', 'device', 'keys', 'layers'])):
  """One stage of a pipeline: what it holds and where it runs.

  Attributes:
    index: k, its place in the pipeline (names its tasks, ``stage<k>_...``).
    device: the device its layers' variables live on and it runs on.
    keys: the theta keys of its layers in the pipelining layer's theta, in
      order.
    layers: its Lingvo layers (BaseLayer), in order.
  """

  __slots__ = ()

  def Items(self):
    """[(theta key, layer)] of the stage's layers, in order."""
    return list(zip(self.keys, self.layers))

  def Theta(self, theta):
    """The stage's share of the pipelining layer's `theta`.

    Args:
      theta: the pipelining layer's theta (a NestedMap holding every layer's
        theta under its key).

    Returns:
      A NestedMap {key: layer theta} of this stage's layers.
    """
    return py_utils.NestedMap({key: theta[key] for key in self.keys})

  def Only(self, keep):
    """This stage with only the layers `keep` selects (same index, device).

    Args:
      keep: function(layer) -> bool.

    Returns:
      A StageLayers, possibly without layers.
    """
    items = [(key, layer) for key, layer in self.Items() if keep(layer)]
    return self._replace(keys=[key for key, _ in items],
                         layers=[layer for _, layer in items])

  def Joined(self, other):
    """This stage and `other` after it as one stage, on this stage's device.

    Args:
      other: a StageLayers (usually the next stage, on the same device).

    Returns:
      A StageLayers with this stage's index and device, and both stages'
      layers in order.
    """
    return self._replace(keys=list(self.keys) + list(other.keys),
                         layers=list(self.layers) + list(other.layers))
