"""Lingvo's GPipe layers and stacks on this library's executor, unchanged.

Models written for ``lingvo.core.gpipe.PipeliningLayer`` (Lingvo's executor:
one ``StackedRecurrent`` loop) move over with one line, keeping their params,
cells, ``FProp`` signature and variable names, so checkpoints restore in
either direction::

    p = layers_with_gpipe.GPipeTransformerStack.Params().Set(...)
    p = gpipe.FromLingvo(p)        # the one line
    # inside a model, e.g. lingvo.tasks.lm.layers.GPipeTransformerLm:
    lm_p.stack = gpipe.FromLingvo(lm_p.stack)

``FromLingvo(p)`` takes the params of ``lingvo.core.gpipe.PipeliningLayer``
or any subclass (``GPipeTransformerStack``, ``GPipeEvolvedTransformerStack``,
``GPipeBatchMajorTransformerStack``, a user's own) and returns params of a
subclass of that same class: its ``__init__`` (cells, variable scopes) and
its ``FProp`` (embedding, loss after the pipeline) are Lingvo's, and only the
pipeline in the middle (``lingvo.core.gpipe.PipeliningLayer.FProp``) is ours:
stage functions traced once, re-materialization, micro-batch seeds, stages in
worker processes of TensorFlow's distributed runtime (where Lingvo's loop
fails), traced timelines. The params gain ours: ``stage_devices``, ``remat``,
``schedule`` and ``seed`` (see ``gpipe.executor.DefineParams``).

What means the same as in Lingvo: ``cell_tpl``, ``before_tpl``,
``num_micro_batches`` / ``micro_batch_size``, ``batch_dim``, ``state_dtype``,
``nested_map_fprop``, ``None`` inputs, accumulators of the cells, and the
devices (``stage_devices``, else the cluster's model split, as Lingvo).
What is refused rather than changed silently: more micro-batches than
examples (Lingvo quietly uses fewer), a count and a size that disagree, and
schedules that need the loss inside the pipeline (Lingvo's stacks compute it
after ``FProp`` of the pipeline: use ``gpipe.PipeliningLayer`` with
``loss_tpl`` for those).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import executor
from gpipe import partition
from gpipe.schedules import registry as schedules
from lingvo import compat as tf
from lingvo.core import gpipe as lingvo_gpipe


class LingvoPipeliningLayer(executor.PipelineExecutor,
                            lingvo_gpipe.PipeliningLayer):
  """lingvo.core.gpipe.PipeliningLayer with this library's executor.

  Construction is Lingvo's (``SeqLayer`` creates ``before_tpl`` and
  ``cell_tpl`` children with Lingvo's variable scopes); each cell is one
  stage, created on its stage device. ``FProp(theta, *args)`` runs the
  ``before_tpl`` layers on the whole batch, then the cells as a pipeline.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    executor.DefineParams(p)
    return p

  def __init__(self, params):
    self._devices = None
    super().__init__(params)
    p = self.params
    executor.CheckParams(p)
    if schedules.Get(p.schedule).per_micro_batch_loss:
      raise ValueError(
          "%s: schedule %r starts each micro-batch's backward in the last "
          'stage, so it needs the loss computed there, but a Lingvo GPipe '
          'layer computes its loss after the pipeline. Use '
          "schedule='gpipe' here, or gpipe.PipeliningLayer with loss_tpl for "
          'the other schedules.' % (p.name, p.schedule))
    if not p.cell_tpl:
      raise ValueError('%s: cell_tpl is empty: give one cell per stage' %
                       p.name)
    self.stage_devices  # pylint: disable=pointless-statement

  @property
  def stage_devices(self):
    if self._devices is None:
      self._devices = executor.ResolveDevices(self.params, self.cluster,
                                              len(self.params.cell_tpl))
    return list(self._devices)

  @property
  def num_stages(self):
    return len(self.params.cell_tpl)

  def CreateChild(self, name, params):
    """Creates cell k (its variables) on stage k's device."""
    p = self.params
    names = [c.name for c in p.cell_tpl]
    if name in names:
      device = self.stage_devices[names.index(name)]
    elif name in [b.name for b in p.before_tpl]:
      device = self.stage_devices[0]
    else:
      device = None
    if device is None:
      super().CreateChild(name, params)
    else:
      with tf.device(device):
        super().CreateChild(name, params)

  def PartitionReport(self):
    """The stage table (``partition.Report``): one cell per stage."""
    cells = [self._StageLayers(k)[1][0] for k in range(self.num_stages)]
    return partition.Report(
        [cell.params for cell in cells], [1] * self.num_stages,
        devices=self.stage_devices,
        counts=[sum(v.shape.num_elements() for v in cell.vars.Flatten())
                for cell in cells])

  def _StageLayers(self, k):
    name = self.params.cell_tpl[k].name
    return [name], [self.children[name]]

  def _BeforeLayers(self):
    names = [b.name for b in self.params.before_tpl]
    return names, [self.children[name] for name in names]

  def _LossLayer(self):
    return None, None

  def FProp(self, theta, *args):
    """Runs before_tpl, then the cells as a pipeline (Lingvo's signature)."""
    return self._RunPipeline(theta, args, None)


_CLASSES = {lingvo_gpipe.PipeliningLayer: LingvoPipeliningLayer}


def ExecutorClass(cls):
  """The subclass of Lingvo GPipe layer `cls` that runs on our executor."""
  if issubclass(cls, LingvoPipeliningLayer):
    return cls
  if cls not in _CLASSES:
    # MRO: cls, LingvoPipeliningLayer, PipelineExecutor, Lingvo's
    # PipeliningLayer, ...: cls's `super().FProp` reaches our executor.
    new = type(cls)(cls.__name__, (cls, LingvoPipeliningLayer), {
        '__module__': __name__,
        '__doc__': '%s.%s on gpipe\'s executor (gpipe.lingvo_adapter).' %
                   (cls.__module__, cls.__name__),
    })
    _CLASSES[cls] = new
    globals().setdefault(cls.__name__, new)
  return _CLASSES[cls]


def FromLingvo(p):
  """Params of the same Lingvo GPipe layer, run by this library's executor.

  Args:
    p: params of lingvo.core.gpipe.PipeliningLayer or of a subclass (e.g.
      lingvo.core.layers_with_gpipe.GPipeTransformerStack).

  Returns:
    A copy of `p` whose class is the same layer on our executor, with every
    Lingvo param kept and ours added at their defaults.

  Raises:
    TypeError: `p` is not the params of a Lingvo GPipe layer.
  """
  cls = getattr(p, 'cls', None)
  if not (isinstance(cls, type) and
          issubclass(cls, lingvo_gpipe.PipeliningLayer)):
    raise TypeError(
        'FromLingvo takes the params of lingvo.core.gpipe.PipeliningLayer or '
        'a subclass (e.g. layers_with_gpipe.GPipeTransformerStack), got '
        'params of %s; for other layers use gpipe.PipeliningLayer with '
        'cell_tpl or layers' % (getattr(cls, '__name__', cls),))
  q = ExecutorClass(cls).Params()
  for name, value in p.Copy().IterParams():
    if name != 'cls':
      q.Set(**{name: value})
  return q
