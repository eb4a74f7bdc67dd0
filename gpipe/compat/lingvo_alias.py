"""The old TensorFlow module path that Lingvo 0.14 imports, served from the new.

Every lingvo 0.14.x release does
``from tensorflow.python.training.tracking import autotrackable``;
TensorFlow 2.13 moved that module to
``tensorflow.python.trackable.autotrackable`` (``gpipe.compat.lingvo_import``
says why the project stays on this pair). Two ways to register the old path:

* ``Register()``: now. It imports TensorFlow's module, so it needs
  TensorFlow; ``gpipe.compat.lingvo_import`` calls it after importing
  TensorFlow quietly.
* ``InstallFinder()``: on first use. An import hook (``sys.meta_path``,
  after the standard finders) serves the old path when something imports it,
  and imports nothing itself. ``import gpipe`` installs it, so that the
  package's pure layers (``gpipe.schedules``, the planner's simulator) import
  without TensorFlow while Lingvo, imported after ``gpipe`` by any route,
  still finds its module.

Both hand out TensorFlow's module object itself under the old name; either
may run first, both are idempotent.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

OLD_PACKAGE = 'tensorflow.python.training.tracking'
OLD_MODULE = OLD_PACKAGE + '.autotrackable'
NEW_MODULE = 'tensorflow.python.trackable.autotrackable'
# Every module Lingvo 0.14 reads under the old package, by its new name:
# autotrackable at import, data_structures when a NestedMap is built from a
# dict (NestedMap.FromNestedDict, Lingvo's datasources and input generators).
MOVED = {
    OLD_MODULE: NEW_MODULE,
    OLD_PACKAGE + '.data_structures':
        'tensorflow.python.trackable.data_structures',
}


def _NewPackage():
  package = types.ModuleType(OLD_PACKAGE)
  package.__path__ = []
  return package


def Register():
  """Registers the old paths now (imports TensorFlow's modules)."""
  if all(old in sys.modules for old in MOVED):
    return
  package = sys.modules.get(OLD_PACKAGE)
  if package is None:
    package = _NewPackage()
    sys.modules[OLD_PACKAGE] = package
  for old, new in MOVED.items():
    module = importlib.import_module(new)
    setattr(package, old.rsplit('.', 1)[1], module)
    sys.modules[old] = module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds and loads the old names (MOVED and their package), nothing else."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target  # Unused.
    if fullname != OLD_PACKAGE and fullname not in MOVED:
      return None
    return importlib.machinery.ModuleSpec(
        fullname, self, is_package=fullname == OLD_PACKAGE)

  def create_module(self, spec):
    if spec.name == OLD_PACKAGE:
      return _NewPackage()
    # The new module itself (not a copy): its classes are Lingvo's bases.
    module = importlib.import_module(MOVED[spec.name])
    self._real_specs = getattr(self, '_real_specs', {})
    self._real_specs[module.__name__] = module.__spec__
    return module

  def exec_module(self, module):
    # Created complete by create_module; the import machinery has set the
    # old name's spec on it: give it back its own (reload, find_spec).
    real = getattr(self, '_real_specs', {}).get(module.__name__)
    if real is not None:
      module.__spec__ = real


def InstallFinder():
  """Serves the old path when first imported; imports nothing now."""
  if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
