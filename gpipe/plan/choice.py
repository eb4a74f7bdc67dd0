"""A chosen plan: one configuration with its prediction, as JSON, applied.

``FromCandidate`` keeps the configuration ``search.Search`` picked, the
measured task costs its schedule orders by, what was predicted and for
which devices and cap; ``Save``/``Load`` write and read it (the trainer's
``--plan=FILE``, and what ``--plan=auto`` writes to its logdir), and
``ApplyToPipeline`` sets a ``gpipe.PipeliningLayer``'s params from it.
What the pipeline's params cannot hold (R replicas and the compute dtype)
is the caller's to apply (the trainer's ``--data_parallel`` and
``--fprop_dtype``).
"""

import collections

from gpipe.plan import profile as profile_lib
from gpipe.plan import simulator

FORMAT = 'gpipe-plan-1'


class Plan(
    collections.namedtuple('Plan', [
        'model', 'config', 'task_costs', 'num_devices', 'memory_per_device',
        'predicted'
    ])):
  """A chosen configuration.

  Attributes:
    model: the profiled model's name.
    config: the simulator.Configuration.
    task_costs: ``PipeliningLayer.task_costs`` for the schedules that order
      tasks by cost (measured seconds, with memory limits for 'zb_auto').
    num_devices: the devices planned for.
    memory_per_device: the cap in bytes (None: none).
    predicted: dict of the prediction: step_seconds, examples_per_second,
      bubble, peak_bytes (per device), and 'measured': whether the step is
      the trainer's own, measured while planning (``search.Measured``).
  """

  __slots__ = ()

  def ToJson(self):
    d = self._asdict()
    d['format'] = FORMAT
    d['config'] = self.config.ToJson()
    return d

  @classmethod
  def FromJson(cls, d):
    if d.get('format') != FORMAT:
      raise ValueError('not a %s plan file (format %r): write one with '
                       'python -m tools.plan --plan_out=FILE' %
                       (FORMAT, d.get('format')))
    fields = {f: d.get(f) for f in cls._fields}
    fields['config'] = simulator.Configuration.FromJson(d['config'])
    return cls(**fields)

  def Describe(self):
    """One line: the configuration and what it is predicted to do."""
    p = self.predicted
    return ('%s, cut %s: predicted %.1f examples/s (step %.1f ms%s, bubble '
            '%.1f%%), peak %s' % (
                self.config.label, list(self.config.stage_sizes),
                p['examples_per_second'], 1e3 * p['step_seconds'],
                ' as measured through the trainer while planning'
                if p.get('measured') else '',
                100 * p['bubble'],
                ', '.join('%.1f MiB' % (b / 2.0**20)
                          for b in p['peak_bytes'])))


def FromCandidate(candidate, num_devices, memory_per_device, model):
  """The Plan of a search.Candidate that fits."""
  p = candidate.prediction
  return Plan(
      model=model, config=candidate.config, task_costs=p.task_costs,
      num_devices=num_devices, memory_per_device=memory_per_device,
      predicted=dict(step_seconds=p.step_seconds,
                     examples_per_second=p.examples_per_second,
                     bubble=p.bubble, peak_bytes=list(p.peak_bytes),
                     step_peak_bytes=list(p.step_peak_bytes),
                     idle_fractions=list(p.idle_fractions),
                     measured=bool(candidate.measured)))


def Save(plan, path):
  """Writes `plan` to `path` as JSON."""
  profile_lib.WriteJson(plan.ToJson(), path)


def Load(path):
  """The Plan saved at `path`.

  Raises:
    ValueError: unreadable, or not a plan file.
  """
  return Plan.FromJson(profile_lib.ReadJson(path, 'plan'))


def ApplyToPipeline(pipeline_params, plan):
  """Sets K, the cut, M, schedule, remat, batched W and task costs.

  Args:
    pipeline_params: a ``gpipe.PipeliningLayer`` params with a flat
      ``layers`` list (changed in place).
    plan: a Plan.

  Raises:
    ValueError: a pipeline given as explicit stages (``cell_tpl``), or
      with another number of layers than the plan's cut.
  """
  c = plan.config
  p = pipeline_params
  if p.layers is None:
    raise ValueError(
        '%s: the plan re-cuts the pipeline into %d stages, but it is given '
        'as explicit stages (cell_tpl); build it from a flat layers list' %
        (p.name, c.num_stages))
  if sum(c.stage_sizes) != len(p.layers):
    raise ValueError(
        '%s: the plan cuts %d layers (%s) but the pipeline has %d: plan '
        'again for this model' % (p.name, sum(c.stage_sizes),
                                  list(c.stage_sizes), len(p.layers)))
  p.num_stages = c.num_stages
  p.stage_sizes = list(c.stage_sizes)
  p.num_micro_batches = c.micro_batches
  p.micro_batch_size = None
  p.schedule = c.schedule
  p.remat = c.remat
  p.batched_weight_gradients = c.batched_weights
  p.task_costs = dict(plan.task_costs) if plan.task_costs else None
