"""What the workers' fork server imports once (gpipe.runtime.forked_workers).

TensorFlow, Lingvo's custom ops and the worker binary: everything a local
worker imports before it serves. TensorFlow's C++ log level is set first, as
LocalCluster sets it for a worker started as a command.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,unused-import
from gpipe.runtime import worker
