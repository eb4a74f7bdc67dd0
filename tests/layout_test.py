"""R replicas x K stages laid out on GPU device lists (gpipe.runtime.layout)."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl.testing import absltest
from gpipe import schedules
from gpipe.plan import choice
from gpipe.plan import search
from gpipe.runtime import devices
from gpipe.runtime import layout
from tests import plan_testlib
from tests import trainer_testlib
from tools.trainer import model_select
from tools.trainer import planned


def _Gpus(hosts, per_host):
  """Each task's GPU device strings, e.g. 2 hosts x 4 GPUs."""
  return [['/job:worker/replica:0/task:%d/device:GPU:%d' % (t, g)
           for g in range(per_host)] for t in range(hosts)]


def _Short(replicas):
  """[['0/0', '0/1'], ...]: task/GPU of each stage of each replica."""
  out = []
  for stages in replicas:
    out.append(['%d/%d' % (layout.ParseDevice(d)[0], layout.ParseDevice(d)[2])
                for d in stages])
  return out


class LayoutTest(absltest.TestCase):

  def testTwoHostsOfFourGpusTwoReplicasOfFourStages(self):
    replicas = layout.Layout(layout.Flatten(_Gpus(2, 4)), 2, 4)
    # Each replica's neighbouring stages on one host; replicas across hosts.
    self.assertEqual([['0/0', '0/1', '0/2', '0/3'],
                      ['1/0', '1/1', '1/2', '1/3']], _Short(replicas))
    self.assertEqual(
        '/job:worker/replica:0/task:1/device:GPU:2', replicas[1][2])
    self.assertEqual([0, 0], [layout.HandOvers(r) for r in replicas])

  def testOneHostOfEightGpusEightStages(self):
    replicas = layout.Layout(layout.Flatten(_Gpus(1, 8)), 1, 8)
    self.assertEqual([['0/%d' % g for g in range(8)]], _Short(replicas))

  def testOnePipelineAcrossTwoHostsCrossesOnce(self):
    replicas = layout.Layout(layout.Flatten(_Gpus(2, 4)), 1, 8)
    self.assertEqual([['0/0', '0/1', '0/2', '0/3', '1/0', '1/1', '1/2',
                       '1/3']], _Short(replicas))
    self.assertEqual(1, layout.HandOvers(replicas[0]))
    # Four replicas of two stages: two per host, none crossing.
    replicas = layout.Layout(layout.Flatten(_Gpus(2, 4)), 4, 2)
    self.assertEqual([['0/0', '0/1'], ['0/2', '0/3'], ['1/0', '1/1'],
                      ['1/2', '1/3']], _Short(replicas))

  def testUnevenCountsAreRefusedNamingThem(self):
    gpus = layout.Flatten(_Gpus(2, 4))
    with self.assertRaisesRegex(
        layout.LayoutError,
        r'3 replica\(s\) x 3 device\(s\) each \(3 stages, one stage per '
        r'device\) = 9 devices, but 8 device\(s\) are there \(2 task\(s\) x '
        r'4 GPU\)'):
      layout.Layout(gpus, 3, 3)
    # Too many devices is refused too (every device is used), with what fits.
    with self.assertRaisesRegex(
        layout.LayoutError, r'= 4 devices, but 8 device\(s\) are there.*'
        'R=2 x K=4 or R=1 x K=8 would fit'):
      layout.Layout(gpus, 1, 4)
    # Hosts with different GPU counts: 4 + 2 = 6 devices.
    mixed = layout.Flatten([_Gpus(1, 4)[0], _Gpus(2, 2)[1]])
    with self.assertRaisesRegex(layout.LayoutError,
                                '4 GPU on task 0, 2 GPU on task 1'):
      layout.Layout(mixed, 2, 4)
    self.assertEqual([['0/0', '0/1', '0/2'], ['0/3', '1/0', '1/1']],
                     _Short(layout.Layout(mixed, 2, 3)))

  def testVPlacementOfZeroBubbleV(self):
    # zb_v's rule.
    # K=8 stages in a V over each host's 4 GPUs: device d holds stages d and
    # 7-d, so the V's turn stays on one GPU and every hand-over on the host.
    replicas = layout.Layout(layout.Flatten(_Gpus(2, 4)), 2, 8, layout.V_SHAPE)
    self.assertEqual([['0/0', '0/1', '0/2', '0/3', '0/3', '0/2', '0/1',
                       '0/0'], ['1/%d' % g for g in (0, 1, 2, 3, 3, 2, 1, 0)]],
                     _Short(replicas))
    self.assertEqual(schedules.orders.VPlacement(8), [
        layout.ParseDevice(d)[2] for d in replicas[0]])
    with self.assertRaisesRegex(layout.LayoutError,
                                r'two stages per device in a V.*R=2 x K=8'):
      layout.Layout(layout.Flatten(_Gpus(2, 4)), 2, 4, layout.V_SHAPE)

  def testRoundRobinOfInterleavedAndLoopedStages(self):
    # interleaved_1f1b's rule: round-robin when there are fewer devices.
    gpus = layout.Flatten(_Gpus(2, 4))
    replicas = layout.Layout(gpus, 1, 16, layout.ROUND_ROBIN)
    self.assertEqual(gpus + gpus, replicas[0])
    replicas = layout.Layout(gpus, 2, 8, layout.ANY, loop=True)
    self.assertEqual(_Short([_Gpus(1, 4)[0] * 2, _Gpus(2, 4)[1] * 2]),
                     _Short(replicas))
    # With enough devices interleaved 1F1B runs one stage per device.
    self.assertEqual(gpus, layout.Layout(gpus, 1, 8, layout.ROUND_ROBIN)[0])

  def testDescribeNamesTasksDevicesAndHandOvers(self):
    lines = layout.Describe(layout.Layout(layout.Flatten(_Gpus(2, 4)), 1, 8))
    self.assertEqual([
        'layout: 1 replica(s) x 8 stages on 8 devices (2 task(s) x 4 GPU); '
        'neighbouring stages on one task first, replicas across tasks',
        '  replica 0: stages 0-3 on task 0 (GPU:0, GPU:1, GPU:2, GPU:3), '
        'stages 4-7 on task 1 (GPU:0, GPU:1, GPU:2, GPU:3); 1 hand-over(s) '
        'between tasks'], lines)
    self.assertEqual([], layout.Describe([['/cpu:0', '/cpu:1']]))


