"""Trains decode_testlib's copy model and saves its weights to PREFIX.

``python -m tests.decode_checkpoint PREFIX`` writes PREFIX.index and
PREFIX.data-00000-of-00001. The genrule //tests:copy_model_checkpoint runs it
once per build for the tests that decode the model
(``decode_testlib.TrainedCheckpoint``), instead of each training it.
"""

import sys

from tests import decode_testlib


def main(argv):
  if len(argv) != 2:
    print('usage: decode_checkpoint PREFIX', file=sys.stderr)
    return 2
  decode_testlib.Train(argv[1])
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
