"""The worker binary's old path: ``python -m gpipe.worker`` runs
gpipe.runtime.worker (see there for its flags)."""

import sys

from gpipe.runtime.worker import main

if __name__ == '__main__':
  sys.exit(main())
