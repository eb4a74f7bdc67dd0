"""Runs the planner: ``python -m tools.plan --model=... [flags]``.

Also the main of ``bazel run //tools/plan -- --model=...``; see the
package docstring.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
from tools.plan import cli

if __name__ == '__main__':
  sys.exit(cli.main())
