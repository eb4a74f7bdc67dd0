"""tools/trainer/members.py: the slots of an elastic run, without servers."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import subprocess
import types

from gpipe.runtime import local_cluster
from lingvo.core import test_utils
from tools.trainer import members as members_lib

_ADDRESSES = ['localhost:1', 'localhost:2', 'localhost:3']


def _Placement(addresses):
  """A running cluster's placement as Members reads it: 2 CPUs a task."""
  return types.SimpleNamespace(
      cluster=None, remote=types.SimpleNamespace(addresses=list(addresses)),
      task_devices=[['/job:worker/replica:0/task:%d/device:CPU:%d' % (i, d)
                     for d in range(2)] for i in range(len(addresses))],
      device_type='CPU')


def _Members(test):
  """Members of a cluster file of _ADDRESSES: (members, path, its lines)."""
  path = os.path.join(test.create_tempdir().full_path, 'cluster')
  with open(path, 'w') as f:
    f.write('worker=' + ','.join(_ADDRESSES))
  lines = []
  members = members_lib.Members(_Placement(_ADDRESSES), echo=lines.append,
                                spec_file=path)
  return members, path, lines


class MembersRereadTest(test_utils.TestCase):

  def testATaskInUseListedAtANewAddressIsLostAndStaysInUse(self):
    members, path, lines = _Members(self)
    members.Use(members.slots[:2], members.slots)
    with open(path, 'w') as f:
      f.write('worker=localhost:1,localhost:9,localhost:3')
    members.Reread()
    moved = members.slots[1]
    self.assertEqual('localhost:9', moved.address)
    self.assertIsNone(moved.devices)
    self.assertEqual(members_lib.LOST, moved.state)
    # Never a slot in use (or spare) without devices: the sums hold.
    for slot in members.In(members_lib.USED, members_lib.SPARE):
      self.assertIsNotNone(slot.devices, slot.Describe())
    self.assertEqual([0, 1], [s.index for s in members.InUse()])
    self.assertEqual(2, members.Devices(members.InUse()))
    self.assertIn('task 1 listed at localhost:9 now', '\n'.join(lines))

  def testASpareListedAtANewAddressIsLostAndNotInUse(self):
    members, path, _ = _Members(self)
    members.Use(members.slots[:2], members.slots)
    with open(path, 'w') as f:
      f.write('worker=localhost:1,localhost:2,localhost:8')
    members.Reread()
    self.assertEqual(members_lib.LOST, members.slots[2].state)
    self.assertEqual([0, 1], [s.index for s in members.InUse()])
    self.assertEqual(4, members.Devices(members.In(members_lib.USED)))


class MembersFlappingTest(test_utils.TestCase):

  def testAServerLostThreeTimesIsNotTakenBackUntilReplaced(self):
    members, path, lines = _Members(self)
    down = set()
    members.Reason = lambda slot: 'down' if slot.index in down else None
    members._Discover = lambda slot: ['/job:worker/replica:0/task:2/'
                                      'device:CPU:%d' % d for d in range(2)]
    slot = members.slots[2]
    for loss in range(1, members_lib.MAX_LOSSES + 1):
      # Lost: waited for (not back in time), then back and taken as spare.
      down.add(2)
      self.assertEqual([slot], members.AwaitRemote([slot], 0.0))
      members.Lose([slot])
      self.assertEqual(loss, slot.losses)
      down.discard(2)
      joined = members.Join([slot])
      self.assertEqual([] if loss == members_lib.MAX_LOSSES else [slot],
                       joined)
    # The third loss was not waited for, and said why.
    self.assertEqual(members_lib.MAX_LOSSES - 1, sum(
        'waiting up to' in line for line in lines))
    self.assertIn('elastic: task 2 at localhost:3 was lost 3 times in 30 min: '
                  'it is not taken back at this address', '\n'.join(lines))
    self.assertEqual(members_lib.LOST, slot.state)
    # Losses older than the window are forgotten.
    slot.loss_times[0] -= members_lib.FLAP_WINDOW_SECS
    self.assertEqual(2, slot.losses)
    self.assertEqual([slot], members.Join([slot]))
    slot.state = members_lib.LOST
    slot.loss_times.append(slot.loss_times[-1])
    # A replacement at another address is taken.
    with open(path, 'w') as f:
      f.write('worker=localhost:1,localhost:2,localhost:7')
    members.Reread()
    self.assertEqual([slot], members.Join([slot]))
    self.assertEqual((0, members_lib.SPARE), (slot.losses, slot.state))


class MembersLoseTest(test_utils.TestCase):

  def testAWedgedLocalWorkerGivenUpOnIsKilled(self):
    # Three local "workers" (processes that run but serve nothing): losing
    # 1 kills it; losing 2 after it exited says nothing.
    cluster = object.__new__(local_cluster.LocalCluster)
    cluster._procs = [subprocess.Popen(['sleep', '60']) for _ in range(3)]
    cluster.cluster_def = {'worker': list(_ADDRESSES)}
    cluster._caps = []
    try:
      placement = _Placement(_ADDRESSES)
      placement.cluster = cluster
      lines = []
      members = members_lib.Members(placement, echo=lines.append)
      members.Lose([members.slots[1]])
      self.assertIsNotNone(cluster._procs[1].poll())
      self.assertIsNone(cluster._procs[0].poll())
      self.assertEqual(['elastic: killed task 1 (pid %d): it runs but does '
                        'not serve' % cluster._procs[1].pid], lines)
      cluster._procs[2].kill()
      cluster._procs[2].wait()
      members.Lose([members.slots[2]])
      self.assertLen(lines, 1)
      self.assertEqual([members_lib.LOST] * 2,
                       [s.state for s in members.slots[1:]])
    finally:
      for proc in cluster._procs:
        proc.kill()
        proc.wait()


if __name__ == '__main__':
  test_utils.main()
