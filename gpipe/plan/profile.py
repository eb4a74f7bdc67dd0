"""A model's measured profile: what the planner simulates from (JSON).

Measured once per model and device type (``gpipe.plan.profiling``, or
``python -m tools.plan --profile_out=...``), saved as JSON and reused:

* per layer, at a few micro-batch sizes (rows) and compute dtypes: the
  seconds of its forward (F), of its input gradient (B, without the
  recomputed forward) and of its weight gradient (W); the bytes of its
  input and output (what a stage boundary hands over), of the forward
  tensors its backward reads (what ``remat='never'`` keeps per
  micro-batch), of what its weight gradient reads (what a split backward
  keeps from B until W), and of the temporaries of its backward;
* per layer, its variables' bytes (float32 masters);
* the device: seconds per task call (a stage function's dispatch), memory
  bandwidth (gradient sums and the update read and write each parameter),
  a step's fixed seconds;
* the hand-over between two devices: latency and bandwidth, measured
  between two worker processes (calibrated against the executor's stages:
  ``calibrate``) or given for a cluster that is not here;
* the model: its batch, whether its loss is computed per micro-batch in
  the pipeline (every schedule) or after it (fill-drain only), whether its
  weight gradients can be batched, its optimizer's slots per parameter.

Between measured sizes every figure is interpolated linearly in the rows
(and extrapolated from the nearest two), which is how kernels behave once
their tensors are large enough.

Pure Python, no TensorFlow: ``Load``/``Save``, ``Profile.At``.
"""

import bisect
import collections
import json

FORMAT = 'gpipe-profile-1'

# The figures of one layer at one size (``Measurement`` fields).
TIME_FIELDS = ('forward', 'backward', 'weight')
BYTE_FIELDS = ('input_bytes', 'output_bytes', 'activation_bytes',
               'weight_bytes', 'temporary_bytes', 'input_read_bytes',
               'output_read_bytes')


class Measurement(
    collections.namedtuple('Measurement',
                           ('rows', 'dtype') + TIME_FIELDS + BYTE_FIELDS,
                           defaults=(0, 0))):
  """One layer at one micro-batch size and dtype.

  Attributes:
    rows: examples per micro-batch.
    dtype: the compute dtype ('float32', 'bfloat16').
    forward: seconds of F.
    backward: seconds of the input gradient alone (B without recompute).
    weight: seconds of the weight gradient alone (W).
    input_bytes: the layer's inputs.
    output_bytes: its outputs (a boundary's hand-over after this layer).
    activation_bytes: forward tensors (inputs included) its backward reads.
    weight_bytes: tensors its weight gradient reads (kept from B to W).
    temporary_bytes: the backward's peak beyond the activations.
    input_read_bytes: of the activations, the layer's inputs.
    output_read_bytes: of the activations, the layer's outputs (a stage's
      next layer reads them as its inputs: held once, not twice).
  """

  __slots__ = ()


class Layer(collections.namedtuple('Layer',
                                   ['name', 'param_bytes', 'measurements'])):
  """One layer: name, variable bytes, and its Measurements."""

  __slots__ = ()

  def At(self, rows, dtype='float32'):
    """The layer's figures at `rows` per micro-batch, interpolated.

    Args:
      rows: examples per micro-batch (any positive number).
      dtype: a measured dtype.

    Returns:
      A Measurement.

    Raises:
      ValueError: the dtype was not measured.
    """
    # One point per size (a size measured twice: the later one).
    points = sorted({m.rows: m for m in self.measurements
                     if m.dtype == dtype}.values(), key=lambda m: m.rows)
    if not points:
      raise ValueError('layer %s was not measured in %s (measured: %s); '
                       'profile it with that dtype' %
                       (self.name, dtype, sorted(
                           {m.dtype for m in self.measurements})))
    if len(points) == 1:
      # One size: proportional to the rows.
      scale = float(rows) / points[0].rows
      return points[0]._replace(rows=rows, **{
          f: getattr(points[0], f) * scale
          for f in TIME_FIELDS + BYTE_FIELDS})
    sizes = [m.rows for m in points]
    i = min(max(bisect.bisect_left(sizes, rows), 1), len(points) - 1)
    lo, hi = points[i - 1], points[i]
    frac = (rows - lo.rows) / float(hi.rows - lo.rows)
    values = {}
    for f in TIME_FIELDS + BYTE_FIELDS:
      a, b = getattr(lo, f), getattr(hi, f)
      # Extrapolating down can cross zero: never below it.
      values[f] = max(a + frac * (b - a), 0.0)
    return Measurement(rows=rows, dtype=dtype, **values)


# Task kinds a factor is kept for.
FACTOR_KINDS = ('F', 'B', 'W', 'BW', 'R')


class Factors(collections.namedtuple('Factors', ('rows',) + FACTOR_KINDS)):
  """Measured stage task time over the profile's sum, at one size.

  Attributes:
    rows: examples per micro-batch.
    F: forward.
    B: input gradient of a split backward (with W's inputs).
    W: weight gradient of a split backward.
    BW: an unsplit backward (input and weight gradients).
    R: a re-materializing B's extra time over the forward's profile time.
  """

  __slots__ = ()


class Handover(collections.namedtuple('Handover', ['latency', 'bandwidth'])):
  """A hand-over between two devices: seconds + bytes / (bytes/s)."""

  __slots__ = ()

  def Seconds(self, num_bytes):
    if not num_bytes:
      return 0.0
    return self.latency + num_bytes / self.bandwidth


