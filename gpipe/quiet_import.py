"""Moved to gpipe.compat.quiet_import; this path is kept for one release."""

import sys

from gpipe.compat import quiet_import as _moved

sys.modules[__name__] = _moved
