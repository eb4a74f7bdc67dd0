"""The trainer binary, sending itself signals at chosen moments of a run.

``python -m tests.trainer_signal_probe --probe_signals=SIGTERM@step5
<trainer flags>`` runs ``tools.trainer`` and sends it SIGTERM (os.kill, as
``kill`` would) while its 5th training step is in its session run: the run
has returned, its update is applied, but the trainer has not got the result
yet. That is where a signal usually lands (a step spends its time in the
session run) and where it is hard to hit from outside: the signal is sent,
then the run holds its result for --probe_hold_secs so that the trainer
handles the signal before it sees the step end.

Moments (NAME@MOMENT, comma-separated, in the order sent):

* ``stepN``: in the session run of the Nth training step this process runs
  (a resumed run counts from 1 again);
* ``ckptN``: in the saving of the checkpoint of global step N, periodic or
  at exit (after its files are written).

The same moment twice (``SIGINT@step1,SIGINT@step1``) sends both, in turn.
SIGINT is reset to Python's KeyboardInterrupt first, as in an interactive
shell: a test runner may start processes with SIGINT ignored, which the
trainer respects. tests/trainer_signal_test.py runs this binary.
"""

import collections
import os
import signal
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import app
from absl import flags
from lingvo import compat as tf
from tools.trainer import checkpoints
from tools.trainer import cli

flags.DEFINE_list('probe_signals', [],
                  'NAME@MOMENT: send signal NAME at MOMENT (module docstring).')
flags.DEFINE_float('probe_hold_secs', 0.5,
                   'How long the call holds its result after each signal.')

FLAGS = flags.FLAGS

# MOMENT: the signals to send there, in order.
_PLAN = collections.defaultdict(list)
_STEPS_RUN = [0]


def _Send(moment):
  for name in _PLAN.pop(moment, []):
    os.kill(os.getpid(), signal.Signals[name])
    time.sleep(FLAGS.probe_hold_secs)


_REAL_RUN = tf.compat.v1.Session.run


def _Run(self, fetches, *args, **kwargs):
  result = _REAL_RUN(self, fetches, *args, **kwargs)
  if isinstance(fetches, dict) and 'train' in fetches:
    _STEPS_RUN[0] += 1
    _Send('step%d' % _STEPS_RUN[0])
  return result


_REAL_SAVE = checkpoints.Checkpointer.Save


def _Save(self, sess, step, options=None):
  path = _REAL_SAVE(self, sess, step, options=options)
  _Send('ckpt%d' % step)
  return path


def main(argv):
  for entry in FLAGS.probe_signals:
    name, moment = entry.split('@')
    _PLAN[moment].append(name)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  tf.compat.v1.Session.run = _Run
  checkpoints.Checkpointer.Save = _Save
  return cli.main(argv)


if __name__ == '__main__':
  app.run(main)
