"""Data-parallel replicas of a pipeline: R copies of K stages, one set of weights.

GPipe combines pipeline and data parallelism: R replicas of a K-stage pipeline
on R x K devices. ``PipeliningLayer`` does it inside one graph when
``p.replica_devices`` holds R lists of K stage devices (Lingvo's model splits,
one per replica):

* there is ONE copy of every variable, on the first replica's stage devices;
  each replica reads its stages' weights on its own devices once per step
  (``stage.ReadTheta``), so the replicas see identical weights by
  construction and a checkpoint does not depend on R (nor, with a flat
  ``layers`` list, on K);
* the mini-batch of N examples is split into R x M micro-batches of N/(R M)
  examples; replica r runs micro-batches r M .. r M + M - 1 through its own
  K-stage schedule, with the same per-micro-batch seeds as one pipeline with
  R x M micro-batches would use;
* ``tf.gradients`` sums the R gradients of each weight where the weight is
  read: one ``AddN`` on the weight's device, an op of TensorFlow's graph (the
  aggregation of Lingvo's split training), before the single optimizer
  update. Within a replica the M micro-batch gradients are summed as in one
  pipeline (``accumulation.AccumulationViews``);
* micro-batch batch norm: the statistics of all R x M micro-batches are
  summed on the first replica's stage device, and the moving averages are
  updated once per mini-batch, exactly as with R = 1.

So R replicas with M micro-batches each compute the loss and the gradients of
one pipeline with R x M micro-batches; only where the work runs differs.

This module holds the pure parts: the device lists, the micro-batch counts,
and the schedule orders of replica r.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.schedules import pipeline_tasks
from lingvo import compat as tf


def Resolve(name, num_stages, replica_devices, stage_devices=None):
  """The R lists of K stage devices from p.replica_devices.

  Args:
    name: the pipeline's name (for messages).
    num_stages: K.
    replica_devices: R lists of device strings, at least K in each.
    stage_devices: p.stage_devices, None or the first replica's devices.

  Returns:
    A list of R lists of K device strings.

  Raises:
    ValueError: an empty list, too few devices in a replica, a device used by
      two replicas, or stage_devices that disagree with the first replica.
  """
  lists = [list(devices) for devices in replica_devices]
  if not lists:
    raise ValueError('%s: replica_devices is empty: give R lists of %d stage '
                     'devices (or leave it None for one pipeline)' %
                     (name, num_stages))
  for r, devices in enumerate(lists):
    if len(devices) < num_stages:
      raise ValueError(
          '%s: replica %d has %d device(s) (%s) for %d stages: every list in '
          'replica_devices needs one device per stage' %
          (name, r, len(devices), devices, num_stages))
  lists = [devices[:num_stages] for devices in lists]
  owner = {}
  for r, devices in enumerate(lists):
    for device in set(Canonical(d) for d in devices):
      if device in owner:
        raise ValueError(
            '%s: device %s is in replica %d and replica %d: each replica '
            'needs its own devices (R x K devices for R replicas of K '
            'stages)' % (name, device, owner[device], r))
      owner[device] = r
  if stage_devices and ([Canonical(d) for d in stage_devices[:num_stages]] !=
                        [Canonical(d) for d in lists[0]]):
    raise ValueError(
        '%s: stage_devices %s differ from the first replica %s: with '
        'replica_devices, leave stage_devices None (or equal to '
        'replica_devices[0])' % (name, list(stage_devices), lists[0]))
  return lists


def ShiftOrders(orders, offset):
  """Schedule orders with every task's micro-batch index moved by `offset`.

  Replica r runs micro-batches r M .. r M + M - 1: its tasks are named and
  ordered under those global indices, so the tasks of all replicas live in
  one task_ops.ScheduledOps (their devices differ) and traces tell them apart.

  Args:
    orders: per device, a list of pipeline_tasks.Task.
    offset: added to each task's micro_batch (a batched task's range of
      micro-batches moves with it).

  Returns:
    The shifted orders (new lists).
  """
  return [[
      pipeline_tasks.Task(
          t.stage, pipeline_tasks.ShiftMicroBatch(t.micro_batch, offset),
          t.phase) for t in order
  ] for order in orders]


def Canonical(device):
  """One spelling per device string, so equal devices compare equal."""
  return tf.DeviceSpec.from_string(device or '').to_string()
