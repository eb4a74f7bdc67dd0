"""R replicas x K stages on the cores of a TPU slice (gpipe.runtime.tpu_layout).

No TPU is needed: the layout is a pure function of the slice's topology, and
TensorFlow's own Topology and DeviceAssignment are plain Python objects that
build on a CPU (from a serialized TopologyProto, as tpu.initialize_system()
returns it on a real slice). They check that the layout is one TensorFlow
accepts and, where TensorFlow builds one itself, the same.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import itertools

from absl.testing import absltest
from gpipe.runtime import layout
from gpipe.runtime import tpu_layout
from lingvo import compat as tf
from tensorflow.core.protobuf.tpu import topology_pb2


def _Topology(tpu_slice):
  """The tf.tpu.experimental.Topology of a Slice, through its serialized proto.

  The proto is the form tpu.initialize_system() returns; TensorFlow parses
  it without a TPU.
  """
  proto = topology_pb2.TopologyProto(
      mesh_shape=list(tpu_slice.mesh_shape),
      num_tasks=tpu_slice.num_tasks,
      num_tpu_devices_per_task=tpu_slice.cores_per_task,
      device_coordinates=[v for task in tpu_slice.device_coordinates
                          for core in task for v in core])
  return tf.tpu.experimental.Topology(serialized=proto.SerializeToString())


def _Lists(core_assignment):
  return [[list(c) for c in cores] for cores in core_assignment]


def _Hops(a, b):
  return sum(abs(i - j) for i, j in zip(a[:3], b[:3]))


class SliceTest(absltest.TestCase):

  def testNamedSlicesHaveTheirHostsAndCores(self):
    for name, hosts, per_host in (('v2-8', 1, 8), ('v3-8', 1, 8),
                                  ('v3-32', 4, 8), ('v4-8', 1, 4),
                                  ('v4-32', 4, 4)):
      s = tpu_layout.Named(name)
      self.assertEqual((hosts, per_host, hosts * per_host),
                       (s.num_tasks, s.cores_per_task, s.num_cores), name)
    with self.assertRaisesRegex(tpu_layout.SliceError,
                                "unknown TPU slice 'v9-8'.*v3-8.*Grid"):
      tpu_layout.Named('v9-8')

  def testTensorFlowParsesTheTopologyOnACpu(self):
    s = tpu_layout.Named('v4-32')
    topology = _Topology(s)
    self.assertEqual([2, 2, 4, 1], topology.mesh_shape.tolist())
    self.assertEqual(0, topology.missing_devices.size)
    # Back from TensorFlow's object: the same slice.
    back = tpu_layout.Slice.FromTopology(topology, name='v4-32')
    self.assertEqual(s, back)
    # Built from arrays instead of the proto: the same too.
    direct = tf.tpu.experimental.Topology(
        mesh_shape=list(s.mesh_shape),
        device_coordinates=[list(map(list, t)) for t in s.device_coordinates])
    self.assertEqual(s, tpu_layout.Slice.FromTopology(direct, name='v4-32'))

  def testBadSlicesAreRefusedNamingWhatIsWrong(self):
    with self.assertRaisesRegex(tpu_layout.SliceError,
                                'hosts of 2x2x1 chips do not tile a slice of '
                                '3x2x1 chips'):
      tpu_layout.Grid((3, 2, 1), 2, (2, 2, 1))
    good = tpu_layout.Named('v3-8')
    coords = [list(good.device_coordinates[0])]
    coords[0][1] = coords[0][0]
    with self.assertRaisesRegex(tpu_layout.SliceError,
                                r'task 0 TPU:0 and task 0 TPU:1 are both at '
                                r'\(0, 0, 0, 0\)'):
      tpu_layout.Check(good._replace(device_coordinates=coords))
    with self.assertRaisesRegex(tpu_layout.SliceError,
                                '7 TPU device.*mesh of 8 cores.*missing'):
      tpu_layout.Check(good._replace(
          device_coordinates=[good.device_coordinates[0][:7]]))
    # Two hosts sharing chip (0, 0, 0)'s cores.
    split = [good.device_coordinates[0][:1] + good.device_coordinates[0][2:5],
             good.device_coordinates[0][1:2] + good.device_coordinates[0][5:]]
    with self.assertRaisesRegex(tpu_layout.SliceError,
                                r'cores of chip \(0, 0, 0\) are on tasks 0 '
                                'and 1'):
      tpu_layout.Check(good._replace(device_coordinates=split))


class LayoutTest(absltest.TestCase):

  def testOnePipelineOnAV3_8IsTheRingTensorFlowBuilds(self):
    s = tpu_layout.Named('v3-8')
    ours = tpu_layout.Layout(s, 1, 8)
    theirs = tf.tpu.experimental.DeviceAssignment.build(
        _Topology(s), computation_shape=[2, 2, 1, 2], num_replicas=1)
    self.assertEqual(theirs.core_assignment.tolist(),
                     _Lists(ours.core_assignment))
    self.assertEqual(list(range(8)), ours.stage_cores)
    # Both cores of a chip, then the next chip: TPU:0-3, then chip (1, 1)
    # (ordinals 6, 7) before chip (0, 1), one ICI hop from chip (1, 0).
    self.assertEqual(['/job:worker/replica:0/task:0/device:TPU:%d' % i
                      for i in (0, 1, 2, 3, 6, 7, 4, 5)],
                     ours.StageDevices(0))
    self.assertEqual({'core': 0, 'chip': 4, 'ici': 3, 'between_hosts': 0},
                     ours.HandOvers(0))

  def testReplicasTakeTheCoresTensorFlowGivesThem(self):
    # R replicas of D cores: each replica gets the block of cores that
    # TensorFlow's own builder gives it (their order within may differ).
    for name, r, k, shape in (('v3-8', 4, 2, [1, 1, 1, 2]),
                              ('v4-32', 4, 4, [2, 2, 1, 1])):
      s = tpu_layout.Named(name)
      ours = tpu_layout.Layout(s, r, k)
      theirs = tf.tpu.experimental.DeviceAssignment.build(
          _Topology(s), computation_shape=shape, num_replicas=r)
      self.assertEqual(
          [sorted(map(tuple, c)) for c in theirs.core_assignment.tolist()],
          [sorted(c) for c in ours.core_assignment], name)

  def testTensorFlowTakesTheLayoutAsADeviceAssignment(self):
    s = tpu_layout.Named('v3-32')
    ours = tpu_layout.Layout(s, 2, 16)
    assignment = tf.tpu.experimental.DeviceAssignment(
        _Topology(s), core_assignment=ours.core_assignment)
    self.assertEqual((2, 16), (assignment.num_replicas,
                               assignment.num_cores_per_replica))
    for r in range(2):
      tf_devices = [assignment.tpu_device(r, c, job='worker')
                    for c in ours.stage_cores]
      self.assertEqual([layout.ParseDevice(d) for d in tf_devices],
                       [layout.ParseDevice(d) for d in ours.StageDevices(r)])
      # The infeed of replica r's first stage comes from its host's CPU.
      self.assertEqual(
          '/job:worker/task:%d/device:CPU:0' % ours.ReplicaTasks(r)[0],
          assignment.host_device(r, 0, job='worker'))

  def testNeighbouringStagesAreOnOneChipOrOneHopApart(self):
    for name in sorted(tpu_layout.NAMED):
      s = tpu_layout.Named(name)
      n = s.num_cores
      for d in (d for d in range(1, n + 1) if n % d == 0):
        result = tpu_layout.Layout(s, n // d, d)
        for r in range(result.num_replicas):
          stages = result.StageCoordinates(r)
          self.assertLen(set(stages), d)
          self.assertEqual(
              [1] * (d - 1),
              [max(1, _Hops(a, b)) for a, b in zip(stages, stages[1:])],
              '%s R=%d x K=%d replica %d: %s' % (name, n // d, d, r, stages))

  def testAReplicaStaysOnOneHostWhenItFits(self):
    for name, r, k in (('v3-32', 4, 8), ('v3-32', 8, 4), ('v4-32', 4, 4),
                       ('v4-32', 8, 2)):
      result = tpu_layout.Layout(tpu_layout.Named(name), r, k)
      hosts = [result.ReplicaTasks(i) for i in range(r)]
      self.assertTrue(all(len(h) == 1 for h in hosts), (name, hosts))
      # Replicas fill the hosts one after another.
      self.assertEqual(sorted(set(h[0] for h in hosts)),
                       list(range(result.slice.num_tasks)))

  def testAPipelineAcrossHostsCrossesBetweenNeighbouringChips(self):
    result = tpu_layout.Layout(tpu_layout.Named('v4-32'), 1, 16)
    self.assertEqual([0, 1, 2, 3], result.ReplicaTasks(0))
    self.assertEqual({'core': 0, 'chip': 0, 'ici': 15, 'between_hosts': 3},
                     result.HandOvers(0))
    # On v3-32 the hosts are 2x2 chip blocks in a 2x2 grid: visited as a
    # snake (0, 1, 3, 2), each entered next to where the last one ended.
    result = tpu_layout.Layout(tpu_layout.Named('v3-32'), 1, 32)
    self.assertEqual([0, 1, 3, 2], result.ReplicaTasks(0))
    self.assertEqual({'core': 0, 'chip': 16, 'ici': 15, 'between_hosts': 3},
                     result.HandOvers(0))

  def testTheDeviceOrdinalsOfARealTopologyAreFollowed(self):
    # A slice whose host lists its devices in another order than Grid's:
    # the layout follows the coordinates, and names the ordinals there.
    s = tpu_layout.Named('v3-8')
    order = [5, 4, 7, 6, 1, 0, 3, 2]
    shuffled = s._replace(device_coordinates=[
        [s.device_coordinates[0][i] for i in order]])
    a = tpu_layout.Layout(s, 1, 8)
    b = tpu_layout.Layout(shuffled, 1, 8)
    self.assertEqual(a.core_assignment, b.core_assignment)
    self.assertEqual(['/job:worker/replica:0/task:0/device:TPU:%d' %
                      order.index(i) for i in (0, 1, 2, 3, 6, 7, 4, 5)],
                     b.StageDevices(0))

  def testVAndLoopedStagesShareCores(self):
    s = tpu_layout.Named('v3-8')
    v = tpu_layout.Layout(s, 1, 16, placement=layout.V_SHAPE)
    self.assertEqual(8, v.cores_per_replica)
    stages = v.StageCoordinates(0)
    self.assertEqual(stages[:8], stages[8:][::-1])
    self.assertEqual(1, v.HandOvers(0)['core'])  # Stage 7 to 8: the tip.
    looped = tpu_layout.Layout(s, 1, 16, loop=True)
    self.assertEqual([i % 8 for i in range(16)], looped.stage_cores)
    stages = looped.StageCoordinates(0)
    # Stage 7 hands over to stage 8 on core 0: the walk of a 2x2 chip
    # block closes into a ring, so that is one hop too.
    self.assertEqual(1, _Hops(stages[7], stages[8]))
    # Two replicas of 16 looped stages on a v4-32: 8 cores, 2 stages each.
    looped = tpu_layout.Layout(tpu_layout.Named('v4-32'), 2, 16, loop=True)
    self.assertEqual(8, looped.cores_per_replica)

  def testShapesThatDoNotFitAreRefusedNamingThem(self):
    s = tpu_layout.Named('v3-8')
    with self.assertRaisesRegex(
        layout.LayoutError,
        r'1 replica\(s\) x 4 core\(s\) each \(4 stages\) = 4 cores, but slice '
        r'v3-8 has 8 \(1 host\(s\) x 8\).*R x D must equal 8; R=2 x K=4 or '
        'R=1 x K=8 would fit'):
      tpu_layout.Layout(s, 1, 4)
    with self.assertRaisesRegex(layout.LayoutError, r'3 replica\(s\) x 2'):
      tpu_layout.Layout(s, 3, 2)
    with self.assertRaisesRegex(layout.LayoutError,
                                r'7 core\(s\) each \(15 stages, two per core '
                                'in a V\).*R=1 x K=16 would fit'):
      tpu_layout.Layout(s, 1, 15, placement=layout.V_SHAPE)
    with self.assertRaisesRegex(layout.LayoutError, 'need R >= 1'):
      tpu_layout.Layout(s, 0, 8)

  def testDescribe(self):
    lines = tpu_layout.Describe(
        tpu_layout.Layout(tpu_layout.Named('v4-32'), 2, 8))
    self.assertEqual(
        ['slice v4-32: 2x2x4 chips x 1 core(s), 4 host(s) x 4 cores; '
         '2 replica(s) x 8 stages on 8 core(s) each',
         '  replica 0: stages 0-3 on task 0 (TPU:0, TPU:1, TPU:3, TPU:2), '
         'stages 4-7 on task 1 (TPU:2, TPU:0, TPU:1, TPU:3); hand-overs: 0 '
         'within a chip, 7 ICI hop(s), 1 between hosts',
         '  replica 1: stages 0-3 on task 2 (TPU:3, TPU:1, TPU:0, TPU:2), '
         'stages 4-7 on task 3 (TPU:2, TPU:0, TPU:1, TPU:3); hand-overs: 0 '
         'within a chip, 7 ICI hop(s), 1 between hosts'], lines)

  def testEveryCoreOnceForEveryShape(self):
    for name, loop in itertools.product(sorted(tpu_layout.NAMED),
                                        (False, True)):
      s = tpu_layout.Named(name)
      for r in (r for r in range(1, s.num_cores + 1) if s.num_cores % r == 0):
        # Looped: two stages per core; else one.
        k = s.num_cores // r * (2 if loop else 1)
        result = tpu_layout.Layout(s, r, k, loop=loop)
        used = [c for cores in result.core_assignment for c in cores]
        self.assertLen(set(used), s.num_cores, (name, r, loop))


if __name__ == '__main__':
  absltest.main()
