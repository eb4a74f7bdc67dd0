"""Runs the benchmark: ``python -m tools.benchmark SUBCOMMAND [flags]``.

Also the main of ``bazel run //tools/benchmark -- SUBCOMMAND [flags]``; see
the package docstring for the subcommands.
"""

import os
import sys

from tools.benchmark import cli

if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.exit(cli.main())
