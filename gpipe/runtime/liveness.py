"""Whether the TensorFlow server at an address answers: one check for all.

``Probe(address)`` is the one liveness check of the library and its tools:
the trainer's discovery of a cluster's devices, its watch over running
servers, a local cluster waiting for its workers to start, and the tests.
It answers within its timeout whatever the address holds, and says why a
server does not answer:

1. a TCP connection to the address (the name lookup included, in a thread
   of its own: a resolver that does not answer would otherwise hold the
   caller for its own, long, timeouts). Nothing listening is refused at
   once; a host cut off the network does not answer before the timeout;
2. the worker service's ``GetStatus`` RPC, which every TensorFlow server
   (``tf.distribute.Server``) answers as soon as it listens: a worker that
   is still starting is refused in step 1 until then, and something else
   listening at the address (no TensorFlow server) is named as such.

``connect_only=True`` stops after step 1. That is for callers that cannot
use gRPC, not a cheaper probe of a TensorFlow server: gRPC connects from
threads of its own, so a caller whose thread runs inside another network
namespace (``tools/netlab``) would probe from the wrong network.
"""

import socket
import threading
import time

import grpc

# The worker service every TensorFlow server runs.
_GET_STATUS = '/tensorflow.WorkerService/GetStatus'
# The shortest wait for the RPC when the connection took the probe's time.
_MIN_RPC_SECS = 0.1
# How much longer than its timeout the connecting thread is waited for.
_JOIN_GRACE_SECS = 0.5


def _Connect(address, timeout_secs):
  """None if a TCP connection to 'host:port' opens, else the reason."""
  host, _, port = address.rpartition(':')
  result = []

  def Connect():
    try:
      with socket.create_connection((host.strip('[]'), int(port)),
                                    timeout=timeout_secs):
        result.append(None)
    except socket.timeout:
      result.append('no answer within %g s' % timeout_secs)
    except OSError as e:
      result.append('cannot connect: %s' % (e.strerror or e))

  thread = threading.Thread(target=Connect, daemon=True,
                            name='liveness probe of %s' % address)
  thread.start()
  # A little longer than the socket's own timeout, which then says what
  # timed out; only a name lookup that hangs runs into the join's.
  thread.join(timeout_secs + _JOIN_GRACE_SECS)
  return result[0] if result else (
      'no answer (name lookup or connect) within %g s' % timeout_secs)


def _GetStatus(address, timeout_secs, rpc_secs):
  """None if the server at `address` answers GetStatus, else the reason."""
  channel = grpc.insecure_channel(address)
  try:
    # An empty GetStatusRequest: every field is optional.
    channel.unary_unary(_GET_STATUS)(b'', timeout=rpc_secs)
    return None
  except grpc.RpcError as e:
    details = e.details() or ''
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
      return ('accepts connections, but no TensorFlow server answered '
              'within %g s: is something else listening there?' %
              timeout_secs)
    if 'failed to connect' in details.lower():
      # Gone between the two steps. gRPC's text ends with the socket's
      # error: 'Connection refused'.
      return 'cannot connect: %s' % details.rsplit(': ', 1)[-1]
    return ('accepts connections, but does not answer as a TensorFlow '
            'server (%s: %s)' % (e.code().name, details[:200]))
  finally:
    channel.close()


def Probe(address, timeout_secs=3.0, connect_only=False):
  """None if the TensorFlow server at `address` answers, else why not.

  Args:
    address: 'host:port' of the server ('[v6 address]:port' too).
    timeout_secs: the longest the probe takes (both steps together, and
      half a second's grace for a connection that times out).
    connect_only: only check that something accepts TCP connections there
      (see the module docstring for who needs that).

  Returns:
    None, or the reason in a few words, naming the timeout where it ran
    out: 'cannot connect: Connection refused', 'no answer within 3 s',
    'accepts connections, but no TensorFlow server answered within 3 s: is
    something else listening there?'.
  """
  start = time.time()
  reason = _Connect(address, timeout_secs)
  if reason is not None or connect_only:
    return reason
  rpc_secs = max(_MIN_RPC_SECS, timeout_secs - (time.time() - start))
  return _GetStatus(address, timeout_secs, rpc_secs)


def AwaitServing(address, running, deadline, poll_secs=0.1):
  """Probes `address` until its server answers, its process ends or time's up.

  Args:
    address: 'host:port' of the server.
    running: a function of no arguments, false once the process that should
      serve there has exited.
    deadline: the time.time() after which it stops probing.
    poll_secs: the pause between probes.

  Returns:
    None once the server answers; else the last probe's reason (see `Probe`).
  """
  while True:
    reason = Probe(address, 5.0)
    if reason is None or not running() or time.time() > deadline:
      return reason
    time.sleep(poll_secs)
