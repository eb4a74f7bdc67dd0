"""An elastic run's tasks: which serve, their devices, their replacements.

``--elastic`` knows each task of the run by its index in the cluster
description, or among the local workers (a *slot*: 'task 2'), whatever
address it serves at now. ``Members`` holds the slots and their states
(USED: running stages, SPARE: serving but not needed, LOST: not answering)
and finds out:

* who serves (``Reasons``: a local worker's process, then
  ``gpipe.runtime.liveness.Probe`` of its address, in parallel);
* what a server back at a new address, or a new task, has
  (``Join``: its devices through a session of its own, the run's type and
  count);
* what the cluster file of ``--cluster_spec=@path`` says now
  (``Reread``: a task listed at a new address is a replacement of that
  task, not a stranger; tasks listed after the last are new);
* after a loss: a local worker restarted in its place while
  ``--max_worker_restarts`` allows (``RestartLocal``), or the servers of a
  running cluster waited for up to ``--worker_wait_secs``
  (``AwaitRemote``).
"""

import concurrent.futures
import dataclasses
import threading
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import devices as devices_lib
from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from gpipe.runtime import memory_cap
from gpipe.runtime import session_cluster as session_cluster_lib
from lingvo import compat as tf

# A task's states: running stages, serving but not used, not answering.
USED, SPARE, LOST = 'used', 'spare', 'lost'
# A server lost this many times at one address within FLAP_WINDOW_SECS is
# not taken back (a flapping host: each return would cost the run a move,
# each loss a recovery); older losses are forgotten, and a replacement at
# another address starts afresh.
MAX_LOSSES = 3
FLAP_WINDOW_SECS = 1800.0
# How long one probe of a task may take.
PROBE_SECS = 3.0


@dataclasses.dataclass
class Slot:
  """A task of the run, by its index in the cluster (or local workers).

  Attributes:
    index: its task index in the description ('task 2').
    address: 'host:port' it serves at now.
    devices: its devices as it names them (full device strings), the type
      and count the run uses; None until it was asked.
    state: USED, SPARE or LOST.
    loss_times: when it was lost at this address (time.time()).
  """
  index: int
  address: str
  devices: list
  state: str = USED
  loss_times: list = dataclasses.field(default_factory=list)

  @property
  def losses(self):
    """Its losses at this address within the last FLAP_WINDOW_SECS."""
    now = time.time()
    return sum(now - t < FLAP_WINDOW_SECS for t in self.loss_times)

  @property
  def name(self):
    return 'task %d' % self.index

  def Describe(self):
    return 'task %d at %s' % (self.index, self.address)


