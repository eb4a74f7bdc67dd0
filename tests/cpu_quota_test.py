"""A CPU quota for a running process (gpipe/runtime/cpu_quota.py)."""

import os
import subprocess
import sys

from absl.testing import absltest
from gpipe.runtime import cgroups
from gpipe.runtime import cpu_quota

# Counts loop rounds for 1.5 s of wall time, then prints the count.
_SPIN = ('import time\nend = time.time() + 1.5\nn = 0\n'
         'while time.time() < end: n += 1\nprint(n)')


def _Available():
  try:
    cgroups.ParentDirectory('cpu', 'this test', cpu_quota.CpuQuotaError)
    return None
  except cpu_quota.CpuQuotaError as e:
    return str(e)


class CpuQuotaTest(absltest.TestCase):

  def testAThrottledProcessGetsLessTime(self):
    reason = _Available()
    if reason:
      self.skipTest(reason)
    free = subprocess.Popen([sys.executable, '-c', _SPIN],
                            stdout=subprocess.PIPE, text=True)
    held = subprocess.Popen([sys.executable, '-c', _SPIN],
                            stdout=subprocess.PIPE, text=True)
    with cpu_quota.CpuQuota('gpipe_quota_test_held_%d' % os.getpid(),
                            0.2) as quota:
      quota.Add(held.pid)
      rounds_free = int(free.communicate()[0])
      rounds_held = int(held.communicate()[0])
      self.assertGreater(quota.ThrottledSeconds(), 0.1)
    # At most a fifth of a core, against whatever the other one got.
    self.assertLess(rounds_held, 0.7 * rounds_free)
    self.assertFalse(os.path.exists(quota.path))

  def testErrors(self):
    with self.assertRaisesRegex(cpu_quota.CpuQuotaError, '> 0 cores'):
      cpu_quota.CpuQuota('x', 0)
    with self.assertRaisesRegex(cgroups.CgroupError,
                                'cgroup v1 no_such controller'):
      cgroups.ParentDirectory('no_such', 'a test')
    reason = _Available()
    if reason:
      return
    with cpu_quota.CpuQuota('gpipe_quota_test_whole_%d' % os.getpid(),
                            1) as quota:
      with self.assertRaisesRegex(cpu_quota.CpuQuotaError,
                                  'could not put process 999999999'):
        quota.Add(999999999)


if __name__ == '__main__':
  absltest.main()
