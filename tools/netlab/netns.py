"""Hosts made of Linux network namespaces, for multi-host runs on one machine.

A ``Lab`` of H hosts is H + 2 network namespaces joined by veth pairs to one
bridge, with addresses in one /24 that exists only inside them: the
machine's own namespace gets no interface, address or route, and nothing is
routed out::

    <lab>-c: client (the trainer)     <lab>-h0 .. <lab>-h{H-1}: worker hosts
      eth0 10.213.0.2                   eth0 10.213.0.10+i
          |                                 |
          +--- veth --- br0 in <lab>-hub ---+--- veth --- ...
                        10.213.0.1; relay addresses 10.213.0.100+i

Each lab has its own bridge, so labs of parallel tests use the same
addresses without seeing each other; only the namespace names are unique
(``gpnl<pid>x<random>-<role>``).

Latency (``delay_ms``, a number even 0): the hub runs a delaying TCP relay
(``tools.netlab.delay_relay``, a process in the hub namespace). For every
host i and every port p of ``ports`` it listens on 10.213.0.100+i:p and
forwards to host i's own 10.213.0.10+i:p, delaying each direction by
``delay_ms``. Whoever names host i by its relay address (``Address(i)``)
reaches it through the delay: the workers' cluster spec lists relay
addresses, so every worker-to-worker connection (tensors between stages,
RecvTensor requests and replies) and every trainer-to-worker connection
(the session's RunStep to the master task, the master's RunGraph calls to
the other tasks) crosses the relay once, and each message, request or
reply, arrives ``delay_ms`` late. A TensorFlow server binds its own port
on every address of its namespace, so it serves the relay's connections
on its host address. Host-local connections through the relay address are
delayed too: run one worker per host. ``SetDelay`` changes the delay while
everything runs.

Bandwidth (``rate_mbit``): a ``tbf`` qdisc on both ends of every veth caps
each host's sending and receiving at that rate.

Partitions: ``SetLink(i, False)`` sets host i's interface down (its
connections stall, new ones fail), ``SetLink(i, True)`` brings it back.

Workers (``Workers``, ``StartWorker``): ``python -m gpipe.worker`` servers,
worker i in host i, each a process of its own that exits with this process,
at a fixed port (labs do not share ports). Like ``LocalCluster``'s, a worker
is a fork of the fork server that imported TensorFlow once
(``gpipe.runtime.forked_workers``), which joins the host's namespace before
it serves; with ``GPIPE_FORK_WORKERS=0`` it is a command started with ``ip
netns exec`` (``--exit_with_parent``). ``StartProgram`` starts a program,
e.g. the trainer in the client, the same way.

Clean-up: ``Close`` (also the context manager's exit and, at interpreter
exit, ``atexit``) kills every process in the lab's namespaces and deletes
them. A lab whose process was killed before it could clean up is removed by
the next ``Lab``: each lab holds a lock file (``LOCK_DIR``) while it lives.

Needs root (creating namespaces); ``Unavailable()`` says why a lab cannot be
made here, for tests to skip with that reason.
"""

import atexit
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from gpipe.runtime import child_env
from gpipe.runtime import forked_workers
from gpipe.runtime import liveness
from gpipe.runtime import netns as netns_lib

PREFIX = 'gpnl'
SUBNET = '10.213.0'
HUB_HOST = 1
CLIENT_HOST = 2
FIRST_HOST = 10
FIRST_RELAY = 100
MAX_HOSTS = FIRST_RELAY - FIRST_HOST
DEFAULT_PORT = 2222
LOCK_DIR = '/run/gpipe-netlab'
ROOT = child_env.ROOT
_NAME = re.compile(r'^(%s\d+x[0-9a-f]+)-' % PREFIX)
_unavailable = []


class LabError(RuntimeError):
  """A lab could not be set up (the failing command and its output)."""


def _Tool(name):
  """The path of an iproute2 command (also where PATH lacks /usr/sbin)."""
  return (shutil.which(name) or
          shutil.which(name, path='/usr/sbin:/sbin:/usr/bin:/bin') or name)


