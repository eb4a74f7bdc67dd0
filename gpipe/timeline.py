"""Moved to gpipe.measure.timeline; this path is kept for one release."""

import sys

from gpipe.measure import timeline as _moved

sys.modules[__name__] = _moved
