"""The pure layers import without TensorFlow or Lingvo.

The schedules (``gpipe.schedules``) and the planner's simulator and search
(``gpipe.plan``) are plain Python: a tool that draws a schedule or searches
configurations from a saved profile should not pay for TensorFlow's import
(seconds, and gigabytes of address space), and these modules must stay usable
where TensorFlow is not installed. Each module is imported in a fresh
interpreter, which then reports what else got imported.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each must import without any of FORBIDDEN.
PURE_MODULES = (
    'gpipe',  # the package itself: its public names are imported on use
    'gpipe.schedules',
    'gpipe.schedules.pipeline_tasks',
    'gpipe.schedules.orders',
    'gpipe.schedules.registry',
    'gpipe.schedules.render',
    'gpipe.schedules.simulate',
    'gpipe.schedules.timed',
    'gpipe.schedules.inference',
    'gpipe.schedules.decode_lanes',
    'gpipe.schedules.__main__',
    'gpipe.balance',
    'gpipe.weight_batching',
    'gpipe.plan',
    'gpipe.plan.profile',
    'gpipe.plan.simulator',
    'gpipe.plan.search',
    'gpipe.plan.choice',
    'gpipe.plan.traced',
    'gpipe.plan.trainer_fit',
)

FORBIDDEN = ('tensorflow', 'lingvo')

_REPORT = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(
    name for name in sys.modules
    if name.split('.')[0] in %r)))
""" % (FORBIDDEN,)


def _ImportedBy(module):
  """The FORBIDDEN modules a fresh interpreter has after importing `module`."""
  proc = subprocess.run(
      [sys.executable, '-c', _REPORT, module], cwd=_ROOT,
      capture_output=True, text=True, timeout=120, check=False)
  if proc.returncode:
    raise AssertionError('importing %s failed:\n%s' % (module, proc.stderr))
  return json.loads(proc.stdout.strip().splitlines()[-1])


class PureImportsTest(parameterized.TestCase):

  @parameterized.parameters(*PURE_MODULES)
  def testImportsWithoutTensorFlowOrLingvo(self, module):
    self.assertEqual([], _ImportedBy(module),
                     '%s imports TensorFlow or Lingvo (directly or through a '
                     'module it imports)' % module)

  def testTheSchedulesCommandRunsWithoutTensorFlow(self):
    # python -m gpipe.schedules 2 4, then what it imported.
    code = ('import runpy, sys; sys.argv = ["x", "2", "4"]; '
            'runpy.run_module("gpipe.schedules", run_name="__main__"); '
            'print(sorted(n for n in sys.modules '
            'if n.split(".")[0] in %r))' % (FORBIDDEN,))
    proc = subprocess.run([sys.executable, '-c', code], cwd=_ROOT,
                          capture_output=True, text=True, timeout=120,
                          check=False)
    self.assertEqual(0, proc.returncode, proc.stderr)
    self.assertIn('zb_h1', proc.stdout)
    self.assertEqual('[]', proc.stdout.strip().splitlines()[-1])

  def testLingvoImportedAfterThePackageFindsItsTensorFlowModule(self):
    # import gpipe imports no TensorFlow, yet Lingvo 0.14 (which imports a
    # module TensorFlow 2.13 moved) imports after it: gpipe.compat.lingvo_alias.
    code = ('import sys, gpipe; assert "tensorflow" not in sys.modules; '
            'from lingvo import compat as tf; '
            'from tensorflow.python.trackable import autotrackable; '
            'old = sys.modules["tensorflow.python.training.tracking.'
            'autotrackable"]; '
            # Lingvo reads data_structures under the old path too, when a
            # NestedMap is built from a dict (its datasources do).
            'from lingvo.core import py_utils; '
            'm = py_utils.NestedMap.FromNestedDict({"a": {"b": 1}}); '
            'assert m.a.b == 1, m; '
            # The module keeps its own spec (reload, find_spec).
            'assert autotrackable.__spec__.name == autotrackable.__name__; '
            'print(old is autotrackable)')
    proc = subprocess.run([sys.executable, '-c', code], cwd=_ROOT,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    self.assertEqual(0, proc.returncode, proc.stderr)
    self.assertEqual('True', proc.stdout.strip().splitlines()[-1])


if __name__ == '__main__':
  absltest.main()
