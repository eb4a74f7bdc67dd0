"""Deprecated: renamed ``gpipe.plan.profiling``; kept for one release.

"measure" also names ``gpipe/measure/`` (what a traced step did: its
timeline and memory), so the planner's profiling module has the name of what
it does. This path hands out the very same module object and warns on
import. It will be deleted in the next release.
"""

import sys
import warnings

from gpipe.plan import profiling as _moved

warnings.warn(
    'gpipe.plan.measure is deprecated: use gpipe.plan.profiling',
    DeprecationWarning, stacklevel=2)

sys.modules[__name__] = _moved
