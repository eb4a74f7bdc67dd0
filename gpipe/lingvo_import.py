"""Moved to gpipe.compat.lingvo_import; this path is kept for one release.

Importing it still makes Lingvo importable on TensorFlow 2.15 first.
"""

import sys

from gpipe.compat import lingvo_import as _moved

sys.modules[__name__] = _moved
