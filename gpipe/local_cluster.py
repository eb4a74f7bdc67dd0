"""Moved to gpipe.runtime.local_cluster; this old path stays importable.

The module object is the same one under both names, so a change to one (a
test replacing ``LocalCluster``) is seen through the other.
"""

import sys

from gpipe.runtime import local_cluster as _moved

sys.modules[__name__] = _moved
