"""Moved to gpipe.measure.param_count; this path is kept for one release."""

import sys

from gpipe.measure import param_count as _moved

sys.modules[__name__] = _moved
