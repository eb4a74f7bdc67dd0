"""A CPU quota for running processes: a Linux cgroup (v1) of their own.

``CpuQuota(name, cores)`` makes a child cgroup of this process's cpu cgroup
whose processes together get at most ``cores`` CPUs' time
(``cpu.cfs_quota_us`` = cores x ``cpu.cfs_period_us``); ``Add(pid)`` moves a
running process there with all its threads. A throttled, shared or
degraded host, on one machine: what the tests and the benchmark of the
trainer's rebalancing (``--elastic``) run a worker under. A short period
(10 ms by default) spreads the throttling evenly over short tasks instead of
stopping the process for most of each 100 ms.

Needs the cgroup v1 cpu controller mounted read-write (usually at
``/sys/fs/cgroup/cpu``) and the right to create cgroups under this
process's own (root, or a delegated subtree).
"""

import os

from gpipe.runtime import cgroups

PERIOD_US = 10000


class CpuQuotaError(RuntimeError):
  """The CPU quota cannot be set up on this host."""


class CpuQuota:
  """A cgroup whose processes get at most `cores` CPUs' time together."""

  def __init__(self, name, cores, period_us=PERIOD_US):
    """Creates the cgroup and sets its quota.

    Args:
      name: the cgroup's directory name (unique on the host).
      cores: CPUs' worth of time per period, > 0 (0.5: half a core).
      period_us: the accounting period in microseconds (1000 to 1000000).

    Raises:
      CpuQuotaError: no usable cgroup v1 cpu controller, or a quota the
        kernel refuses.
    """
    if cores <= 0:
      raise CpuQuotaError('a CPU quota must be > 0 cores; got %r' % cores)
    self.cores = cores
    self.path = os.path.join(
        cgroups.ParentDirectory('cpu', 'a CPU quota', CpuQuotaError), name)
    try:
      os.makedirs(self.path, exist_ok=True)
      cgroups.Write(os.path.join(self.path, 'cpu.cfs_period_us'),
                    int(period_us))
      cgroups.Write(os.path.join(self.path, 'cpu.cfs_quota_us'),
                    max(1000, int(cores * period_us)))
    except OSError as e:
      self.Remove()
      raise CpuQuotaError('could not set a CPU quota of %g core(s) in %s: %s'
                          % (cores, self.path, e)) from e

  def Add(self, pid):
    """Moves process `pid` (all its threads) into the cgroup."""
    try:
      cgroups.Write(os.path.join(self.path, 'cgroup.procs'), int(pid))
    except OSError as e:
      raise CpuQuotaError('could not put process %d under the CPU quota in '
                          '%s: %s' % (pid, self.path, e)) from e

  def ThrottledSeconds(self):
    """How long the kernel held the cgroup's processes back (None if gone)."""
    try:
      text = cgroups.Read(os.path.join(self.path, 'cpu.stat'))
    except OSError:
      return None
    for line in text.splitlines():
      fields = line.split()
      if len(fields) == 2 and fields[0] == 'throttled_time':
        return int(fields[1]) * 1e-9
    return None

  def Release(self):
    """Moves the cgroup's processes back to this process's cpu cgroup."""
    parent = os.path.dirname(self.path)
    try:
      pids = cgroups.Read(os.path.join(self.path, 'cgroup.procs')).split()
    except OSError:
      return
    for pid in pids:
      try:
        cgroups.Write(os.path.join(parent, 'cgroup.procs'), pid)
      except OSError:
        pass  # Gone meanwhile.

  def Remove(self, timeout=5.0):
    """Releases the processes and removes the cgroup (idempotent)."""
    self.Release()
    cgroups.Remove(self.path, timeout)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Remove()
