"""Moved to gpipe.compat.lingvo_gpipe; this path is kept for one release."""

import sys

from gpipe.compat import lingvo_gpipe as _moved

sys.modules[__name__] = _moved