def _Ip(*args, check=True):
  """Runs `ip args`; returns its stdout. Raises LabError on failure."""
  return _Run([_Tool('ip')] + list(args), check)


def _Run(argv, check=True):
  proc = subprocess.run(argv, capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
  if check and proc.returncode:
    raise LabError('`%s` failed (exit %d): %s' % (
        ' '.join(argv), proc.returncode, (proc.stderr or proc.stdout).strip()))
  return proc.stdout


def Unavailable():
  """None if this process can make labs, else a sentence saying why not."""
  if _unavailable:
    return _unavailable[0]
  reason = None
  if os.geteuid() != 0:
    reason = ('network namespaces need root (ip netns add); running as uid '
              '%d' % os.geteuid())
  elif not all(os.path.isabs(_Tool(name)) for name in ('ip', 'tc')):
    reason = 'the `ip` and `tc` commands (iproute2) are not installed'
  else:
    probe = '%s%dx0-probe' % (PREFIX, os.getpid())
    try:
      _Ip('netns', 'add', probe)
    except LabError as e:
      reason = 'cannot create a network namespace: %s' % e
    finally:
      _Ip('netns', 'del', probe, check=False)
  _unavailable.append(reason)
  return reason


def Namespaces():
  """The names of every network namespace (ip netns list)."""
  return [line.split()[0] for line in _Ip('netns', 'list').splitlines()
          if line.strip()]


def _KillNamespace(ns):
  """Kills every process in namespace `ns` and deletes it."""
  for pid in _Ip('netns', 'pids', ns, check=False).split():
    try:
      os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):
      pass
  _Ip('netns', 'del', ns, check=False)


def RemoveStale():
  """Deletes the namespaces of labs whose process died without cleaning up.

  A lab's lock file is held (flock) while its process lives; a lab whose
  lock can be taken, or that has none, is stale.

  Returns:
    The names of the deleted namespaces.
  """
  removed = []
  labs = {}
  for ns in Namespaces():
    match = _NAME.match(ns)
    if match:
      labs.setdefault(match.group(1), []).append(ns)
  for lab, names in labs.items():
    path = os.path.join(LOCK_DIR, lab)
    try:
      fd = os.open(path, os.O_RDWR)
    except OSError:
      fd = None
    if fd is not None:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        os.close(fd)
        continue  # Its process holds the lock: alive.
    for ns in names:
      _KillNamespace(ns)
      removed.append(ns)
    if fd is not None:
      os.remove(path)
      os.close(fd)
  return removed


def InNamespace(ns, fn):
  """Calls fn() in a thread that has joined network namespace `ns`.

  Sockets fn creates belong to `ns` (a socket keeps its namespace); the rest
  of this process stays where it is.

  Returns:
    What fn returns (its exception is raised here).
  """
  result = []

  def Run():
    netns_lib.Join(ns)
    result.append(fn())

  def Guarded():
    try:
      Run()
    except BaseException as e:  # pylint: disable=broad-except
      result.append(e)

  thread = threading.Thread(target=Guarded, daemon=True)
  thread.start()
  thread.join()
  if isinstance(result[0], BaseException):
    raise result[0]
  return result[0]


def StopProcess(proc, timeout=10.0):
  """SIGKILLs a subprocess.Popen if it runs, and reaps it."""
  if proc.poll() is None:
    proc.kill()
  try:
    proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    pass  # Stuck in the kernel: nothing more to do from here.


def ChildEnvironment():
  """The environment of lab processes: the repository on the path, no proxy.

  gRPC would send connections to lab addresses through an HTTP proxy named
  in the environment; the lab has no route to one.
  """
  env = child_env.Environment({
      k: v for k, v in os.environ.items()
      if k.lower() not in ('http_proxy', 'https_proxy', 'grpc_proxy',
                           'all_proxy')})
  env['PYTHONUNBUFFERED'] = '1'
  return env


