"""A session over any set of running servers, numbered by the session.

A TensorFlow server is started with a cluster description and keeps it; a
session normally runs on that cluster, every task at the address it had when
the servers started. A session may instead carry a cluster of its own
(``ConfigProto.cluster_def``): the task it is created on (its master) asks
the servers listed there for their devices and runs the graph on them
under the names the session gives them. That lets a run go on over the
servers that still serve after one is lost, for good, or take in one that
came back at another address, without restarting any of them:

* ``SessionCluster(addresses)``: servers 'host:port', given in the order of
  their new task indices 0, 1, ... of the job ``JOB``. Device strings of
  the session name that job (``DeviceName``); a server's own devices are
  renamed for it (``Rename``), and ``ListDevices`` asks the session's
  master for all of them;
* ``Configure(config)``: a ConfigProto carrying the cluster, with each
  server's state kept apart per session (``isolate_session_state``): the
  variables of one session are not those of another, so a step left
  running on an old session cannot write into the state a new one
  restored.

``JOB`` is not the job name the servers were started with ('worker'):
TensorFlow refuses a session cluster that gives a server its own boot-time
name, and a server does not list the devices of another task of its own
job name in a session cluster.
"""

import re

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import cluster_spec as cluster_spec_lib
from lingvo import compat as tf
from tensorflow.core.protobuf import cluster_pb2

# The job of a session cluster's tasks.
JOB = 'elastic'

_PREFIX = re.compile(r'^/job:[^/]+/replica:\d+/task:\d+/')


class SessionCluster:
  """Servers at `addresses` as tasks 0, 1, ... of job JOB for a session."""

  def __init__(self, addresses):
    """Constructor.

    Args:
      addresses: 'host:port' of the servers, in the order of their task
        indices in the session.

    Raises:
      ValueError: no address, or one listed twice.
    """
    self.addresses = tuple(addresses)
    if not self.addresses:
      raise ValueError('a session cluster needs at least one server')
    if len(set(self.addresses)) != len(self.addresses):
      raise ValueError('a session cluster lists a server twice: %s' %
                       ', '.join(self.addresses))

  @property
  def num_tasks(self):
    return len(self.addresses)

  @property
  def target(self):
    """The session target: task 0's server, the session's master."""
    return 'grpc://' + self.addresses[0]

  def ClusterDef(self):
    """The tf.train.ClusterDef of the session (one job, JOB)."""
    cluster = cluster_pb2.ClusterDef()
    job = cluster.job.add()
    job.name = JOB
    for task, address in enumerate(self.addresses):
      job.tasks[task] = address
    return cluster

  def Configure(self, config):
    """Sets `config` (a ConfigProto) to run on this cluster; returns it."""
    config.cluster_def.CopyFrom(self.ClusterDef())
    config.isolate_session_state = True
    return config

  def DeviceName(self, task, device_type='CPU', index=0):
    """'/job:elastic/replica:0/task:<task>/device:<TYPE>:<index>'."""
    return cluster_spec_lib.DeviceName(task, device_type, index, JOB)

  def Rename(self, names, task):
    """Device strings of a server as the session names them.

    Args:
      names: full device strings, as the server lists them on its own
        ('/job:worker/replica:0/task:3/device:CPU:0').
      task: the server's task index in this session.

    Returns:
      The same devices, e.g. '/job:elastic/replica:0/task:1/device:CPU:0'.
    """
    prefix = '/job:%s/replica:0/task:%d/' % (JOB, task)
    renamed = []
    for name in names:
      if not _PREFIX.match(name):
        raise ValueError('%r is not a full device string (/job:.../replica:'
                         '.../task:.../device:...)' % name)
      renamed.append(_PREFIX.sub(prefix, name))
    return renamed

  def ListDevices(self, timeout_secs=10.0):
    """Every device of the session's servers, as the session names them.

    Args:
      timeout_secs: the longest the listing may take.

    Returns:
      Device strings of job JOB, task by task.

    Raises:
      tf.errors.OpError: a server did not answer in time.
    """
    config = self.Configure(tf.compat.v1.ConfigProto(
        operation_timeout_in_ms=int(timeout_secs * 1000)))
    with tf.compat.v1.Session(self.target, graph=tf.Graph(),
                              config=config) as sess:
      names = [d.name for d in sess.list_devices()]
    return sorted((n for n in names if n.startswith('/job:%s/' % JOB)),
                  key=_TaskOrder)


def _TaskOrder(name):
  match = re.search(r'/task:(\d+)/device:([^:]+):(\d+)$', name)
  return (int(match.group(1)), match.group(2), int(match.group(3)))
