"""Makes Lingvo 0.14 importable on TensorFlow 2.15. Import this before Lingvo.

Why it exists: every lingvo 0.14.x release does
``from tensorflow.python.training.tracking import autotrackable`` in
``lingvo/compat.py``. TensorFlow 2.13 moved that module to
``tensorflow.python.trackable.autotrackable``. Lingvo 0.14.1/0.14.2 (which might
have been fixed) ship custom ops that need glibc 2.38, so on Debian 12 we pin
lingvo 0.14.0 + TensorFlow 2.15.1 and register the module under its old name.

When it can go: once the project moves to a Lingvo release that imports the new
path (or to a TensorFlow that still has the old one). Then delete this module and
its imports; nothing else depends on it.

Every entry point (``gpipe/__init__.py``, tools, tests) imports it first; it is
idempotent.

Being first, it also imports TensorFlow through gpipe.compat.quiet_import, which drops
TensorFlow's CUDA plugin registration noise from stderr; move that call to
``gpipe/__init__.py`` when deleting this module.
"""

import sys
import types

from gpipe.compat import quiet_import

# Before anything imports TensorFlow, so its import noise is filtered.
quiet_import.ImportTensorFlowQuietly()

_OLD_PACKAGE = 'tensorflow.python.training.tracking'
_OLD_MODULE = _OLD_PACKAGE + '.autotrackable'

if _OLD_MODULE not in sys.modules:
  from tensorflow.python.trackable import autotrackable as _autotrackable  # pylint: disable=g-import-not-at-top
  _package = sys.modules.get(_OLD_PACKAGE)
  if _package is None:
    _package = types.ModuleType(_OLD_PACKAGE)
    _package.__path__ = []
    sys.modules[_OLD_PACKAGE] = _package
  _package.autotrackable = _autotrackable
  sys.modules[_OLD_MODULE] = _autotrackable
