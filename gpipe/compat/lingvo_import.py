"""Makes Lingvo 0.14 importable on TensorFlow 2.15. Import this before Lingvo.

Why it exists: every lingvo 0.14.x release does
``from tensorflow.python.training.tracking import autotrackable`` in
``lingvo/compat.py``. TensorFlow 2.13 moved that module to
``tensorflow.python.trackable.autotrackable``. Lingvo 0.14.1/0.14.2 (which might
have been fixed) ship custom ops that need glibc 2.38, so on Debian 12 we pin
lingvo 0.14.0 + TensorFlow 2.15.1 and register the module under its old name.

When it can go: once the project moves to a Lingvo release that imports the new
path (or to a TensorFlow that still has the old one). Then delete this module,
``lingvo_alias.py`` and their imports (``gpipe/__init__.py`` installs the
alias's finder); nothing else depends on them.

Every module of the library that uses TensorFlow or Lingvo, every tool and
every test imports it first; it is idempotent. ``import gpipe`` itself does
not (its pure layers import without TensorFlow): it installs the lazy form of
the same alias (``gpipe.compat.lingvo_alias.InstallFinder``), so Lingvo
imported after ``gpipe`` still works, without the noise filter below.

Being first, it also imports TensorFlow through gpipe.compat.quiet_import,
which drops TensorFlow's CUDA plugin registration noise from stderr; keep
that call (in the modules that import this one) when deleting this module.
"""

from gpipe.compat import lingvo_alias
from gpipe.compat import quiet_import

# Before anything imports TensorFlow, so its import noise is filtered.
quiet_import.ImportTensorFlowQuietly()
lingvo_alias.Register()
