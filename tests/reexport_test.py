"""Every old module path still imports and exposes its new module's objects.

The flat paths (``gpipe.schedule``, ``gpipe.timeline``, ...) are re-exports
kept for one release; ``gpipe.worker`` is the worker command's entry point.
Each must hand out the very objects of the module that replaced it, so code
on an old path behaves exactly as code on the new one.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import importlib
import inspect

from absl.testing import absltest
from gpipe import pipeline_tasks
from gpipe.schedules import orders
from gpipe.schedules import registry
from gpipe.schedules import render
from gpipe.schedules import simulate

# Old path -> the module that replaced it (the same module object).
MOVED = {
    'gpipe.memory': 'gpipe.measure.memory',
    'gpipe.timeline': 'gpipe.measure.timeline',
    'gpipe.param_count': 'gpipe.measure.param_count',
    'gpipe.quiet_import': 'gpipe.compat.quiet_import',
    'gpipe.lingvo_import': 'gpipe.compat.lingvo_import',
    'gpipe.lingvo_gpipe': 'gpipe.compat.lingvo_gpipe',
    'gpipe.local_cluster': 'gpipe.runtime.local_cluster',
}

# gpipe.schedule's names -> (new module, name there).
SCHEDULE_NAMES = {
    'Task': (pipeline_tasks, 'Task'),
    'FORWARD': (pipeline_tasks, 'FORWARD'),
    'BACKWARD': (pipeline_tasks, 'BACKWARD'),
    'WEIGHT': (pipeline_tasks, 'WEIGHT'),
    'GPipeClockCycles': (orders, 'GPipeClockCycles'),
    'StageOrders': (orders, 'StageOrders'),
    'DeviceOrders': (orders, 'DeviceOrders'),
    'OneFOneBOrders': (orders, 'OneFOneBOrders'),
    'InterleavedOrders': (orders, 'InterleavedOrders'),
    'ZeroBubbleH1Orders': (orders, 'ZeroBubbleH1Orders'),
    'ZeroBubbleVOrders': (orders, 'ZeroBubbleVOrders'),
    'VPlacement': (orders, 'VPlacement'),
    'RoundRobinPlacement': (orders, 'RoundRobinPlacement'),
    'TaskTimes': (simulate, 'TaskTimes'),
    'Simulate': (simulate, 'Simulate'),
    'SimulatedBubble': (simulate, 'SimulatedBubble'),
    'BubbleFraction': (simulate, 'BubbleFraction'),
    'LoopedBubbleFraction': (simulate, 'LoopedBubbleFraction'),
    'RematCosts': (simulate, 'RematCosts'),
    'ClockCycles': (render, 'ClockCycles'),
    'Render': (render, 'Render'),
    'RenderDevices': (render, 'RenderDevices'),
    'RenderSchedule': (render, 'RenderSchedule'),
    'Orders': (registry, 'Orders'),
    'BubbleFormula': (registry, 'BubbleFormula'),
    'CostsOf': (registry, 'Costs'),
    'Spec': (registry, 'Get'),
    'ScheduleSpec': (registry, 'Schedule'),
}


def _PublicNames(module):
  return [name for name in dir(module) if not name.startswith('_')]


class ReexportTest(absltest.TestCase):

  def testMovedModulesAreTheNewModules(self):
    for old, new in MOVED.items():
      old_module = importlib.import_module(old)
      new_module = importlib.import_module(new)
      self.assertIs(new_module, old_module, old)
      names = _PublicNames(new_module)
      self.assertNotEmpty(names, new)
      for name in names:
        self.assertIs(getattr(new_module, name), getattr(old_module, name),
                      '%s.%s' % (old, name))
      # `from gpipe import <old>` hands out the same module.
      package, _, leaf = old.rpartition('.')
      self.assertIs(new_module,
                    getattr(importlib.import_module(package), leaf), old)

  def testScheduleReexportsTheSchedulesObjects(self):
    schedule = importlib.import_module('gpipe.schedule')
    exported = set(_PublicNames(schedule)) - {'collections', 'SCHEDULES'}
    exported = {name for name in exported
                if not inspect.ismodule(getattr(schedule, name))}
    self.assertCountEqual(SCHEDULE_NAMES, exported)
    for name, (module, new_name) in SCHEDULE_NAMES.items():
      self.assertIs(getattr(module, new_name), getattr(schedule, name),
                    'gpipe.schedule.%s' % name)
    self.assertEqual(registry.Names(), list(schedule.SCHEDULES))
    for name, spec in schedule.SCHEDULES.items():
      self.assertIs(registry.Get(name), spec, name)

  def testWorkerCommandRunsTheRuntimeWorker(self):
    worker = importlib.import_module('gpipe.worker')
    runtime_worker = importlib.import_module('gpipe.runtime.worker')
    self.assertIs(runtime_worker.main, worker.main)


if __name__ == '__main__':
  absltest.main()
