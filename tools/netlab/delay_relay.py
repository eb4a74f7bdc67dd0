"""A TCP relay that delays every byte by a fixed one-way time.

Linux's ``netem`` qdisc is the usual way to give a link latency; kernels
built without it (``tc qdisc ... netem`` answers "Specified qdisc kind is
unknown") still run this. Each route listens on one address and forwards
every connection it accepts to another address. Both directions of a
connection are delayed the same way:

* a chunk read at time t is written on the other side at t + delay, so a
  request and its answer each take one delay (a round trip takes two);
* each direction is one FIFO of (due time, chunk): bytes keep their order,
  and reading goes on while earlier chunks wait, so a stream keeps its
  throughput (the relay is a pipe of `delay` length, not a stop-and-wait);
  at most ``MAX_BUFFERED_CHUNKS`` chunks wait per direction, then reading
  pauses and TCP's own flow control slows the sender;
* an end of stream is passed on (after the delay) as a half close, a reset
  as a reset, and a connection whose target refuses it is reset;
* the delay can be changed while the relay runs (``SetDelay``, or a line
  ``delay <ms>`` on the control socket); chunks already read keep their due
  time.

Connection set-up is not delayed (the relay answers the handshake itself).

In a process: ``with RelayThread([('127.0.0.1:0', 'host:port')], 5.0) as r:``
then connect to ``r.addresses[0]``. As a process::

  python -m tools.netlab.delay_relay --delay_ms 5 \\
      --route 10.213.0.100:2222=10.213.0.10:2222 [--route ...] \\
      [--control /run/relay.sock] [--exit_with_parent]

prints ``delay relay ready: <listen>=<target> ...`` once every route
listens, then ``connection <peer> -> <target>`` for each connection. tools/netlab/netns.py runs it between network-namespace hosts.
"""

import argparse
import asyncio
import os
import socket
import struct
import sys
import threading

CHUNK_BYTES = 1 << 16
MAX_BUFFERED_CHUNKS = 1024  # 64 MiB per direction at most.


def ParseAddress(text):
  """('host', port) of 'host:port' (IPv4 or a name).

  Raises:
    ValueError: not host:port with a numeric port.
  """
  host, sep, port = text.rpartition(':')
  if not sep or not host or not port.isdigit():
    raise ValueError('expected host:port, got %r' % text)
  return host, int(port)


def ParseRoute(text):
  """(listen, target) addresses of 'listen_host:port=target_host:port'.

  Raises:
    ValueError: a malformed route, with an example.
  """
  listen, sep, target = text.partition('=')
  if not sep:
    raise ValueError('a route is listen_host:port=target_host:port (e.g. '
                     '10.213.0.100:2222=10.213.0.10:2222), got %r' % text)
  return ParseAddress(listen), ParseAddress(target)


def _Reset(writer):
  """Closes a connection with a reset (RST), as a failed peer would."""
  sock = writer.get_extra_info('socket')
  if sock is not None:
    try:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      struct.pack('ii', 1, 0))
    except OSError:
      pass
  writer.transport.abort()


