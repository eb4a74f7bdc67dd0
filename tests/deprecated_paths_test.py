"""The deprecated paths of moved code hand out the new objects, and warn.

Each is kept for one release after its move (gpipe/__init__.py lists them);
code on an old path must behave exactly as code on the new one.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import importlib
import sys
import warnings

from absl.testing import absltest
from gpipe import lingvo_adapter
from gpipe import task_ops
from gpipe.measure import param_count
from gpipe.plan import profiling
from gpipe.runtime import background
from gpipe.schedules import pipeline_tasks

# Old module path -> the module that replaced it (the same module object).
MOVED_MODULES = {
    'gpipe.compat.lingvo_gpipe': lingvo_adapter,
    'gpipe.plan.measure': profiling,
}


def _ImportWarning(name):
  """Imports `name` afresh; returns (module, its DeprecationWarnings)."""
  sys.modules.pop(name, None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    module = importlib.import_module(name)
  return module, [w for w in caught
                  if issubclass(w.category, DeprecationWarning)]


class DeprecatedPathsTest(absltest.TestCase):

  def testMovedModulesAreTheNewModules(self):
    for old, new in MOVED_MODULES.items():
      module, warned = _ImportWarning(old)
      self.assertIs(new, module, old)
      self.assertLen(warned, 1, old)
      self.assertIn(new.__name__, str(warned[0].message))
      package, _, leaf = old.rpartition('.')
      self.assertIs(new, getattr(importlib.import_module(package), leaf))

  def testPipelineTasksReexportsTheVocabularyAndTheOrderedOps(self):
    old, warned = _ImportWarning('gpipe.pipeline_tasks')
    self.assertLen(warned, 1)
    names = [n for n in vars(pipeline_tasks) if not n.startswith('_')]
    self.assertContainsSubset(['Task', 'FORWARD', 'Label', 'OpScope',
                               'ParseOpName', 'Dependencies'], names)
    for name in names:
      self.assertIs(getattr(pipeline_tasks, name), getattr(old, name), name)
    self.assertIs(task_ops.ScheduledOps, old.TaskRegistry)

  def testRunIsolatedIsTheBackgroundOne(self):
    self.assertIs(background.RunIsolated, param_count.RunIsolated)


if __name__ == '__main__':
  absltest.main()
