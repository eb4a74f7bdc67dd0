"""Deprecated: moved to ``gpipe.lingvo_adapter``; kept for one release.

Lingvo's GPipe adapter (``FromLingvo``) runs on the executor, so it lives
beside it (``gpipe/lingvo_adapter.py``); ``compat/`` is the bottom layer and
imports nothing above it. This path hands out the very same module object
(its classes, including the subclasses ``FromLingvo`` creates, resolve under
both names) and warns on import. It will be deleted in the next release.
"""

import sys
import warnings

from gpipe import lingvo_adapter as _moved

warnings.warn(
    'gpipe.compat.lingvo_gpipe is deprecated: use gpipe.lingvo_adapter (or '
    'gpipe.FromLingvo)', DeprecationWarning, stacklevel=2)

sys.modules[__name__] = _moved
