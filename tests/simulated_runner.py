"""A benchmark runner whose training steps are simulated, for quick tests.

``tools.benchmark``'s subcommands build the graph of every configuration they
compare and time it on worker processes: minutes of work for a test of their
own logic (which configurations they compare, how step times, traces and
memory records become tables, headlines, JSON and plots). ``SimulatedRunner``
is ``runner.Runner`` (the same interleaved timing, devices and closing) whose
``Add`` simulates a configuration's step instead of building it:

* the tasks of each device run in the order of the configuration's schedule
  (``gpipe.schedules.Orders``), each as early as the simulator lets it
  (``gpipe.schedules.simulate.TaskTimes``), F costing 1 tick, B 1 (plus 1
  recomputing the forward pass with remat) and W 1; a tick lasts in
  proportion to the layers of a stage and the rows of a micro-batch; after the
  last backward task the first device sums the replicas' gradients (with
  replicas) and applies the update;
* a traced step returns ``RunMetadata`` whose step stats hold one call op per
  task, named, placed and timed as the executor's would be, with allocation
  records: a forward keeps its activations until its backward frees them
  (only its input with remat, plus the recomputed activations during the
  backward).

Step times and memory are thus exact functions of the configuration, so a
test can predict what a subcommand reports. The other implementations than
'gpipe' ('lingvo', 'plain', 'inline') are timed as our K=1 step at their M
times a fixed factor, and traced like it.

``InProcessRunner`` runs the real steps instead, in the test's process on
its CPU devices.
"""

from gpipe.schedules import pipeline_tasks
from gpipe import schedules
from tensorflow.core.protobuf import config_pb2
from tests import graph_rewrites
from tools.benchmark import models
from tools.benchmark import runner as runner_lib

# Seconds of one tick for one layer and one row (example) of a micro-batch.
TICK_SECS_PER_LAYER_ROW = 1e-4
# Seconds after the last backward task: the gradient sum of R > 1 replicas
# on the first device, then the update (the same for every configuration).
ALLREDUCE_SECS = 0.002
UPDATE_SECS = 0.001
# The other implementations' step time over ours at K=1 with their M.
IMPL_FACTOR = {'gpipe': 1.0, 'inline': 1.25, 'lingvo': 0.5, 'plain': 0.4}
# Activation tensors a layer keeps per example for its backward pass, each of
# the model's input size.
ACTIVATIONS_PER_LAYER = 4


class Cluster:
  """A runner cluster without processes: devices and a session target."""

  def __init__(self, devices, target):
    self.devices = devices
    self.target = target
    self.pids = []

  def Stop(self):
    pass


class InProcessRunner(runner_lib.Runner):
  """runner.Runner building and running real steps in this process.

  Every configuration shares this process's CPU devices (split with
  graph_rewrites.VirtualCpus at the test module's top).
  """

  def Cluster(self, impl, num_stages):
    del impl, num_stages  # Every configuration shares the local devices.
    return Cluster(graph_rewrites.LocalCpus(), '')


class SimulatedRunner(runner_lib.Runner):
  """``runner.Runner`` with simulated clusters and steps (module docstring)."""

  def Cluster(self, impl, num_stages):
    key = (impl, num_stages)
    if key not in self._clusters:
      workers = num_stages if impl in ('gpipe', 'inline') else 1
      self._clusters[key] = Cluster(
          ['/job:worker/replica:0/task:%d/device:CPU:0' % i
           for i in range(workers)], 'simulated')
    return self._clusters[key]

  def Add(self, config):
    step = SimulatedStep(config, self.Devices(config))
    self.steps.append(step)
    return step


def _Placement(config):
  """(schedule name, stage -> device index) of a 'gpipe' configuration."""
  num_stages = config.num_stages * config.stages_per_device
  name = config.schedule or 'gpipe'
  if name == 'zb_v':
    return name, schedules.orders.VPlacement(num_stages)
  return name, schedules.orders.RoundRobinPlacement(num_stages,
                                                    config.num_stages)


