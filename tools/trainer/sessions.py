"""Sessions that cannot simply be closed: those of lost or departing workers.

Closing a distributed session is a call to every task it ran on: with a
task lost it can wait until gRPC gives up, or for ever. The trainer leaves
such sessions open (``Abandon``) or closes them in a thread of its own while
it goes on (``CloseOrAbandon``, for ``--elastic``, whose surviving tasks
free an ended session's variables only when it is closed), and exits
without the interpreter's cleanup while any is open or still closing
(``AbandonedSessions``; tools/trainer/cli.py).
"""

from gpipe.runtime import background

# Sessions left open on purpose (see Abandon).
ABANDONED = []
# Closes still running, each in its own daemon thread (see CloseOrAbandon).
CLOSING = []
# How long CloseOrAbandon waits for a close before it goes on beside it.
CLOSE_SECS = 1.0


def Abandon(sess):
  """Leaves `sess` open: the process ends without closing it."""
  ABANDONED.append(sess)


def AbandonedSessions():
  """Sessions left open or still closing (finished closes are dropped)."""
  CLOSING[:] = [call for call in CLOSING if not call.done]
  return len(ABANDONED) + len(CLOSING)


def CloseOrAbandon(sess, timeout_secs=None):
  """Closes `sess` in a daemon thread, waiting for it a moment at most.

  Args:
    sess: the tf.compat.v1.Session that a run ended in.
    timeout_secs: how long to wait for the close (None: CLOSE_SECS).

  Returns:
    True if the close returned in that time (with or without an error);
    False if it runs on: AbandonedSessions() counts it until it returns.
  """
  call = background.BackgroundCall(sess.close, name='closing a session')
  CLOSING[:] = [c for c in CLOSING if not c.done] + [call]
  return call.Wait(CLOSE_SECS if timeout_secs is None else timeout_secs)
