"""The worker command's entry point: ``python -m gpipe.worker``.

Runs ``gpipe.runtime.worker.main``; its flags are documented there.
"""

import sys

from gpipe.runtime.worker import main

if __name__ == '__main__':
  sys.exit(main())