class Relay:
  """The routes of one relay and their connections, on one asyncio loop."""

  def __init__(self, routes, delay_ms, log=None):
    """Configures the relay (nothing listens yet: see Start).

    Args:
      routes: a list of (listen, target) addresses, each a 'host:port'
        string or a (host, port) pair; port 0 listens on a free port.
      delay_ms: the one-way delay in milliseconds (>= 0).
      log: optional function(line), called for each connection accepted.
    """
    self.routes = [
        tuple(ParseAddress(a) if isinstance(a, str) else tuple(a)
              for a in route) for route in routes]
    self.SetDelay(delay_ms)
    self._servers = []
    self._tasks = set()
    self._log = log
    self.addresses = []
    self.connections = 0

  def SetDelay(self, delay_ms):
    """Sets the one-way delay for chunks read from now on.

    Raises:
      ValueError: a negative delay.
    """
    if delay_ms < 0:
      raise ValueError('the delay must be >= 0 ms, got %r' % delay_ms)
    self.delay_ms = float(delay_ms)

  async def Start(self):
    """Listens on every route; sets `addresses` to the bound 'host:port's."""
    for listen, target in self.routes:
      server = await asyncio.start_server(
          lambda r, w, t=target: self._Connection(r, w, t), listen[0],
          listen[1], reuse_address=True)
      self._servers.append(server)
      host, port = server.sockets[0].getsockname()[:2]
      self.addresses.append('%s:%d' % (host, port))

  async def Close(self):
    """Stops listening and drops every open connection."""
    for server in self._servers:
      server.close()
    tasks = list(self._tasks)
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for server in self._servers:
      await server.wait_closed()
    self._servers = []

  async def _Connection(self, reader, writer, target):
    self.connections += 1
    if self._log:
      peer = writer.get_extra_info('peername') or ('?', 0)
      self._log('connection %s:%d -> %s:%d' % (peer[0], peer[1], *target))
    task = asyncio.current_task()
    self._tasks.add(task)
    writers = [writer]
    try:
      try:
        up_reader, up_writer = await asyncio.open_connection(*target)
      except OSError:
        _Reset(writer)
        return
      writers.append(up_writer)
      for w in writers:
        sock = w.get_extra_info('socket')
        if sock is not None:
          # Chunks leave when due, not when Nagle's algorithm lets them.
          sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      await asyncio.gather(self._Pump(reader, up_writer, writer),
                           self._Pump(up_reader, writer, up_writer))
    except asyncio.CancelledError:
      pass  # Close(): the connection ends with the relay.
    finally:
      self._tasks.discard(task)
      for w in writers:
        if not w.is_closing():
          w.close()

  async def _Pump(self, reader, writer, source_writer):
    """Copies reader to writer, each chunk `delay_ms` after it was read."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue(MAX_BUFFERED_CHUNKS)

    async def Read():
      while True:
        try:
          data = await reader.read(CHUNK_BYTES)
        except (ConnectionError, OSError):
          data = None  # A reset: passed on as a reset.
        await queue.put((loop.time() + self.delay_ms / 1e3, data))
        if not data:
          return

    async def Write():
      while True:
        due, data = await queue.get()
        wait = due - loop.time()
        if wait > 0:
          await asyncio.sleep(wait)
        try:
          if data is None:
            _Reset(writer)
            _Reset(source_writer)
            return
          if not data:
            if writer.can_write_eof() and not writer.is_closing():
              writer.write_eof()
            return
          writer.write(data)
          await writer.drain()
        except (ConnectionError, OSError):
          # The far side is gone: reset this side too and stop reading.
          _Reset(source_writer)
          return

    reading = asyncio.ensure_future(Read())
    try:
      await Write()
    finally:
      if not reading.done():
        reading.cancel()
      await asyncio.gather(reading, return_exceptions=True)


class RelayThread:
  """A Relay on its own event loop in a daemon thread of this process."""

  def __init__(self, routes, delay_ms=0.0):
    """Starts the relay and waits until every route listens.

    Args:
      routes: see Relay.
      delay_ms: the one-way delay in milliseconds.
    """
    self.relay = Relay(routes, delay_ms)
    self._loop = asyncio.new_event_loop()
    started = threading.Event()
    failure = []

    def Serve():
      asyncio.set_event_loop(self._loop)
      try:
        self._loop.run_until_complete(self.relay.Start())
      except OSError as e:
        failure.append(e)
        started.set()
        return
      started.set()
      self._loop.run_forever()

    self._thread = threading.Thread(target=Serve, daemon=True)
    self._thread.start()
    started.wait()
    if failure:
      raise failure[0]

  @property
  def addresses(self):
    """The bound listen addresses, 'host:port', one per route."""
    return list(self.relay.addresses)

  def SetDelay(self, delay_ms):
    self._loop.call_soon_threadsafe(self.relay.SetDelay, delay_ms)

  def Close(self):
    """Stops listening and stops the loop (idempotent)."""
    if self._loop.is_closed() or not self._thread.is_alive():
      return
    asyncio.run_coroutine_threadsafe(self.relay.Close(),
                                     self._loop).result(timeout=10)
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=10)
    self._loop.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.Close()


async def _Control(relay, reader, writer):
  """Serves 'delay <ms>' lines: sets the delay, answers 'ok <ms>'."""
  while True:
    line = await reader.readline()
    if not line:
      break
    words = line.decode().split()
    try:
      if len(words) != 2 or words[0] != 'delay':
        raise ValueError('expected "delay <ms>", got %r' % line.decode())
      relay.SetDelay(float(words[1]))
      answer = 'ok %g\n' % relay.delay_ms
    except ValueError as e:
      answer = 'error %s\n' % e
    writer.write(answer.encode())
    await writer.drain()
  writer.close()


def _UnixAddress(control):
  """A Unix socket address: a path, or '@name' in the abstract namespace."""
  return '\0' + control[1:] if control.startswith('@') else control


def SetDelayAt(control, delay_ms, timeout=10.0):
  """Sets the delay of the relay process serving control socket `control`.

  Args:
    control: the relay's --control (a path, or '@name': an abstract socket,
      reachable in the relay's network namespace only).
    delay_ms: the new one-way delay.
    timeout: seconds to wait for the answer.

  Raises:
    OSError: the relay does not answer.
    ValueError: it refused the value.
  """
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.settimeout(timeout)
    s.connect(_UnixAddress(control))
    s.sendall(b'delay %r\n' % float(delay_ms))
    answer = s.makefile().readline().strip()
  if not answer.startswith('ok '):
    raise ValueError('the relay at %s answered %r' % (control, answer))


async def _Main(args):
  relay = Relay([ParseRoute(r) for r in args.route], args.delay_ms,
                log=lambda line: print(line, flush=True))
  await relay.Start()
  if args.control:
    await asyncio.start_unix_server(
        lambda r, w: _Control(relay, r, w), _UnixAddress(args.control))
  pairs = ['%s=%s:%d' % (a, t[0], t[1])
           for a, (_, t) in zip(relay.addresses, relay.routes)]
  print('delay relay ready: %s (delay %g ms)' % (' '.join(pairs),
                                                  relay.delay_ms), flush=True)
  parent = os.getppid()
  while not args.exit_with_parent or os.getppid() == parent:
    await asyncio.sleep(0.5)


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog='python -m tools.netlab.delay_relay',
      description=__doc__.split('\n')[0])
  parser.add_argument('--route', action='append', required=True,
                      help='listen_host:port=target_host:port (repeatable)')
  parser.add_argument('--delay_ms', type=float, default=0.0,
                      help='one-way delay added to each direction')
  parser.add_argument('--control',
                      help='a Unix socket path taking "delay <ms>" lines '
                      "('@name': an abstract socket)")
  parser.add_argument('--exit_with_parent', action='store_true',
                      help='exit when the parent process goes away')
  args = parser.parse_args(argv)
  try:
    for route in args.route:
      ParseRoute(route)
  except ValueError as e:
    parser.error(str(e))
  try:
    asyncio.run(_Main(args))
  except OSError as e:
    print('delay relay: error: %s' % e, file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
