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


def _NewPackage():
  package = types.ModuleType(OLD_PACKAGE)
  package.__path__ = []
  return package


def Register():
  """Registers the old path now (imports TensorFlow's module)."""
  if OLD_MODULE in sys.modules:
    return
  autotrackable = importlib.import_module(NEW_MODULE)
  package = sys.modules.get(OLD_PACKAGE)
  if package is None:
    package = _NewPackage()
    sys.modules[OLD_PACKAGE] = package
  package.autotrackable = autotrackable
  sys.modules[OLD_MODULE] = autotrackable


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds and loads the two old names, and nothing else."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target  # Unused.
    if fullname not in (OLD_PACKAGE, OLD_MODULE):
      return None
    return importlib.machinery.ModuleSpec(
        fullname, self, is_package=fullname == OLD_PACKAGE)

  def create_module(self, spec):
    if spec.name == OLD_PACKAGE:
      return _NewPackage()
    # The new module itself (not a copy): its classes are Lingvo's bases.
    return importlib.import_module(NEW_MODULE)

  def exec_module(self, module):
    del module  # Created complete by create_module.


def InstallFinder():
  """Serves the old path when first imported; imports nothing now."""
  if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
