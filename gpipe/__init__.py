"""GPipe for Lingvo: pipeline-parallel training of sequential networks.

The public names, importable from the package itself::

  import gpipe
  p = gpipe.PipeliningLayer.Params().Set(layers=[...], num_stages=4,
                                         num_micro_batches=8)

* ``PipeliningLayer``: the pipeline (gpipe.pipeline);
* ``MicroBatchBatchNormLayer``: batch norm with micro-batch statistics and one
  moving-average update per mini-batch (gpipe.batch_norm);
* ``Dropout``: dropout that the recomputed forward pass reproduces
  (gpipe.randomness);
* ``LocalCluster``: K local TensorFlow worker processes, one per stage
  (gpipe.runtime.local_cluster);
* ``PartitionByCost``, ``StageCut``: the cut into stages (gpipe.partition);
* ``schedule``, ``timeline``: the pipeline schedules as pure functions, and
  the measured timeline of a traced step;
* ``FromLingvo``: a Lingvo GPipe layer or stack (``lingvo.core.gpipe``,
  ``layers_with_gpipe``) on this executor, same variables
  (gpipe.lingvo_gpipe; docs/MIGRATING.md).
"""

from gpipe import lingvo_import  # pylint: disable=unused-import  # must be first
# pylint: disable=g-import-not-at-top,wrong-import-position
from gpipe import schedule
from gpipe import timeline
from gpipe.batch_norm import MicroBatchBatchNormLayer
from gpipe.lingvo_gpipe import FromLingvo
from gpipe.runtime.local_cluster import LocalCluster
from gpipe.partition import PartitionByCost
from gpipe.partition import StageCut
from gpipe.pipeline import PipeliningLayer
from gpipe.randomness import Dropout
# pylint: enable=g-import-not-at-top,wrong-import-position

__all__ = [
    'Dropout', 'FromLingvo', 'LocalCluster', 'MicroBatchBatchNormLayer', 'PartitionByCost',
    'PipeliningLayer', 'StageCut', 'schedule', 'timeline',
]