class Profile(
    collections.namedtuple('Profile', [
        'model', 'batch', 'layers', 'handover', 'call_seconds',
        'memory_bandwidth', 'step_seconds', 'loss_in_pipeline',
        'batched_weights', 'optimizer_slots', 'update_traffic', 'machine',
        'notes', 'factors', 'contention', 'trainer_seconds',
        'trainer_reference', 'update_factor'
    ], defaults=((), 1.0, 0.0, None, 1.0))):
  """A model's measured profile (see the module docstring).

  Attributes:
    model: the model's name.
    batch: examples per training step (all replicas).
    layers: the pipeline's Layers in order (a loss layer of the last
      stage, ``loss_tpl``, is counted in the last one).
    handover: the Handover between two devices.
    call_seconds: fixed seconds of every task (a stage function call).
    memory_bandwidth: bytes/s a device reads or writes (gradient sums,
      updates).
    step_seconds: fixed seconds of a step (its start, the split of the
      batch, the session's bookkeeping).
    loss_in_pipeline: whether each micro-batch's loss is computed in the
      last stage (every schedule runs), or after the pipeline ('gpipe'
      only).
    batched_weights: whether ``batched_weight_gradients`` may be used (not
      with micro-batch batch norm).
    optimizer_slots: the optimizer's float32 copies per parameter (SGD 0,
      momentum 1, Adam 2).
    update_traffic: bytes the update reads and writes per parameter byte.
    machine: a dict describing where it was measured.
    notes: free text (how it was measured).
    factors: Factors per calibrated size (``gpipe.plan.calibrate``): the
      executor's stage calls over the layers' sums; () for none (1.0).
    contention: a device's slowdown while another computes too (1.0:
      none).
    trainer_seconds: what the trainer's step adds to the pipeline's (its
      input, Lingvo's learner, the metrics and its client process),
      measured through the trainer (``tools/plan/trainer_step.py``); 0.0
      for a pipeline run on its own (a benchmark's runner).
    trainer_reference: how ``trainer_seconds`` and ``update_factor`` were
      measured: a dict with the configurations' labels, their devices and
      the trainer's step seconds; None if they were not.
    update_factor: the update's seconds through the trainer over those of
      ``update_traffic`` (Lingvo's learner reads and scales every gradient
      before the optimizer's update); 1.0 when not measured (the planner's
      traced references put the update's time in the fixed cost and the
      task factors: ``gpipe.plan.trainer_fit``).
  """

  __slots__ = ()

  @property
  def num_layers(self):
    return len(self.layers)

  def Dtypes(self):
    """The compute dtypes every layer was measured in."""
    sets = [{m.dtype for m in layer.measurements} for layer in self.layers]
    return sorted(set.intersection(*sets)) if sets else []

  def Rows(self):
    """The micro-batch sizes measured (of the first layer)."""
    return sorted({m.rows for m in self.layers[0].measurements})

  def ToJson(self):
    """The profile as a JSON-serializable dict."""
    d = self._asdict()
    d['format'] = FORMAT
    d['handover'] = self.handover._asdict()
    d['layers'] = [dict(name=l.name, param_bytes=l.param_bytes,
                        measurements=[m._asdict() for m in l.measurements])
                   for l in self.layers]
    d['factors'] = [f._asdict() for f in self.factors]
    return d

  @classmethod
  def FromJson(cls, d):
    """The Profile of a dict written by ``ToJson``.

    Raises:
      ValueError: another format, or missing fields, naming them.
    """
    if d.get('format') != FORMAT:
      raise ValueError('not a %s profile (format %r); measure it with '
                       'python -m tools.plan --profile_out=...' %
                       (FORMAT, d.get('format')))
    missing = [f for f in cls._fields
               if f not in d and f not in cls._field_defaults]
    if missing:
      raise ValueError('the profile lacks %s' % ', '.join(missing))
    layers = [Layer(l['name'], l['param_bytes'],
                    [Measurement(**m) for m in l['measurements']])
              for l in d['layers']]
    fields = {f: d[f] for f in cls._fields if f in d}
    fields.update(layers=layers, handover=Handover(**d['handover']),
                  factors=tuple(Factors(**f) for f in d.get('factors', ())))
    return cls(**fields)

  def Replace(self, **changes):
    """A copy with some fields changed (e.g. another hand-over)."""
    return self._replace(**changes)


def WriteJson(value, path):
  """Writes a JSON-serializable `value` to `path` (indented, sorted)."""
  with open(path, 'w') as f:
    json.dump(value, f, indent=1, sort_keys=True)


def ReadJson(path, what):
  """The JSON value in `path`; a ValueError naming `what` it should be."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError('cannot read the %s %s: %s' % (what, path, e)) from None


def Save(profile, path):
  """Writes `profile` to `path` as JSON."""
  WriteJson(profile.ToJson(), path)


def Load(path):
  """The Profile saved at `path`.

  Raises:
    ValueError: the file is not a profile, saying what it is.
  """
  return Profile.FromJson(ReadJson(path, 'profile'))


def FactorsAt(factors, rows):
  """The Factors at `rows`, interpolated linearly (held at the ends)."""
  if not factors:
    return None
  points = sorted(factors, key=lambda f: f.rows)
  if rows <= points[0].rows:
    return points[0]
  for lo, hi in zip(points, points[1:]):
    if rows <= hi.rows:
      frac = (rows - lo.rows) / float(hi.rows - lo.rows)
      return Factors(rows, *[getattr(lo, k) + frac * (getattr(hi, k) -
                                                      getattr(lo, k))
                             for k in FACTOR_KINDS])
  return points[-1]
