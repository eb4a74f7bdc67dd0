"""Local workers forked from one fork server (gpipe.runtime.forked_workers).

Every worker of a LocalCluster is a fork of one process that imported
TensorFlow once, not a child of the launcher: it serves, runs the session's
ops on its own devices, is pinned to its core, writes its log, is reported
with its exit code when killed (also to threads asking at once), is
replaced by another fork, and exits with its launcher. A fork server killed
by a signal to the launcher's group leaves its workers known and killable.
A launcher script without a main guard is not run again in its workers.
With GPIPE_FORK_WORKERS=0 the workers are commands again. A program (the
trainer in the tests) forked from a fork server that imported it runs as
its command would: its flags, directory, environment, outputs, exit code,
threads and exit functions; its workers are forks of a fork server of its
own, itself a fork.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from unittest import mock

from gpipe.runtime import child_env
from gpipe.runtime import forked_workers
from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import polling
from tests import procfs
from tests import trainer_testlib


_Parent = procfs.Parent
_CommandLine = procfs.CommandLine


class ForkedWorkersTest(test_utils.TestCase):

  def _TaskValues(self, cluster):
    """Each worker adds 1 on its own device; the values and devices."""
    with tf.Graph().as_default() as graph:
      outs = []
      for i, device in enumerate(cluster.devices):
        with tf.device(device):
          outs.append(tf.constant(float(i)) + 1.0)
      with tf.Session(cluster.target, graph=graph) as sess:
        return sess.run(outs)

  def setUp(self):
    super().setUp()
    if not forked_workers.Supported():
      self.skipTest('workers are not forked here (%s=0, or no pidfd)' %
                    forked_workers.ENV)
    # A fork server that failed earlier in this process fails the test.
    self.assertTrue(forked_workers.Enabled(), forked_workers._failed)  # pylint: disable=protected-access

  def testWorkersAreForksOfOneServerThatServeAndLog(self):
    logs = tempfile.mkdtemp()
    with local_cluster.LocalCluster(2, log_dir=logs) as cluster:
      server = _Parent(cluster.pids[0])
      self.assertEqual(server, _Parent(cluster.pids[1]))
      self.assertEqual(os.getpid(), _Parent(server))
      self.assertIn('-m gpipe.runtime.fork_server', _CommandLine(server))
      # The server and each worker in a session of its own: a signal to the
      # launcher's process group reaches neither.
      self.assertEqual(server, os.getsid(server))
      self.assertEqual(cluster.pids[1], os.getsid(cluster.pids[1]))
      self.assertEqual([1.0, 2.0], self._TaskValues(cluster))
      with open(os.path.join(logs, 'worker_1.log')) as f:
        self.assertIn('gpipe worker worker:1 serving at grpc://localhost:%d' %
                      cluster.ports[1], f.read())

      # A killed worker is named with its exit code, and a replacement is
      # another fork of the same server that serves in its place.
      os.kill(cluster.pids[1], signal.SIGKILL)
      with self.assertRaisesRegex(local_cluster.WorkerDiedError,
                                  r'pipeline worker 1 \(pid %d, .*\) exited '
                                  r'with code -9' % cluster.pids[1]):
        polling.WaitUntil(lambda: cluster.CheckAlive() and False,
                          'worker 1 to be reported', timeout_secs=20)
      cluster.ReplaceWorker(1)
      self.assertEqual(server, _Parent(cluster.pids[1]))
      self.assertIsNone(liveness.Probe(cluster.cluster_def['worker'][1], 5.0))
      with open(os.path.join(logs, 'worker_1.replaced_1.log')) as f:
        self.assertIn('serving at grpc://localhost:%d' % cluster.ports[1],
                      f.read())
      pids = cluster.pids
    for pid in pids:
      trainer_testlib.WaitGone(pid, 'its cluster stopped', timeout=20)

  def testThreadsAskingAtOnceAllGetTheExitCode(self):
    # The trainer asks from its watch thread and its main thread at once.
    for _ in range(5):
      worker = forked_workers.Start(
          ['--cluster', '{"worker": ["localhost:%d"]}' %
           local_cluster.FreePort(), '--task', '0'])
      codes = []

      def Poll(w=worker, c=codes):
        while w.poll() is None:
          pass
        c.append(w.poll())

      threads = [threading.Thread(target=Poll) for _ in range(4)]
      for t in threads:
        t.start()
      worker.kill()
      for t in threads:
        t.join(30)
      self.assertEqual([-signal.SIGKILL] * 4, codes)
      self.assertEqual(-signal.SIGKILL, worker.wait(timeout=5))

  def testAPrestartedServerServesTheFirstWorker(self):
    # An environment of its own: a fork server no other test started.
    env = dict(os.environ, GPIPE_PRESTART_TEST='1')
    key = (forked_workers.ImportTimeKeyText(child_env.Environment(env)), ())
    servers = forked_workers._servers  # pylint: disable=protected-access
    self.assertNotIn(key, servers)
    forked_workers.Prestart(env)
    # Started in the background, before any worker is asked for.
    polling.WaitUntil(lambda: key in servers and servers[key].Serving(),
                      'the prestarted fork server to serve',
                      timeout_secs=60)
    # Its TensorFlow import idles for the rest of the process otherwise.
    self.addCleanup(servers[key]._Break)  # pylint: disable=protected-access
    server = servers[key].proc.pid
    worker = forked_workers.Start(
        ['--cluster', '{"worker": ["localhost:%d"]}' %
         local_cluster.FreePort(), '--task', '0'], env=env)
    try:
      self.assertEqual(server, _Parent(worker.pid))
    finally:
      worker.kill()
      worker.wait(timeout=10)

  def testWorkersOfAKilledForkServerStayKnownAndKillable(self):
    with local_cluster.LocalCluster(2) as cluster:
      server = _Parent(cluster.pids[0])
      os.kill(server, signal.SIGTERM)
      trainer_testlib.WaitGone(server, 'it was sent SIGTERM', timeout=20)
      # Its workers serve on, and are reported as running.
      cluster.CheckAlive()
      self.assertEqual([1.0, 2.0], self._TaskValues(cluster))
      pids = cluster.pids
    # Stopped by their pidfds; how they ended only the server knew.
    for pid in pids:
      trainer_testlib.WaitGone(pid, 'its cluster stopped', timeout=20)
    self.assertEqual([255, 255], [p.returncode for p in cluster._procs])  # pylint: disable=protected-access

  def testALauncherScriptWithoutMainGuardIsNotRunInItsWorkers(self):
    work = tempfile.mkdtemp()
    marks = os.path.join(work, 'marks')
    script = os.path.join(work, 'launch.py')
    with open(script, 'w') as f:
      f.write(textwrap.dedent('''
          import os
          with open(%r, 'a') as f:
            f.write('imported in %%d\\n' %% os.getpid())
          from gpipe.runtime import local_cluster
          cluster = local_cluster.LocalCluster(2)
          print(' '.join(map(str, cluster.pids)), flush=True)
          cluster.Stop()
          ''' % marks))
    result = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=240,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    self.assertEqual(0, result.returncode, result.stderr[-3000:])
    self.assertLen(result.stdout.split(), 2)
    with open(marks) as f:
      self.assertLen(f.read().splitlines(), 1)

  def testWorkersWithPidfdsAbove1023AreWatched(self):
    # A long trainer holds many descriptors: select() stops at 1023.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
      self.skipTest('RLIMIT_NOFILE %d' % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
    # An earlier test's worker collected later would close its pidfd, a low
    # descriptor, which the new pidfd would then take: collect them first.
    gc.collect()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
      worker = forked_workers.Start(
          ['--cluster', '{"worker": ["localhost:%d"]}' %
           local_cluster.FreePort(), '--task', '0'])
      self.assertGreater(worker._pidfd, 1023)  # pylint: disable=protected-access
      self.assertIsNone(worker.poll())
      worker.kill()
      self.assertEqual(-signal.SIGKILL, worker.wait(timeout=20))
    finally:
      for fd in held:
        os.close(fd)

  def testAnInterruptedRequestEndsItsServerAndTheNextStartsAnother(self):
    worker = forked_workers.Start(
        ['--cluster', '{"worker": ["localhost:%d"]}' %
         local_cluster.FreePort(), '--task', '0'])
    server = worker._server  # pylint: disable=protected-access

    def Interrupted(unused_timeout):
      raise KeyboardInterrupt()

    with mock.patch.object(server, '_Read', Interrupted):
      with self.assertRaises(KeyboardInterrupt):
        forked_workers.Start(['--task', '0'])
    # Its answer would have gone to the next request: the server is ended.
    self.assertTrue(server.broken)
    trainer_testlib.WaitGone(server.proc.pid, 'it was interrupted', timeout=20)
    other = forked_workers.Start(
        ['--cluster', '{"worker": ["localhost:%d"]}' %
         local_cluster.FreePort(), '--task', '0'])
    self.assertNotEqual(server.proc.pid, _Parent(other.pid))
    self.assertIsNone(other.poll())
    for w in (worker, other):
      w.kill()
      self.assertIsNotNone(w.wait(timeout=20))
    self.assertTrue(forked_workers.Enabled())

  def testWithoutPidfdsTheClusterStartsCommands(self):
    self.addCleanup(forked_workers._failed.clear)  # pylint: disable=protected-access
    real_open = os.pidfd_open
    forked = []

    def Refused(pid):
      if pid == os.getpid():  # The check that pidfds work here passes.
        return real_open(pid)
      forked.append(pid)
      raise PermissionError(1, 'pidfd_open refused')

    with mock.patch.object(os, 'pidfd_open', Refused):
      with local_cluster.LocalCluster(1) as cluster:
        pid, = cluster.pids
        self.assertEqual(os.getpid(), _Parent(pid))
        self.assertIn('-m gpipe.runtime.worker', _CommandLine(pid))
    self.assertLen(forked, 1)
    # The fork it could not watch was killed, not left serving.
    trainer_testlib.WaitGone(forked[0], 'it was killed', timeout=20)
    self.assertIn('no pidfd for worker %d' % forked[0],
                  forked_workers._failed[0])  # pylint: disable=protected-access

  def testAStartTimeoutNamesTheWorkersLog(self):
    # A command worker takes seconds to import TensorFlow: past 0.5 s.
    logs = tempfile.mkdtemp()
    with mock.patch.dict(os.environ, {forked_workers.ENV: '0'}):
      with self.assertRaisesRegex(
          RuntimeError, r'worker 0 did not start serving at localhost:\d+ '
          r'within 0 s .*; its log: .*worker_0.log'):
        local_cluster.LocalCluster(1, log_dir=logs, start_timeout=0.5)

  def testPinnedWorkersRunOnTheirCores(self):
    cores = sorted(os.sched_getaffinity(0))
    with local_cluster.LocalCluster(2, pin_cores=True) as cluster:
      self.assertEqual([{cores[i % len(cores)]} for i in range(2)],
                       [os.sched_getaffinity(pid) for pid in cluster.pids])

  def testWorkersExitWithTheirLauncher(self):
    launcher = subprocess.Popen(
        [sys.executable, '-c', textwrap.dedent('''
            import time
            from gpipe.runtime import local_cluster
            cluster = local_cluster.LocalCluster(2)
            print(' '.join(map(str, cluster.pids)), flush=True)
            time.sleep(600)
            ''')], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
      pids = [int(p) for p in launcher.stdout.readline().split()]
      self.assertLen(pids, 2)
      self.assertTrue(all(trainer_testlib.Alive(p) for p in pids))
      server = _Parent(pids[0])
    finally:
      launcher.kill()
      launcher.wait()
      launcher.stdout.close()
    for pid in pids + [server]:
      trainer_testlib.WaitGone(pid, 'its launcher was killed', timeout=30)

  def testWithForkingOffWorkersAreCommands(self):
    with mock.patch.dict(os.environ, {forked_workers.ENV: '0'}):
      self.assertFalse(forked_workers.Enabled())
      with local_cluster.LocalCluster(1) as cluster:
        pid, = cluster.pids
        self.assertEqual(os.getpid(), _Parent(pid))
        self.assertIn('-m gpipe.runtime.worker', _CommandLine(pid))
        self.assertEqual([1.0], self._TaskValues(cluster))


class ForkedProgramsTest(test_utils.TestCase):

  PROBE = 'tests.forked_program_probe'
  # A module the probe's fork server imports: its command line names it.
  PRELOAD = ('tests.polling',)

  def setUp(self):
    super().setUp()
    if not forked_workers.Supported():
      self.skipTest('nothing is forked here')

  def _Run(self, code, *actions, **kwargs):
    """Forks the probe; (its exit code, what it saw, stdout, stderr, dir)."""
    work = self.create_tempdir().full_path
    out, err = os.path.join(work, 'out'), os.path.join(work, 'err')
    proc = forked_workers.StartProgram(
        self.PROBE, [work, str(code)] + list(actions), out, err_path=err,
        preload=self.PRELOAD, **kwargs)
    # There at once, as a Popen's would be.
    self.assertTrue(os.path.exists(out) and os.path.exists(err))
    returncode = proc.wait(timeout=120)
    seen = {}
    if os.path.exists(os.path.join(work, 'seen.json')):
      with open(os.path.join(work, 'seen.json')) as f:
        seen = json.load(f)
    with open(out) as f, open(err) as g:
      return returncode, seen, f.read(), g.read(), work

  def testAProgramRunsAsItsCommandWould(self):
    cwd = self.create_tempdir().full_path
    env = dict(child_env.Environment(), PROBE_VALUE='seen')
    code, seen, out, err, work = self._Run(3, 'thread', 'atexit', env=env,
                                           cwd=cwd)
    self.assertEqual((3, 'out\n', 'err\n'), (code, out, err))
    self.assertEqual([work, '3', 'thread', 'atexit'], seen['argv'])
    self.assertEqual((cwd, 'seen'), (seen['cwd'], seen['value']))
    # Its non-daemon thread ended, then its exit functions ran.
    for name in ('thread', 'atexit'):
      self.assertTrue(os.path.exists(os.path.join(work, name)), name)
    # A fork of the server that imported the probe, not a command.
    self.assertIn('-m gpipe.runtime.fork_server ' + self.PRELOAD[0],
                  _CommandLine(seen['parent']))
    # Each fork draws other random numbers, as fresh interpreters would.
    self.assertNotEqual(seen['random'], self._Run(0)[1]['random'])

  def testAnInterruptedProgramEndsBySigint(self):
    code, _, _, err, _ = self._Run(0, 'interrupt')
    self.assertEqual(-signal.SIGINT, code)
    self.assertIn('KeyboardInterrupt', err)

  def testAProgramsWorkersAreForksOfItsOwnForkServer(self):
    code, seen, _, err, _ = self._Run(0, 'cluster')
    self.assertEqual(0, code, err)
    server, other = seen['worker_parents']
    self.assertEqual(server, other)
    # Forked from the program's server (its command line), not started
    # (a new server's command line names no module to preload).
    self.assertIn('-m gpipe.runtime.fork_server ' + self.PRELOAD[0],
                  seen['worker_parent_commands'][0])
    self.assertNotEqual(seen['parent'], server)

    code, seen, _, err, _ = self._Run(0, 'cluster', own_server=False)
    self.assertEqual(0, code, err)
    self.assertNotIn(self.PRELOAD[0], seen['worker_parent_commands'][0])

  def testAProgramDiesWithItsLauncher(self):
    work = self.create_tempdir().full_path
    launcher = subprocess.Popen(
        [sys.executable, '-c', textwrap.dedent('''
            import sys, time
            from gpipe.runtime import forked_workers
            proc = forked_workers.StartProgram(
                %r, [%r, '0', 'sleep'], %r, preload=%r)
            print(proc.pid, flush=True)
            time.sleep(600)
            ''' % (self.PROBE, work, os.path.join(work, 'out'),
                   self.PRELOAD))], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
      pid = int(launcher.stdout.readline())
      polling.WaitUntil(lambda: os.path.exists(os.path.join(work, 'seen.json')),
                        'the program to run', timeout_secs=60)
      self.assertTrue(trainer_testlib.Alive(pid))
    finally:
      launcher.kill()
      launcher.wait()
      launcher.stdout.close()
    # Not left running on its own: it goes with the server, which goes
    # with the launcher.
    trainer_testlib.WaitGone(pid, 'its launcher was killed', timeout=30)

  def testAProgramsStderrIsLineBufferedWithoutPythonUnbuffered(self):
    env = child_env.Environment()
    env.pop('PYTHONUNBUFFERED', None)
    code, _, _, err, _ = self._Run(0, 'late_stderr', env=env)
    self.assertEqual(-signal.SIGKILL, code)
    self.assertEqual('err\nlate\n', err)

  def testAFailedSetUpIsInTheProgramsLog(self):
    code, _, out, err, _ = self._Run(0, cwd='/no/such/directory')
    self.assertEqual(1, code)
    self.assertIn("FileNotFoundError: [Errno 2] No such file or directory: "
                  "'/no/such/directory'", err)
    self.assertEqual('', out)

  def testATrainerForkedFromAServerCountsItsStartFromTheFork(self):
    import tools.trainer  # pylint: disable=g-import-not-at-top
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.write(write, repr(tools.trainer.STARTED).encode())
      os._exit(0)  # pylint: disable=protected-access
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
      self.assertGreater(float(f.read()), tools.trainer.STARTED)


if __name__ == '__main__':
  tf.test.main()