class Members:
  """The slots of an elastic run (see the module docstring)."""

  def __init__(self, placement, echo=print, spec_file=None,
               connect_timeout_secs=10.0):
    """All tasks of the placement, in use.

    Args:
      placement: the run's placement.Placement (local workers or a running
        cluster), its devices as the servers name them.
      echo: prints a console line.
      spec_file: the cluster file of --cluster_spec=@path, or None.
      connect_timeout_secs: the longest asking a server for its devices may
        take.
    """
    self._placement = placement
    self.local = placement.cluster
    self._echo = echo
    self._spec_file = spec_file
    self._timeout = connect_timeout_secs
    self.lock = threading.RLock()
    addresses = (self.local.cluster_def['worker'] if self.local is not None
                 else placement.remote.addresses)
    self.slots = [Slot(i, a, list(placement.task_devices[i]))
                  for i, a in enumerate(addresses)]
    # The slots the run's session runs on (set by Use), whatever their
    # state now: one the cluster file moved is LOST but still in use.
    self._in_use = {s.index for s in self.slots}
    self._spec_text = self._ReadSpec() if spec_file else None

  def In(self, *states):
    """The slots in any of `states`, in task order."""
    with self.lock:
      return [s for s in self.slots if s.state in states]

  def InUse(self):
    """The slots the run's session runs on (the last Use), in task order.

    Returns:
      The slots, whatever their state now: a slot the cluster file moved to
      a new address (Reread) is LOST, but the session still runs on it.
    """
    with self.lock:
      return [s for s in self.slots if s.index in self._in_use]

  @staticmethod
  def Devices(slots):
    """How many devices `slots` have, counting only the known ones.

    Args:
      slots: Slots; one whose devices were not asked yet adds none.

    Returns:
      The number of devices.
    """
    return sum(len(s.devices) for s in slots if s.devices is not None)

  def Describe(self):
    """'task 0, task 2 (spare: task 3)': the tasks in use, and the spares."""
    used = [s.name for s in self.In(USED)]
    spare = [s.name for s in self.In(SPARE)]
    return ', '.join(used) + (' (spare: %s)' % ', '.join(spare)
                              if spare else '')

  def Use(self, used, given):
    """Marks `used` slots USED and the rest of `given` SPARE."""
    used_ids = {s.index for s in used}
    given_ids = {s.index for s in given}
    with self.lock:
      self._in_use = used_ids
      for slot in self.slots:
        if slot.index in used_ids:
          slot.state = USED
        elif slot.index in given_ids:
          slot.state = SPARE

  def Lose(self, slots):
    """Marks `slots` lost; a local worker among them that still runs (wedged:
    alive but not answering) is killed, so that it frees its core and memory
    and a later probe cannot count it back."""
    with self.lock:
      for slot in slots:
        slot.state = LOST
    if self.local is not None:
      for slot in slots:
        if self.local.KillWorker(slot.index):
          self._echo('elastic: killed %s (pid %d): it runs but does not '
                     'serve' % (slot.name, self.local.pids[slot.index]))

  def Reason(self, slot):
    """None if the slot's server serves now, else why not."""
    if self.local is not None:
      try:
        self.local.CheckAlive([slot.index])
      except local_cluster.WorkerDiedError as e:
        return str(e)
    return liveness.Probe(slot.address, PROBE_SECS)

  def Reasons(self, slots):
    """{slot index: reason or None}, probed in parallel."""
    if not slots:
      return {}
    with concurrent.futures.ThreadPoolExecutor(len(slots)) as pool:
      reasons = list(pool.map(self.Reason, slots))
    return {s.index: r for s, r in zip(slots, reasons)}

  def Serving(self, slots):
    """Those of `slots` that serve now."""
    reasons = self.Reasons(slots)
    return [s for s in slots if reasons[s.index] is None]

  def _Discover(self, slot):
    """The devices of a server back at a new address (or a new task)."""
    names = session_cluster_lib.SessionCluster([slot.address]).ListDevices(
        self._timeout)
    per_task = len(self.slots[0].devices) if self.slots[0].devices else 0
    return devices_lib.SelectDevices([names], self._placement.device_type,
                                     per_task)[0]

  def _ReadSpec(self):
    try:
      return cluster_spec_lib.ReadSpecFile(self._spec_file)
    except cluster_spec_lib.ClusterSpecError as e:
      self._echo('elastic: warning: %s' % e)
      return None

  def Reread(self):
    """Re-reads the cluster file: a task at a new address, or a new task.

    A task listed at a new address is a replacement of that task: lost
    (its devices unknown) until the new address serves and says its devices
    (Join, AwaitRemote), whether it was spare or in use. One in use stays in
    InUse: the run's session goes on at the old address until a step fails,
    and the loss path (Elastic.AfterLoss) waits for it there. Tasks no
    longer listed stay as they are (a task in use that is gone is noticed
    at the next step).
    """
    if not self._spec_file:
      return
    text = self._ReadSpec()
    if text is None or text == self._spec_text:
      return
    self._spec_text = text
    try:
      workers = cluster_spec_lib.Parse(text, '--cluster_spec=@%s' %
                                       self._spec_file).workers
    except cluster_spec_lib.ClusterSpecError as e:
      self._echo('elastic: warning: %s' % e)
      return
    with self.lock:
      for i, address in enumerate(workers):
        if i < len(self.slots):
          slot = self.slots[i]
          if slot.address != address:
            self._echo('elastic: %s listed at %s now (was %s), in %s' %
                       (slot.name, address, slot.address, self._spec_file))
            # Never USED without devices: counted as lost until asked.
            slot.address, slot.devices, slot.state = address, None, LOST
            slot.loss_times = []
        else:
          self._echo('elastic: task %d at %s added in %s' %
                     (i, address, self._spec_file))
          self.slots.append(Slot(i, address, None, LOST))

  def _Ask(self, slot):
    """True once the slot's devices are known (asked for if need be)."""
    if slot.devices is not None:
      return True
    try:
      slot.devices = self._Discover(slot)
      return True
    except (tf.errors.OpError, devices_lib.DiscoveryError) as e:
      self._echo('elastic: %s serves, but its devices: %s' %
                 (slot.Describe(), str(e).splitlines()[0]))
      return False

  def Join(self, slots):
    """Marks the serving ones of `slots` spare (devices asked for); theirs.

    A slot lost MAX_LOSSES times at its address is not taken back.
    """
    joined = []
    slots = [s for s in slots if s.losses < MAX_LOSSES]
    for slot in self.Serving(slots):
      if self._Ask(slot):
        slot.state = SPARE
        joined.append(slot)
    return joined

  def RestartLocal(self, lost, max_worker_restarts):
    """Restarts lost local workers while allowed; the ones still lost."""
    still = []
    placement = self._placement
    for slot in lost:
      if placement.restarts >= max_worker_restarts:
        still.append(slot)
        continue
      placement.restarts += 1
      self._echo('elastic: restarting %s (restart %d of %d, '
                 '--max_worker_restarts)' % (slot.name, placement.restarts,
                                             max_worker_restarts))
      try:
        self.local.ReplaceWorker(slot.index)
      except (local_cluster.WorkerDiedError, memory_cap.MemoryCapError,
              RuntimeError, OSError) as e:
        self._echo('elastic: %s could not be restarted: %s' % (slot.name, e))
        still.append(slot)
        continue
      slot.address = self.local.cluster_def['worker'][slot.index]
      self._echo('elastic: %s restarted at %s (pid %d)' % (
          slot.name, slot.address, self.local.pids[slot.index]))
    return still

  def AwaitRemote(self, lost, wait_secs, poll_secs=0.5):
    """Waits for lost servers (or replacements in the file); still lost.

    Each call counts a loss of each slot at its address; one lost
    MAX_LOSSES times there within FLAP_WINDOW_SECS (a flapping host) is not
    waited for, nor taken back later (Join) until its losses age out.
    """
    for slot in lost:
      slot.loss_times.append(time.time())
      if slot.losses == MAX_LOSSES:
        self._echo('elastic: %s was lost %d times in %.0f min: it is not '
                   'taken back at this address for now (a replacement at '
                   'another one is)' % (slot.Describe(), slot.losses,
                                        FLAP_WINDOW_SECS / 60))
    flapping = [s for s in lost if s.losses >= MAX_LOSSES]
    lost = [s for s in lost if s.losses < MAX_LOSSES]
    if not lost:
      return flapping
    self._echo('elastic: waiting up to %g s (--worker_wait_secs) for %s to '
               'serve again' % (wait_secs, ', '.join(s.name for s in lost)))
    start = time.time()
    deadline = start + wait_secs
    while True:
      self.Reread()
      for slot in self.Serving(lost):
        if self._Ask(slot):
          self._echo('elastic: %s serves again after %.1f s' %
                     (slot.Describe(), time.time() - start))
          lost = [s for s in lost if s is not slot]
      if not lost or time.time() >= deadline:
        return lost + flapping
      time.sleep(min(poll_secs, max(0.0, deadline - time.time())))
