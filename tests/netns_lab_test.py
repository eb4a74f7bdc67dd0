"""tools/netlab: the delaying TCP relay, and hosts as network namespaces."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from absl.testing import absltest
from gpipe.runtime import forked_workers
from tests import procfs
from tools.netlab import delay_relay
from tools.netlab import netns

DELAY_MS = 50.0


class _EchoServer:
  """Echoes each connection's bytes back; half-closes after the client."""

  def __init__(self, host='127.0.0.1', port=0):
    self.received = 0  # Bytes received over all connections so far.
    self._lock = threading.Lock()
    self.sock = socket.socket()
    self.sock.bind((host, port))
    self.sock.listen()
    self.address = '%s:%d' % self.sock.getsockname()
    threading.Thread(target=self._Accept, daemon=True).start()

  def _Accept(self):
    while True:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      threading.Thread(target=self._Echo, args=(conn,), daemon=True).start()

  def _Echo(self, conn):
    with conn:
      while True:
        data = conn.recv(1 << 16)
        if not data:
          conn.shutdown(socket.SHUT_WR)
          return
        with self._lock:
          self.received += len(data)
        conn.sendall(data)

  def Close(self):
    self.sock.close()


def _Connect(address):
  host, port = delay_relay.ParseAddress(address)
  return socket.create_connection((host, port), timeout=30)


def _FreePort():
  """A localhost port that nothing listens on (now)."""
  with socket.socket() as free:
    free.bind(('127.0.0.1', 0))
    return free.getsockname()[1]


def _RoundTripSeconds(address, port=None):
  """Seconds for 'ping' to come back from the echo server at `address`."""
  if port is not None:
    address = '%s:%d' % (address, port)
  with _Connect(address) as sock:
    start = time.monotonic()
    sock.sendall(b'ping')
    echoed = sock.recv(16)
    elapsed = time.monotonic() - start
  if echoed != b'ping':
    raise AssertionError('%s echoed %r' % (address, echoed))
  return elapsed


def _ReadAll(sock):
  chunks = []
  while True:
    data = sock.recv(1 << 16)
    if not data:
      return b''.join(chunks)
    chunks.append(data)


class DelayRelayTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.echo = _EchoServer()
    self.addCleanup(self.echo.Close)

  def _Relay(self, delay_ms=DELAY_MS):
    relay = delay_relay.RelayThread([('127.0.0.1:0', self.echo.address)],
                                    delay_ms)
    self.addCleanup(relay.Close)
    return relay

  def testForwardsEveryByteInOrderBothWays(self):
    relay = self._Relay(delay_ms=1)
    payload = os.urandom(8 << 20)
    with _Connect(relay.addresses[0]) as sock:
      received = []
      reader = threading.Thread(target=lambda: received.append(
          _ReadAll(sock)))
      reader.start()
      sock.sendall(payload)
      sock.shutdown(socket.SHUT_WR)  # The echo's end of stream comes back.
      reader.join()
    self.assertEqual(len(payload), len(received[0]))
    self.assertEqual(payload, received[0])

  def testEachDirectionIsDelayed(self):
    relay = self._Relay()
    for _ in range(3):
      # There and back: two one-way delays at least.
      self.assertGreaterEqual(_RoundTripSeconds(relay.addresses[0]),
                              2 * DELAY_MS / 1e3 * 0.99)

  def testStreamsAreNotStopAndWait(self):
    # 40 messages in a row through a 0.5 s relay. A delay line passes them
    # all on one delay after they were sent, so the echo server has every
    # one before the first echo is back (two delays after sending); a relay
    # that held one chunk at a time would have passed on one or two. The
    # check is on the order of events, not on how long they took.
    delay_ms = 500.0
    relay = self._Relay(delay_ms=delay_ms)
    count, size = 40, 1 << 15
    payload = b''.join(bytes([i]) * size for i in range(count))
    with _Connect(relay.addresses[0]) as sock:
      first_echo = []  # What the echo server had received by then.
      chunks = []

      def Read():
        while True:
          data = sock.recv(1 << 16)
          if not first_echo:
            first_echo.append(self.echo.received)
          if not data:
            return
          chunks.append(data)

      reader = threading.Thread(target=Read)
      start = time.monotonic()
      reader.start()
      sock.sendall(payload)
      sock.shutdown(socket.SHUT_WR)
      reader.join()
      elapsed = time.monotonic() - start
    self.assertEqual(payload, b''.join(chunks))  # Intact and in order.
    self.assertEqual(len(payload), first_echo[0])
    # There and back: two one-way delays at least.
    self.assertGreaterEqual(elapsed, 2 * delay_ms / 1e3 * 0.99)

  def testSetDelayAppliesToLaterBytes(self):
    relay = self._Relay(delay_ms=0)
    relay.SetDelay(DELAY_MS)
    self.assertGreaterEqual(_RoundTripSeconds(relay.addresses[0]),
                            2 * DELAY_MS / 1e3 * 0.99)
    with self.assertRaisesRegex(ValueError, 'must be >= 0 ms'):
      delay_relay.Relay([], -1)

  def testARefusedTargetResetsTheConnection(self):
    relay = delay_relay.RelayThread(
        [('127.0.0.1:0', '127.0.0.1:%d' % _FreePort())], DELAY_MS)
    self.addCleanup(relay.Close)
    # Reset during the handshake or right after it; never left open.
    try:
      with _Connect(relay.addresses[0]) as sock:
        self.assertEqual(b'', sock.recv(16))
    except ConnectionResetError:
      pass

  def testRoutesAreParsedWithClearErrors(self):
    self.assertEqual((('10.0.0.1', 2222), ('10.0.0.2', 3333)),
                     delay_relay.ParseRoute('10.0.0.1:2222=10.0.0.2:3333'))
    with self.assertRaisesRegex(ValueError, 'listen_host:port=target'):
      delay_relay.ParseRoute('10.0.0.1:2222')
    with self.assertRaisesRegex(ValueError, 'expected host:port'):
      delay_relay.ParseRoute('10.0.0.1:x=10.0.0.2:3333')

  def testCommandLineRelayWithControlSocket(self):
    # An abstract socket: no path (a test's temporary directory can be
    # longer than a socket path may be).
    control = '@gpnl-relay-test-%d' % os.getpid()
    port = _FreePort()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'tools.netlab.delay_relay', '--route',
         '127.0.0.1:%d=%s' % (port, self.echo.address), '--delay_ms', '0',
         '--control', control, '--exit_with_parent'],
        stdout=subprocess.PIPE, text=True, env=netns.ChildEnvironment(),
        cwd=netns.ROOT)
    self.addCleanup(proc.stdout.close)
    self.addCleanup(proc.wait)
    self.addCleanup(proc.kill)
    self.assertIn('delay relay ready: 127.0.0.1:%d=%s (delay 0 ms)' %
                  (port, self.echo.address), proc.stdout.readline())
    delay_relay.SetDelayAt(control, DELAY_MS)
    self.assertGreaterEqual(_RoundTripSeconds('127.0.0.1', port),
                            2 * DELAY_MS / 1e3 * 0.99)
    with self.assertRaisesRegex(ValueError, 'answered .error'):
      delay_relay.SetDelayAt(control, -5)
    bad = subprocess.run(
        [sys.executable, '-m', 'tools.netlab.delay_relay', '--route', 'x'],
        capture_output=True, text=True, env=netns.ChildEnvironment(),
        cwd=netns.ROOT)
    self.assertEqual(2, bad.returncode)
    self.assertIn('a route is listen_host:port=target_host:port', bad.stderr)


def _Listen(address):
  sock = socket.socket()
  sock.bind((address, 0))
  sock.listen()
  return sock


def _Addresses(ns=None):
  argv = ['ip'] + (['-n', ns] if ns else []) + ['-4', '-o', 'addr', 'show']
  return subprocess.run(argv, capture_output=True, text=True,
                        check=True).stdout


class LabTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = netns.Unavailable()
    if reason:
      print('skipped: %s' % reason, file=sys.stderr)
      self.skipTest('network namespaces are not available here: %s' % reason)

  def testHostsReachEachOtherOnlyInsideTheLab(self):
    outside = _Addresses()
    with netns.Lab(2, delay_ms=DELAY_MS, rate_mbit=100) as lab:
      self.assertLessEqual(set(lab.hosts + [lab.client, lab.hub]),
                           set(netns.Namespaces()))
      self.assertEqual(['10.213.0.10', '10.213.0.11'], lab.host_addresses)
      self.assertIn('10.213.0.11/24', _Addresses(lab.hosts[1]))
      # The machine's own namespace gets no lab address.
      self.assertEqual(outside, _Addresses())
      self.assertNotIn('10.213.', _Addresses())
      self.assertIn('tbf', subprocess.run(
          ['tc', '-n', lab.hosts[0], 'qdisc', 'show', 'dev', 'eth0'],
          capture_output=True, text=True, check=True).stdout)
      # A listener in host 1, reached from the client directly and through
      # the relay (which forwards the lab's ports only).
      server = netns.InNamespace(lab.hosts[1],
                                 lambda: _Listen(lab.host_addresses[1]))
      self.addCleanup(server.close)
      port = server.getsockname()[1]
      self.assertTrue(lab.Serving(1, port))
      self.assertFalse(lab.Serving(0, port))
      lab.SetLink(1, False)
      self.assertFalse(lab.Serving(1, port, timeout=0.5))
      lab.SetLink(1, True)
      self.assertTrue(lab.Serving(1, port, timeout=5))
      self.assertEqual('10.213.0.101', lab.Address(1))
      self.assertEqual('10.213.0.11', lab.Address(1, delayed=False))
      lab.SetDelay(1.0)
    # Closed: every namespace of the lab is gone.
    self.assertFalse([n for n in netns.Namespaces()
                      if n.startswith(lab.name)])

  def testRelayDelaysTrafficBetweenHosts(self):
    with netns.Lab(1, delay_ms=DELAY_MS, ports=(2345,)) as lab:
      echo = netns.InNamespace(
          lab.hosts[0], lambda: _EchoServer(lab.host_addresses[0], 2345))
      self.addCleanup(echo.Close)
      delayed = netns.InNamespace(
          lab.client, lambda: _RoundTripSeconds(lab.Address(0), 2345))
      self.assertGreaterEqual(delayed, 2 * DELAY_MS / 1e3 * 0.99)
      direct = netns.InNamespace(
          lab.client,
          lambda: _RoundTripSeconds(lab.Address(0, delayed=False), 2345))
      self.assertLess(direct, delayed)

  def testWorkersServeInTheirHostsNamespaces(self):
    with netns.Lab(2) as lab, netns.Workers(lab) as workers:
      for i, pid in enumerate(workers.pids):
        # In host i's namespace (the one its address is in), not this one.
        self.assertEqual(
            'net:[%d]' % os.stat('/var/run/netns/' + lab.hosts[i]).st_ino,
            os.readlink('/proc/%d/ns/net' % pid))
        parent = procfs.CommandLine(procfs.Parent(pid))
        if forked_workers.Enabled():  # A fork, not a command.
          self.assertIn('-m gpipe.runtime.fork_server', parent)
      self.assertTrue(lab.Serving(1, workers.port))
      workers.Kill(1)
      self.assertFalse(lab.Serving(1, workers.port, timeout=0.5))
      workers.Start(1)
      workers.WaitServing(1, 60)
      pids = workers.pids
    # Closed: the workers have ended and are reaped.
    for pid in pids:
      self.assertFalse(os.path.exists('/proc/%d' % pid), pid)

  def testAProgramInAHostHasItsLocalWorkersThere(self):
    work = tempfile.mkdtemp()
    out, err = os.path.join(work, 'out'), os.path.join(work, 'err')
    with netns.Lab(1) as lab:
      proc = lab.StartProgram(lab.client, 'tests.forked_program_probe',
                              [work, '0', 'cluster'], out, err_path=err,
                              preload=('tests.polling',))
      proc.wait(timeout=120)
      client = 'net:[%d]' % os.stat('/var/run/netns/' + lab.client).st_ino
    with open(err) as f:
      self.assertEqual(0, proc.returncode, f.read())
    with open(os.path.join(work, 'seen.json')) as f:
      seen = json.load(f)
    # The program and the workers it started (reached at localhost) in the
    # client's namespace.
    self.assertEqual([client] * 3, [seen['netns']] + seen['worker_netns'])

  def testLabsOfKilledProcessesAreRemoved(self):
    proc = subprocess.Popen(
        [sys.executable, '-c',
         'import time; from tools.netlab import netns; '
         'lab = netns.Lab(1); print(lab.name, flush=True); time.sleep(600)'],
        stdout=subprocess.PIPE, text=True, env=netns.ChildEnvironment(),
        cwd=netns.ROOT)
    try:
      name = proc.stdout.readline().strip()
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      proc.stdout.close()
    self.assertTrue(name.startswith(netns.PREFIX), name)
    left = [n for n in netns.Namespaces() if n.startswith(name)]
    self.assertLen(left, 3)  # hub, client, one host: nobody cleaned up.
    with netns.Lab(1) as lab:
      self.assertNotEqual(name, lab.name)
      self.assertFalse([n for n in netns.Namespaces() if n.startswith(name)])


if __name__ == '__main__':
  absltest.main()
