"""Waiting in tests: poll a condition up to a deadline, never a fixed sleep.

A test that waits for another process (a trainer writing its checkpoint, a
killed worker being noticed) polls for the state it needs with ``WaitUntil``
and fails with a message that says what it waited for, for how long, and
what the process printed, instead of sleeping a fixed time and hoping.

Under Bazel every wait is also capped by the test's own time limit
(``TEST_TIMEOUT``, set by its size): a slow run fails here, saying what it
was waiting for, a little before Bazel would kill it without a word.
"""

import os
import time

# When this module was imported: close to the start of the test process,
# which is when Bazel's TEST_TIMEOUT clock starts.
_STARTED = time.monotonic()

# Seconds kept back from Bazel's limit to report the failure and clean up.
_MARGIN_SECS = 30.0


def RemainingSecs(default=None):
  """Seconds left before Bazel's time limit of this test, minus a margin.

  Args:
    default: what to return when the test does not run under Bazel (no
      ``TEST_TIMEOUT`` in the environment).

  Returns:
    The seconds, at least 1; `default` outside Bazel.
  """
  limit = os.environ.get('TEST_TIMEOUT')
  if not limit:
    return default
  left = float(limit) - (time.monotonic() - _STARTED) - _MARGIN_SECS
  return max(left, 1.0)


def TimeLimit(secs):
  """`secs`, or less if Bazel's limit for this test comes sooner.

  Args:
    secs: the longest a step of the test should take.

  Returns:
    (seconds, reason): the seconds to allow and a phrase naming the limit
    that set them, for failure messages.
  """
  remaining = RemainingSecs()
  if remaining is not None and remaining < secs:
    return remaining, ("Bazel's limit for this test (TEST_TIMEOUT=%s s) "
                       'less a %.0f s margin' %
                       (os.environ['TEST_TIMEOUT'], _MARGIN_SECS))
  return secs, 'the test allows %g s' % secs


def WaitUntil(ready, what, timeout_secs=240.0, interval_secs=0.05,
              process=None, details=None):
  """Polls `ready()` until it returns a true value, up to a deadline.

  Args:
    ready: a callable polled until it returns a true value.
    what: what is awaited, for the failure message (e.g. 'a checkpoint').
    timeout_secs: give up after this many seconds (less if Bazel's limit of
      the test comes sooner, see ``TimeLimit``).
    interval_secs: the pause between two polls.
    process: an optional ``subprocess.Popen`` that must keep running while
      waiting: its exit fails the wait at once.
    details: an optional callable returning text for the failure message
      (e.g. the process's log).

  Returns:
    The true value `ready()` returned.

  Raises:
    AssertionError: `process` exited, or the deadline passed, before
      `ready()` was true; the message names `what`, the seconds waited and
      `details()`.
  """
  limit, reason = TimeLimit(timeout_secs)
  start = time.monotonic()
  while True:
    value = ready()
    if value:
      return value
    waited = time.monotonic() - start
    if process is not None and process.poll() is not None:
      raise AssertionError(
          'the process (pid %d) exited with code %s after %.1f s, while '
          'waiting for %s%s' % (process.pid, process.returncode, waited, what,
                                _Details(details)))
    if waited >= limit:
      raise AssertionError('gave up waiting for %s after %.1f s (%s)%s' %
                           (what, waited, reason, _Details(details)))
    time.sleep(interval_secs)


def _Details(details):
  if details is None:
    return ''
  return ':\n' + details()
