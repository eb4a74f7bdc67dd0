"""Moved to gpipe.measure.memory; this path is kept for one release."""

import sys

from gpipe.measure import memory as _moved

sys.modules[__name__] = _moved