class SimulatedStep:
  """One configuration's simulated training step (see the module docstring).

  Attributes:
    config: the runner.Config.
    times: seconds of the timed steps (filled by Runner.TimeInterleaved).
    lanes: per device string, its (Task, start tick, end tick) in run order.
    tick_secs: the seconds of one tick.
    update_start: the second the update starts.
    seconds: the step time (the end of the update).
  """

  def __init__(self, config, devices):
    if config.batched_weights:
      raise ValueError('%s: simulated steps have no batched weight '
                       'gradients' % config.label)
    self.config = config
    self.times = []
    # What runner.Step reports of its build, for the tables that show it.
    self.first_seconds = None
    self.build_seconds = 0.0
    self.num_ops = 0
    c = config
    if c.impl == 'gpipe':
      name, where = _Placement(c)
      costs = schedules.registry.Costs(name, 1,
                                       2 if c.remat != 'never' else 1, 1)
      _, orders = schedules.Orders(name, where, c.num_micro_batches)
      times = schedules.simulate.TaskTimes(
          orders, len(where), c.num_micro_batches,
          schedules.Get(name).per_micro_batch_loss, costs)
      lane_devices = sorted(set(where), key=where.index)
    else:  # One device, our K=1 fill-drain at the same M.
      costs = schedules.registry.Costs('gpipe', 1,
                                       2 if c.remat != 'never' else 1, 1)
      _, orders = schedules.Orders('gpipe', [0], c.num_micro_batches)
      times = schedules.simulate.TaskTimes(orders, 1, c.num_micro_batches,
                                           False, costs)
      lane_devices = [0]
    replicas = c.replicas if c.impl == 'gpipe' else 1
    self.lanes = {}
    for r in range(replicas):
      for d, lane in zip(lane_devices, times):
        self.lanes[devices[r * c.num_stages + d]] = lane
    stages = c.num_stages * c.stages_per_device if c.impl == 'gpipe' else 1
    rows = c.batch // (replicas * c.num_micro_batches)
    self.tick_secs = (TICK_SECS_PER_LAYER_ROW * c.num_layers / stages *
                      rows * IMPL_FACTOR[c.impl])
    span = max(end for lane in times for _, _, end in lane)
    self.update_start = span * self.tick_secs + (
        ALLREDUCE_SECS if replicas > 1 else 0.0)
    self.seconds = self.update_start + UPDATE_SECS
    shape = models.InputShape(c.model, c.batch, c.width)
    example_bytes = 4
    for size in shape[1:]:
      example_bytes *= size
    layers = c.num_layers // stages
    # A forward keeps its input, or with remat='never' every layer's
    # activations; a re-materializing backward holds the recomputed ones.
    self._kept_bytes = rows * example_bytes * (
        1 if c.remat != 'never' else ACTIVATIONS_PER_LAYER * layers)
    self._recomputed_bytes = rows * example_bytes * (
        ACTIVATIONS_PER_LAYER * layers if c.remat != 'never' else 0)

  def Run(self, trace=False):
    """The step's seconds; with trace=True also its RunMetadata."""
    if not trace:
      return self.seconds
    metadata = config_pb2.RunMetadata()
    for num, (device, lane) in enumerate(self.lanes.items()):
      dev = metadata.step_stats.dev_stats.add(device=device)
      for task, start, end in lane:
        self._AddTask(dev, task, start, end)
      if num == 0:
        dev.node_stats.add(
            node_name='update', all_start_micros=_Micros(self.update_start),
            all_end_rel_micros=_Micros(UPDATE_SECS),
            timeline_label='update = NoOp()')
    return self.seconds, metadata

  def _AddTask(self, dev, task, start, end):
    """A task's call op and its allocation records."""
    scope = pipeline_tasks.OpScope(task.stage, task.phase, task.micro_batch)
    node = dev.node_stats.add(
        node_name=scope + '/PartitionedCall',
        all_start_micros=_Micros(start * self.tick_secs),
        all_end_rel_micros=_Micros((end - start) * self.tick_secs),
        timeline_label=scope + '/PartitionedCall = PartitionedCall()')
    memory = node.memory.add(allocator_name='cpu')
    records = memory.allocation_records
    if task.phase == pipeline_tasks.FORWARD:
      records.add(alloc_micros=_Micros(end * self.tick_secs),
                  alloc_bytes=self._kept_bytes)
    elif task.phase == pipeline_tasks.BACKWARD:
      if self._recomputed_bytes:
        records.add(alloc_micros=_Micros(start * self.tick_secs),
                    alloc_bytes=self._recomputed_bytes)
      records.add(alloc_micros=_Micros(end * self.tick_secs),
                  alloc_bytes=-self._kept_bytes - self._recomputed_bytes)

  def GraphBytes(self):
    """No graph is built: 0."""
    return 0

  def Close(self):
    pass


def _Micros(seconds):
  return int(round(seconds * 1e6))