class DeviceSelectionTest(absltest.TestCase):

  def testAutoPicksTheAcceleratorEveryTaskHas(self):
    cpus = [['/job:worker/replica:0/task:%d/device:CPU:0' % t]
            for t in range(2)]
    gpus = _Gpus(2, 2)
    both = [c + g for c, g in zip(cpus, gpus)]
    self.assertEqual('GPU', devices.ChooseDeviceType(both))
    self.assertEqual('CPU', devices.ChooseDeviceType(both, 'cpu'))
    # Task 1 has no GPU: auto falls back to CPU; gpu is refused, named.
    partial = [both[0], cpus[1]]
    self.assertEqual('CPU', devices.ChooseDeviceType(partial))
    with self.assertRaisesRegex(devices.DiscoveryError,
                                r'worker task\(s\) \[1\] have no GPU'):
      devices.ChooseDeviceType(partial, 'gpu')
    self.assertEqual(gpus, devices.SelectDevices(both, 'GPU'))
    self.assertEqual([g[:1] for g in gpus],
                     devices.SelectDevices(both, 'GPU', devices_per_task=1))
    with self.assertRaisesRegex(devices.DiscoveryError,
                                'worker task 0 has only 2 GPU'):
      devices.SelectDevices(both, 'GPU', devices_per_task=3)

  def testPlannedDevices(self):
    self.assertEqual(_Gpus(2, 8), devices.PlannedDevices(2, 'gpu', 8))


class TrainerLayoutTest(absltest.TestCase):

  def _Pipeline(self, num_stages, schedule_name=None):
    cfg = model_select.ModelParams(trainer_testlib.TOY, 'Train')
    model_select.SetPipelineShape(cfg, num_stages=num_stages,
                                  schedule=schedule_name)
    return cfg

  def testClusterDevicesAreAllUsed(self):
    gpus = layout.Flatten(_Gpus(2, 2))
    cfg = self._Pipeline(2)
    model_select.SetStageDevices(cfg, gpus, data_parallel=2, exact=True)
    self.assertEqual([gpus[:2], gpus[2:]], cfg.task.network.replica_devices)
    cfg = self._Pipeline(2)
    with self.assertRaisesRegex(
        ValueError, r'the pipeline at task.network: 1 replica\(s\) x 2 '
        r'device\(s\).*4 device\(s\) are there \(2 task\(s\) x 2 GPU\).*'
        'R=2 x K=2 or R=1 x K=4 would fit.*--devices_per_task'):
      model_select.SetStageDevices(cfg, gpus, exact=True)
    # Without `exact` (in-process CPUs) one pipeline takes the first K.
    model_select.SetStageDevices(cfg, gpus)
    self.assertEqual(gpus[:2], cfg.task.network.stage_devices)
    cfg = self._Pipeline(4, 'zb_v')
    model_select.SetStageDevices(cfg, gpus, exact=True, data_parallel=2)
    self.assertEqual([[gpus[0], gpus[1], gpus[1], gpus[0]],
                      [gpus[2], gpus[3], gpus[3], gpus[2]]],
                     cfg.task.network.replica_devices)

  def testTheTrainerLaysOutEveryShapeThePlannerOffers(self):
    # The planner searches only what the trainer will lay out on N devices
    # (a cluster's or local workers': every device used), so its pick is
    # never refused after the measuring.
    profile = plan_testlib.UniformProfile(4, batch=8)  # The toy's 4 layers.
    for n in (1, 2, 3, 4):
      cpus = ['/job:worker/replica:0/task:%d/device:CPU:0' % t
              for t in range(n)]
      shapes = {}
      for c in search.Configurations(profile, n, max_micro_batches=1,
                                     remats=['never']):
        shapes.setdefault((c.replicas, c.num_stages, c.schedule,
                           c.stages_per_device), c)
      self.assertNotEmpty(shapes)
      for c in shapes.values():
        self.assertEqual(c.num_devices, n, c.label)
        plan = choice.Plan(trainer_testlib.TOY, c, None, n, None, {})
        settings = planned.RunSettings(plan)
        # As run_config._SetDevices: a cluster's devices (every one used),
        # and this process's virtual CPUs (R x K of them, never looped).
        for devices, exact in ((cpus, True), (
            ['/device:CPU:%d' % i for i in range(c.replicas *
                                                  c.num_stages)], False)):
          cfg = model_select.ModelParams(trainer_testlib.TOY, 'Train')
          planned.Apply(cfg, plan)
          model_select.SetStageDevices(
              cfg, devices, loop=settings['loop_stages'] and exact,
              data_parallel=settings['data_parallel'], exact=exact,
              keep_explicit=not exact)
          p = cfg.task.network
          used = set(layout.Flatten(p.replica_devices) if c.replicas > 1
                     else p.stage_devices)
          if exact:
            self.assertCountEqual(used, cpus, c.label)


if __name__ == '__main__':
  absltest.main()