class Lab:
  """H hosts, a client and a hub (see the module docstring)."""

  def __init__(self, num_hosts, delay_ms=None, rate_mbit=None,
               ports=(DEFAULT_PORT,), log_dir=None):
    """Creates the namespaces, links, addresses and (with delay_ms) relay.

    Args:
      num_hosts: H worker hosts (1 .. MAX_HOSTS).
      delay_ms: None for direct links; a number (0 too) to run the delaying
        relay with this one-way delay (changeable with SetDelay).
      rate_mbit: cap every host's and the client's link at this many
        Mbit/s each way (tbf), or None.
      ports: the ports the relay forwards on every host.
      log_dir: where the relay writes relay.log, one line per connection
        (default: a temporary directory, removed by Close).

    Raises:
      LabError: the lab could not be made (the failing command says why;
        ``Unavailable()`` gives the reason up front).
    """
    if not 1 <= num_hosts <= MAX_HOSTS:
      raise ValueError('a lab has 1 to %d hosts, got %d' % (MAX_HOSTS,
                                                           num_hosts))
    reason = Unavailable()
    if reason:
      raise LabError(reason)
    RemoveStale()
    self.name = '%s%dx%s' % (PREFIX, os.getpid(), secrets.token_hex(3))
    self.hub = self.name + '-hub'
    self.client = self.name + '-c'
    self.hosts = ['%s-h%d' % (self.name, i) for i in range(num_hosts)]
    self.host_addresses = ['%s.%d' % (SUBNET, FIRST_HOST + i)
                           for i in range(num_hosts)]
    self.client_address = '%s.%d' % (SUBNET, CLIENT_HOST)
    self.delay_ms = delay_ms
    self.relay_addresses = None
    self.relay_log = None
    if delay_ms is not None:
      self.relay_addresses = ['%s.%d' % (SUBNET, FIRST_RELAY + i)
                              for i in range(num_hosts)]
    self.ports = tuple(ports)
    self.rate_mbit = rate_mbit
    self._tmp = tempfile.mkdtemp(prefix=self.name + '-')
    self.log_dir = log_dir or self._tmp
    self._procs = []
    self._relay = None
    self._closed = False
    os.makedirs(LOCK_DIR, exist_ok=True)
    self._lock = os.open(os.path.join(LOCK_DIR, self.name),
                         os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(self._lock, fcntl.LOCK_EX)
    atexit.register(self.Close)
    try:
      self._Build()
    except BaseException:
      self.Close()
      raise

  def _Build(self):
    _Ip('netns', 'add', self.hub)
    _Ip('-n', self.hub, 'link', 'set', 'lo', 'up')
    _Ip('-n', self.hub, 'link', 'add', 'br0', 'type', 'bridge')
    _Ip('-n', self.hub, 'link', 'set', 'br0', 'up')
    _Ip('-n', self.hub, 'addr', 'add', '%s.%d/24' % (SUBNET, HUB_HOST),
        'dev', 'br0')
    for address in self.relay_addresses or []:
      _Ip('-n', self.hub, 'addr', 'add', address + '/24', 'dev', 'br0')
    self._AddHost(self.client, self.client_address, 'vc')
    for i, (ns, address) in enumerate(zip(self.hosts, self.host_addresses)):
      self._AddHost(ns, address, 'v%d' % i)
    if self.relay_addresses:
      self._StartRelay()

  def _AddHost(self, ns, address, hub_side):
    """Namespace `ns` with eth0 at `address`, its peer on the hub's bridge."""
    _Ip('netns', 'add', ns)
    _Ip('-n', ns, 'link', 'set', 'lo', 'up')
    # Both ends are created inside the lab's namespaces, never in ours.
    _Ip('-n', self.hub, 'link', 'add', hub_side, 'type', 'veth', 'peer',
        'name', 'eth0', 'netns', ns)
    _Ip('-n', self.hub, 'link', 'set', hub_side, 'master', 'br0', 'up')
    _Ip('-n', ns, 'addr', 'add', address + '/24', 'dev', 'eth0')
    _Ip('-n', ns, 'link', 'set', 'eth0', 'up')
    if self.rate_mbit:
      for where, dev in ((ns, 'eth0'), (self.hub, hub_side)):
        self._Cap(where, dev)

  def _Cap(self, ns, dev):
    """A tbf qdisc of rate_mbit on `dev` (a burst of 5 ms, >= 64 KiB)."""
    burst = max(64 << 10, int(self.rate_mbit * 1e6 / 8 * 0.005))
    _Run([_Tool('tc'), '-n', ns, 'qdisc', 'replace', 'dev', dev, 'root',
          'tbf', 'rate', '%gmbit' % self.rate_mbit, 'burst', str(burst),
          'latency', '100ms'])

  def _StartRelay(self):
    # Short: a socket path has at most 107 bytes.
    self.relay_control = os.path.join(LOCK_DIR, self.name + '.sock')
    routes = []
    for relay, host in zip(self.relay_addresses, self.host_addresses):
      for port in self.ports:
        routes += ['--route', '%s:%d=%s:%d' % (relay, port, host, port)]
    log_path = self.relay_log = os.path.join(self.log_dir, 'relay.log')
    self._relay = self.Popen(
        self.hub, [sys.executable, '-m', 'tools.netlab.delay_relay',
                   '--delay_ms', str(self.delay_ms), '--control',
                   self.relay_control, '--exit_with_parent'] + routes,
        log_path=log_path, start_new_session=True)
    deadline = time.time() + 30
    while True:
      with open(log_path) as f:
        text = f.read()
      if 'delay relay ready' in text:
        return
      if self._relay.poll() is not None or time.time() > deadline:
        raise LabError('the delay relay did not start (exit %s): %s' %
                       (self._relay.poll(), text.strip()))
      time.sleep(0.05)

  @property
  def relay_pid(self):
    """The relay process's pid (None without a relay)."""
    return self._relay.pid if self._relay else None

  def Command(self, ns, argv):
    """The command line running `argv` in namespace `ns`."""
    return [_Tool('ip'), 'netns', 'exec', ns] + list(argv)

  def Popen(self, ns, argv, log_path=None, **kwargs):
    """Starts `argv` in namespace `ns` (stopped by Close).

    Args:
      ns: a namespace of this lab (self.client, self.hosts[i], self.hub).
      argv: the command.
      log_path: stdout and stderr go to this file (default: discarded).
      **kwargs: more subprocess.Popen arguments (env defaults to
        ChildEnvironment(), cwd to the repository root).

    Returns:
      The subprocess.Popen. `ip netns exec` replaces itself with the
      command, so its pid is the command's and this process is its parent.
    """
    kwargs.setdefault('env', ChildEnvironment())
    kwargs.setdefault('cwd', ROOT)
    kwargs.setdefault('stdin', subprocess.DEVNULL)
    if log_path:
      with open(log_path, 'w') as log:  # The child keeps its own descriptor.
        proc = subprocess.Popen(self.Command(ns, argv), stdout=log,
                                stderr=subprocess.STDOUT, **kwargs)
    else:
      kwargs.setdefault('stdout', subprocess.DEVNULL)
      kwargs.setdefault('stderr', subprocess.DEVNULL)
      proc = subprocess.Popen(self.Command(ns, argv), **kwargs)
    self._procs.append(proc)
    return proc

  def StartWorker(self, ns, args, log_path=None, core=None):
    """Starts a TensorFlow worker (`python -m gpipe.worker args`) in `ns`.

    A fork of the fork server that imported TensorFlow once
    (gpipe.runtime.forked_workers), joined to namespace `ns`, that exits
    with this process; a command (`--exit_with_parent`) where forking is
    off or fails.

    Args:
      ns: a namespace of this lab.
      args: the worker's flags.
      log_path: its stdout and stderr (default: discarded).
      core: the CPU core to pin it to (default: not pinned).

    Returns:
      Its process (subprocess.Popen's calls), stopped by Close.
    """
    args = ['--exit_with_parent'] + list(args)
    if forked_workers.Enabled():
      try:
        proc = forked_workers.Start(args, log_path=log_path, core=core,
                                    netns=ns, env=ChildEnvironment())
        self._procs.append(proc)
        return proc
      except forked_workers.ForkServerError:
        pass  # It said why: a command instead.
    argv = [sys.executable, '-m', 'gpipe.worker'] + args
    if core is not None:
      argv = ['taskset', '-c', str(core)] + argv
    # Its own session, as gpipe.runtime.local_cluster's workers: Linux's
    # autogroup scheduler gives each session one CPU share.
    return self.Popen(ns, argv, log_path=log_path, start_new_session=True)

  def StartProgram(self, ns, module, args, log_path, err_path=None,
                   preload=()):
    """Starts `python -m module args` in `ns` (stopped by Close).

    A fork of a fork server that imported `preload` once
    (gpipe.runtime.forked_workers.StartProgram), joined to namespace `ns`;
    a command where forking is off or fails.

    Args:
      ns: a namespace of this lab.
      module: the program's module, e.g. 'tools.trainer'.
      args: its flags.
      log_path: its stdout (and stderr unless `err_path`).
      err_path: its stderr, if not `log_path`'s file.
      preload: modules the fork server imports once.

    Returns:
      Its process (subprocess.Popen's calls).
    """
    if forked_workers.Supported():
      try:
        proc = forked_workers.StartProgram(
            module, list(args), log_path, err_path=err_path,
            env=ChildEnvironment(), cwd=ROOT, preload=preload, netns=ns)
        self._procs.append(proc)
        return proc
      except forked_workers.ForkServerError as e:
        print('netns: %s; %s starts as a command' % (e, module),
              file=sys.stderr)
    argv = [sys.executable, '-m', module] + list(args)
    if not err_path:
      return self.Popen(ns, argv, log_path=log_path)
    with open(log_path, 'w') as out, open(err_path, 'w') as err:
      return self.Popen(ns, argv, stdout=out, stderr=err)

  def Address(self, i, delayed=True):
    """The address that reaches host i: through the relay if there is one."""
    if delayed and self.relay_addresses:
      return self.relay_addresses[i]
    return self.host_addresses[i]

  def SetDelay(self, delay_ms):
    """Sets the relay's one-way delay (the lab must have been made with one).

    Raises:
      ValueError: a lab without a relay (delay_ms=None).
    """
    if not self._relay:
      raise ValueError('this lab has direct links: make it with delay_ms=0 '
                       'or more to change its delay')
    from tools.netlab import delay_relay  # pylint: disable=g-import-not-at-top
    delay_relay.SetDelayAt(self.relay_control, delay_ms)
    self.delay_ms = delay_ms

  def SetLink(self, i, up):
    """Sets host i's interface up or down (a partition of that host)."""
    _Ip('-n', self.hosts[i], 'link', 'set', 'eth0', 'up' if up else 'down')

  def Serving(self, i, port, timeout=0.5):
    """Whether host i accepts TCP connections on `port` (from the client)."""
    # TCP only: gRPC would connect from its own threads, outside the
    # client's namespace.
    address = '%s:%d' % (self.host_addresses[i], port)
    return InNamespace(
        self.client, lambda: liveness.Probe(
            address, timeout, connect_only=True)) is None

  def Close(self):
    """Kills the lab's processes and deletes its namespaces (idempotent)."""
    if self._closed:
      return
    self._closed = True
    for proc in self._procs:
      StopProcess(proc)
    for ns in self.hosts + [self.client, self.hub]:
      _KillNamespace(ns)
    shutil.rmtree(self._tmp, ignore_errors=True)
    for path in (os.path.join(LOCK_DIR, self.name),
                 os.path.join(LOCK_DIR, self.name + '.sock')):
      try:
        os.remove(path)
      except OSError:
        pass
    os.close(self._lock)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Close()


class Workers:
  """TensorFlow worker processes, worker i in lab host i."""

  def __init__(self, lab, num_workers=None, port=DEFAULT_PORT, delayed=True,
               cpu_devices=1, pin_cores=False, intra_op_threads=1,
               inter_op_threads=2, log_dir=None, start_timeout=60.0):
    """Starts the workers and waits until each one serves.

    Args:
      lab: the Lab.
      num_workers: how many (default: one per host).
      port: every worker's port (the lab's relay must forward it).
      delayed: list the relay addresses in the cluster spec (when the lab
        has a relay), so that every connection to a worker is delayed.
      cpu_devices: virtual CPU devices per worker.
      pin_cores: pin worker i to core i mod the cores (taskset).
      intra_op_threads: threads per op in each worker.
      inter_op_threads: ops run concurrently in each worker.
      log_dir: worker i writes worker_<i>.log here (default: lab.log_dir).
      start_timeout: seconds to wait for the workers to serve.

    Raises:
      LabError: a worker exited or did not serve in time (its log tail).
    """
    num_workers = num_workers or len(lab.hosts)
    if num_workers > len(lab.hosts):
      raise ValueError('%d workers need %d hosts; the lab has %d' %
                       (num_workers, num_workers, len(lab.hosts)))
    if lab.relay_addresses and delayed and port not in lab.ports:
      raise ValueError('port %d is not forwarded by the lab relay (ports %s)'
                       % (port, lab.ports))
    self.lab = lab
    self.port = port
    self.addresses = ['%s:%d' % (lab.Address(i, delayed), port)
                      for i in range(num_workers)]
    self.cluster_def = {'worker': list(self.addresses)}
    self._log_dir = log_dir or lab.log_dir
    os.makedirs(self._log_dir, exist_ok=True)
    self._args = ['--intra_op_threads', str(intra_op_threads),
                  '--inter_op_threads', str(inter_op_threads),
                  '--cpu_devices', str(cpu_devices)]
    self._pin = pin_cores
    self._starts = [0] * num_workers
    self.procs = [None] * num_workers
    for i in range(num_workers):
      self.Start(i)
    for i in range(num_workers):
      self.WaitServing(i, start_timeout)

  @property
  def cluster_spec(self):
    """The trainer's --cluster_spec: 'worker=host:port,...'."""
    return 'worker=' + ','.join(self.addresses)

  @property
  def target(self):
    """The session target: worker 0's address as listed."""
    return 'grpc://' + self.addresses[0]

  @property
  def pids(self):
    return [p.pid if p else None for p in self.procs]

  def LogPath(self, i):
    """Worker i's log of its latest start."""
    suffix = '' if self._starts[i] <= 1 else '.%d' % self._starts[i]
    return os.path.join(self._log_dir, 'worker_%d.log%s' % (i, suffix))

  def Start(self, i):
    """Starts worker i (again, after Kill) in host i; does not wait."""
    if self.procs[i] is not None and self.procs[i].poll() is None:
      raise ValueError('worker %d (pid %d) is still running' %
                       (i, self.procs[i].pid))
    args = ['--cluster_spec', self.cluster_spec, '--task', str(i)
           ] + self._args
    self._starts[i] += 1
    self.procs[i] = self.lab.StartWorker(
        self.lab.hosts[i], args, log_path=self.LogPath(i),
        core=i % (os.cpu_count() or 1) if self._pin else None)
    return self.procs[i]

  def WaitServing(self, i, timeout=60.0):
    """Waits until worker i accepts connections on its host address.

    Raises:
      LabError: it exited or did not serve within `timeout` seconds.
    """
    deadline = time.time() + timeout
    while not self.lab.Serving(i, self.port):
      code = self.procs[i].poll()
      if code is not None or time.time() > deadline:
        with open(self.LogPath(i)) as f:
          tail = f.read()[-2000:]
        raise LabError('worker %d in %s %s: %s' % (
            i, self.lab.hosts[i], 'exited with code %d' % code
            if code is not None else 'did not serve within %.0f s' % timeout,
            tail))
      time.sleep(0.1)

  def Kill(self, i):
    """SIGKILLs worker i and waits for it."""
    StopProcess(self.procs[i])

  def Stop(self):
    for i, proc in enumerate(self.procs):
      if proc is not None:
        self.Kill(i)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Stop()
