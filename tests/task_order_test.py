"""Every device of every replica runs its tasks in the schedule's order.

The executor imposes each device's order with control dependencies between
the tasks' call ops (``task_ops.ScheduledOps``). These tests build the
graph of a pipelined step (no session) and follow the chain on every device
of every data-parallel replica, for every schedule, with and without batched
weight gradients; and check ScheduledOps' errors.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import parameterized
from gpipe import pipeline
from gpipe.schedules import pipeline_tasks
from gpipe import replicas
from gpipe import schedules
from gpipe import task_ops
from gpipe import weight_batching
import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import graph_rewrites
from tests import schedule_testlib as spt
from tests import toy_layers

graph_rewrites.Off()

K = 2
M = 4
R = 2


def _Cases():
  for name in schedules.Names():
    for batched in (False, True):
      for remat in ('always', 'never'):
        yield ('%s_%s_remat_%s' % (name, 'batched_w' if batched else
                                   'per_micro_batch_w', remat),
               name, batched, remat)


def _ReplicaDevices(name):
  """R lists of K stage devices: replica r on CPUs r*D .. r*D + D - 1."""
  where = spt.Placement(name, K)
  per_replica = max(where) + 1
  return [['/device:CPU:%d' % (r * per_replica + d) for d in where]
          for r in range(R)]


def _StepGraph(name, devices, remat, batched, num_micro_batches):
  """The graph of a pipelined step (loss and gradients), K=2 stages.

  Args:
    name: the schedule.
    devices: per data-parallel replica, its K stage devices.
    remat: the remat mode.
    batched: whether weight gradients are batched.
    num_micro_batches: M per replica.

  Returns:
    The tf.Graph (built only, never run).
  """
  with tf.Graph().as_default() as graph:
    # Two layers, one per stage: the order of a stage's tasks does not
    # depend on what the stage computes (the graph is built, never run).
    p = pipeline.PipeliningLayer.Params().Set(
        name='pipe', layers=spt.Layers()[:K], num_stages=K,
        num_micro_batches=num_micro_batches, stage_sizes=[1] * K,
        remat=remat, schedule=name, dtype=tf.float64, replica_devices=devices,
        batched_weight_gradients=batched,
        loss_tpl=toy_layers.SquaredErrorLoss.Params().Set(dtype=tf.float64))
    net = p.Instantiate()
    rng = np.random.RandomState(0)
    rows = 2 * len(devices) * num_micro_batches
    x = tf.constant(rng.randn(rows, 8))
    spt.LossAndGrads(net, (x,), tf.constant(rng.randn(rows, 8)), True)
  return graph


class ReplicaTaskOrderTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_Cases())
  def testEveryDeviceOfEveryReplicaFollowsItsOrder(self, name, batched,
                                                   remat):
    devices = _ReplicaDevices(name)
    calls = spt.CallOps(_StepGraph(name, devices, remat, batched, M))
    expected = []
    for r, replica_devices in enumerate(devices):
      _, orders = schedules.Orders(
          name, replica_devices, M,
          schedules.simulate.RematCosts(remat != 'never'))
      if batched:
        orders = weight_batching.Orders(orders)
      orders = replicas.ShiftOrders(orders, r * M)
      for order in orders:
        # Every task of this device runs there.
        for task in order:
          self.assertIn(task, calls, pipeline_tasks.Label(task))
          self.assertEqual(
              replicas.Canonical(calls[task].device),
              replicas.Canonical(replica_devices[task.stage]),
              'replica %d: %s' % (r, pipeline_tasks.Label(task)))
        expected += order
    # Without remat a B of a schedule without split backward is TensorFlow's
    # own gradient of the call: several ops, no single call op to follow.
    follow = remat == 'always' or schedules.Get(name).split_backward or batched
    if follow:
      self.assertCountEqual(calls, expected)
      for r, replica_devices in enumerate(devices):
        _, orders = schedules.Orders(
            name, replica_devices, M,
            schedules.simulate.RematCosts(remat != 'never'))
        if batched:
          orders = weight_batching.Orders(orders)
        for order in replicas.ShiftOrders(orders, r * M):
          for prev, nxt in zip(order, order[1:]):
            self.assertIn(
                calls[prev], calls[nxt].control_inputs,
                'replica %d: %s before %s' % (r, pipeline_tasks.Label(prev),
                                              pipeline_tasks.Label(nxt)))
    # A batched W covers exactly its replica's micro-batches.
    for task in calls:
      if pipeline_tasks.IsAll(task.micro_batch):
        self.assertEqual(task.micro_batch.count, M)
        self.assertEqual(task.micro_batch.first % M, 0)


class HandWrittenOrderTest(test_utils.TestCase):
  """An order written out by hand, not computed by the library.

  The test above derives its expectations with the calls the executor makes
  (``schedules.Orders``, ``weight_batching.Orders``,
  ``replicas.ShiftOrders``), so a bug they share would pass there; here the
  expected chain of call-op scopes is literal.
  """

  def testFillDrainWithBatchedWeightsOnTheSecondReplica(self):
    # R=2, K=2, M=2: replica 1 runs micro-batches 2 and 3, stage 0 on CPU:2
    # and stage 1 on CPU:3. Fill-drain: both forwards, both backwards in
    # reverse, then one batched W for both micro-batches.
    expected = {
        '/device:CPU:2': ['stage0_F2', 'stage0_F3', 'stage0_B3', 'stage0_B2',
                          'stage0_Wall2to3'],
        '/device:CPU:3': ['stage1_F2', 'stage1_F3', 'stage1_B3', 'stage1_B2',
                          'stage1_Wall2to3'],
    }
    devices = [['/device:CPU:0', '/device:CPU:1'],
               ['/device:CPU:2', '/device:CPU:3']]
    graph = _StepGraph('gpipe', devices, 'always', True, 2)
    # Call ops by their scope: '.../stage0_F2/PartitionedCall'.
    by_scope = {}
    for op in graph.get_operations():
      parts = op.name.split('/')
      if (len(parts) >= 2 and parts[-2].startswith('stage') and
          parts[-1] in ('PartitionedCall', 'StatefulPartitionedCall')):
        by_scope.setdefault(parts[-2], []).append(op)
    for device, chain in expected.items():
      on_device = sorted(
          scope for scope, ops in by_scope.items()
          if replicas.Canonical(ops[0].device) == replicas.Canonical(device))
      self.assertCountEqual(chain, on_device, device)
      for scope in chain:
        self.assertLen(by_scope[scope], 1, scope)
      for prev, nxt in zip(chain, chain[1:]):
        self.assertIn(by_scope[prev][0], by_scope[nxt][0].control_inputs,
                      '%s: %s before %s' % (device, prev, nxt))


class ScheduledOpsTest(test_utils.TestCase):

  def _ScheduledOps(self):
    _, orders = schedules.Orders('gpipe', 2, 2)
    return task_ops.ScheduledOps(orders)

  def _Op(self, name):
    return tf.no_op(name=name)

  def testUnknownTaskIsAnError(self):
    with tf.Graph().as_default():
      scheduled_ops = self._ScheduledOps()
      with self.assertRaisesRegex(ValueError, 'F5s0.*in no device order'):
        scheduled_ops.Register(pipeline_tasks.Task(0, 5, 'F'), [self._Op('a')])

  def testSecondRegistrationInTheSamePassIsAnError(self):
    with tf.Graph().as_default():
      scheduled_ops = self._ScheduledOps()
      task = pipeline_tasks.Task(0, 0, 'F')
      scheduled_ops.Register(task, [self._Op('a')])
      with self.assertRaisesRegex(ValueError, 'F0s0 was registered twice'):
        scheduled_ops.Register(task, [self._Op('b')])

  def testALaterGradientPassIsRecordedUnordered(self):
    with tf.Graph().as_default():
      scheduled_ops = self._ScheduledOps()
      f0, f1 = (pipeline_tasks.Task(0, m, 'F') for m in (0, 1))
      b1 = pipeline_tasks.Task(0, 1, 'B')
      ops = {t: self._Op(pipeline_tasks.Label(t)) for t in (f0, f1, b1)}
      for t in (f0, f1, b1):
        scheduled_ops.Register(t, [ops[t]])
      again = self._Op('again')
      scheduled_ops.Register(b1, [again], gradient_pass=1)
      self.assertIn(ops[f0], ops[f1].control_inputs)
      self.assertIn(ops[f1], ops[b1].control_inputs)
      self.assertEmpty(again.control_inputs)
      self.assertEqual(scheduled_ops.Ops(b1), [ops[b1]])

  def testATaskTwiceInTheOrdersIsAnError(self):
    task = pipeline_tasks.Task(0, 0, 'F')
    with self.assertRaisesRegex(ValueError, 'F0s0 is twice in the orders'):
      task_ops.ScheduledOps([[task], [task]])


if __name__ == '__main__':
  test_utils.main()
