"""gpipe/ in layers: no module imports a module of a higher layer.

The layers, bottom up, are written in ``gpipe/__init__.py``'s docstring and
in ``LAYERS`` below. A module may import modules of its own directory and of
any lower layer; two directories of the same layer (``compat/`` and
``schedules/``) do not import each other. Read from the import statements of
every module's source (``ast``, imports inside functions included), so
nothing is imported to check it.
"""

import ast
import os
import re

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GPIPE = os.path.join(_ROOT, 'gpipe')

# Directory of gpipe/ -> its layer; CORE is the modules directly in gpipe/
# (the executor and the features it runs), the package's __init__ included.
CORE = '(core)'
LAYERS = {
    'compat': 0,
    'schedules': 0,
    'runtime': 1,
    'measure': 2,
    CORE: 3,
    'plan': 4,
}

# Deprecated re-exports kept for one release at a path below their module's
# new home: (old module, the module it re-exports). Delete with the module.
DEPRECATED_REEXPORTS = {
    ('gpipe.compat.lingvo_gpipe', 'gpipe.lingvo_adapter'),
}


def _Group(module):
  """The directory of gpipe/ that `module` ('gpipe.plan.search') is in."""
  parts = module.split('.')
  if len(parts) > 1 and parts[1] in LAYERS:
    return parts[1]
  return CORE


def _IsModule(module):
  path = os.path.join(_ROOT, *module.split('.'))
  return os.path.exists(path + '.py') or os.path.isdir(path)


def ImportedModules(module, source, is_package=False):
  """The gpipe modules that `source` (the text of `module`) imports."""
  package = module if is_package else module.rpartition('.')[0]
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = package.split('.')
        anchor = anchor[:len(anchor) - node.level + 1]
        base = '.'.join(anchor + ([base] if base else []))
      for alias in node.names:
        # `from gpipe.plan import search` imports gpipe.plan.search;
        # `from gpipe.pipeline import PipeliningLayer` imports gpipe.pipeline.
        full = base + '.' + alias.name
        found.append(full if _IsModule(full) else base)
  return sorted({m for m in found if m == 'gpipe' or m.startswith('gpipe.')})


def Violations(module, source, is_package=False):
  """['gpipe.x imports gpipe.y: layer 1 (runtime) -> 2 (measure)', ...]."""
  group = _Group(module)
  problems = []
  for imported in ImportedModules(module, source, is_package):
    other = _Group(imported)
    if other == group or (module, imported) in DEPRECATED_REEXPORTS:
      continue
    if LAYERS[other] >= LAYERS[group]:
      problems.append('%s imports %s: layer %d (%s) -> layer %d (%s)' %
                      (module, imported, LAYERS[group], group,
                       LAYERS[other], other))
  return problems


def _Modules():
  """(module name, path, is_package) of every module under gpipe/."""
  for directory, _, files in os.walk(_GPIPE):
    for name in sorted(files):
      if not name.endswith('.py'):
        continue
      path = os.path.join(directory, name)
      parts = os.path.relpath(path, _ROOT)[:-len('.py')].split(os.sep)
      is_package = parts[-1] == '__init__'
      if is_package:
        parts = parts[:-1]
      yield '.'.join(parts), path, is_package


class LayeringTest(absltest.TestCase):

  def testNoModuleImportsAHigherLayer(self):
    problems = []
    for module, path, is_package in _Modules():
      with open(path) as f:
        problems += Violations(module, f.read(), is_package)
    self.assertEmpty(problems, '\n'.join(problems))

  def testEveryDirectoryHasALayer(self):
    directories = sorted(
        name for name in os.listdir(_GPIPE)
        if os.path.exists(os.path.join(_GPIPE, name, '__init__.py')))
    self.assertCountEqual(directories, set(LAYERS) - {CORE})

  def testThePackageDocstringStatesEachLayer(self):
    with open(os.path.join(_GPIPE, '__init__.py')) as f:
      doc = ast.get_docstring(ast.parse(f.read()))
    for group, layer in LAYERS.items():
      name = 'gpipe/' if group == CORE else group + '/'
      self.assertRegex(doc, r'(?m)^\s+%d\s+%s' % (layer, re.escape(name)),
                       'gpipe/__init__.py should give %s layer %d' %
                       (name, layer))

  def testTheDeprecatedReexportsStillExist(self):
    for old, new in DEPRECATED_REEXPORTS:
      self.assertTrue(_IsModule(old), old)
      self.assertTrue(_IsModule(new), new)


class ViolationsTest(absltest.TestCase):
  """The check itself, on sources written for it."""

  def testAnUpwardImportIsReported(self):
    self.assertEqual(
        ['gpipe.runtime.x imports gpipe.measure.memory: layer 1 (runtime) -> '
         'layer 2 (measure)'],
        Violations('gpipe.runtime.x', 'from gpipe.measure import memory'))

  def testImportsInsideFunctionsAndOfNamesCount(self):
    source = ('def F():\n'
              '  from gpipe.pipeline import PipeliningLayer\n'
              '  import gpipe.plan.search\n')
    self.assertEqual(['gpipe.pipeline', 'gpipe.plan.search'],
                     ImportedModules('gpipe.measure.x', source))
    self.assertLen(Violations('gpipe.measure.x', source), 2)

  def testSameLayerOtherDirectoryIsReported(self):
    self.assertLen(Violations('gpipe.compat.x',
                              'from gpipe.schedules import orders'), 1)

  def testDownwardAndOwnDirectoryImportsAreAllowed(self):
    source = ('from gpipe.compat import lingvo_import\n'
              'from gpipe.schedules import registry\n'
              'from gpipe.runtime import background\n'
              'from gpipe.measure import memory\n'
              'from gpipe import stage\n')
    self.assertEqual([], Violations('gpipe.executor', source))
    self.assertEqual([], Violations('gpipe.plan.x',
                                    source + 'from . import simulator\n'))

  def testRelativeImportsAreResolved(self):
    self.assertEqual(['gpipe.plan.simulator'],
                     ImportedModules('gpipe.plan.x',
                                     'from . import simulator'))
    self.assertEqual(['gpipe.plan'],
                     ImportedModules('gpipe.plan', 'from . import x',
                                     is_package=True))


if __name__ == '__main__':
  absltest.main()
