"""The servers of --cluster_spec: who answers, what they hold, waiting.

The trainer does not start the servers of ``--cluster_spec``: when one dies
a supervisor (Slurm, Kubernetes, systemd, or whoever started it) starts it
again at the same address. ``RemoteTasks`` is what the trainer knows about
them:

* each task is probed with ``gpipe.runtime.liveness.Probe`` (does the
  TensorFlow server at its address answer, within a short deadline): a
  server that is gone is refused at once; a host cut off the network does
  not answer before the deadline. Either way the reason is returned, never
  a hang.
* ``Describe``: a task by index, address and the pipeline stages placed on
  it, e.g. ``task 1 at 10.0.0.2:2222 (stage 1)``, for error messages.
* ``Unreachable``: the tasks that do not answer now (probed in parallel).
* ``WaitServing``: polls until every task answers or the wait is over
  (``--worker_wait_secs``); the caller then restores the newest checkpoint
  in a new session (tools/trainer/placement.py ``Placement.Restart``).
* ``Connect``: before a session starts, runs a tiny step in which every
  task receives a tensor from every other one, retried for a few seconds:
  a task that cannot reach another is named before any real work, and a
  connection a restarted task left broken in a long-lived one (the first
  call on it fails) is renewed by the retry instead of failing the step.
"""

import concurrent.futures
import re
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import liveness
from lingvo import compat as tf
from tools.trainer import model_select

_TASK = re.compile(r'/task:(\d+)')
# How long ``RemoteTasks.Connect`` retries by default (seconds).
CONNECT_WAIT_SECS = 10.0


class TaskUnreachableError(RuntimeError):
  """A task of --cluster_spec does not answer, or cannot reach another."""


# Sessions of failed connection checks: closing one could wait forever.
_ABANDONED = []


def AbandonedSessions():
  """How many sessions of failed connection checks were left open."""
  return len(_ABANDONED)


def StagesByTask(cfg):
  """{task index: ['stage 0', ...]} of every pipeline in model params `cfg`.

  Stages are named 'stage s', 'replica r stage s' with data-parallel
  replicas, and prefixed with the pipeline's path when the model has more
  than one pipeline.
  """
  found = model_select.FindPipelines(cfg)
  stages = {}
  for path, pp in found:
    replicas = pp.replica_devices or [pp.stage_devices or []]
    for r, devices in enumerate(replicas):
      for s, device in enumerate(devices):
        match = _TASK.search(device or '')
        if not match:
          continue
        name = 'stage %d' % s
        if len(replicas) > 1:
          name = 'replica %d %s' % (r, name)
        if len(found) > 1:
          name = '%s %s' % (path, name)
        stages.setdefault(int(match.group(1)), []).append(name)
  return stages


class RemoteTasks:
  """The tasks of job 'worker' given by address (see the module docstring)."""

  def __init__(self, addresses, probe_timeout_secs=3.0, task_names=None,
               session_cluster=None):
    """Constructor.

    Args:
      addresses: 'host:port' of task 0, 1, ...
      probe_timeout_secs: how long one probe waits for an answer.
      task_names: how messages name task 0, 1, ... (default 'task <i>');
        with a session cluster, the tasks' indices in the cluster
        description, e.g. ['task 0', 'task 2', 'task 3'] after task 1 was
        lost.
      session_cluster: a gpipe.runtime.session_cluster.SessionCluster of
        the addresses that sessions run on (--elastic), or None: the
        servers' own cluster.
    """
    self.addresses = list(addresses)
    self.probe_timeout_secs = probe_timeout_secs
    self.stages = {}
    self.task_names = list(task_names or
                           ['task %d' % t for t in range(len(addresses))])
    self.session_cluster = session_cluster

  def SetStages(self, cfg):
    """Names each task's stages after the model params `cfg`."""
    self.stages = StagesByTask(cfg)

  def Describe(self, task):
    """'task 1 at host:port (stage 1)'."""
    held = self.stages.get(task)
    return '%s at %s (%s)' % (self.task_names[task], self.addresses[task],
                              ', '.join(held) if held else 'no stage')

  def Unreachable(self):
    """[(task, reason)] of the tasks that do not answer now, in task order."""
    with concurrent.futures.ThreadPoolExecutor(len(self.addresses)) as pool:
      reasons = list(pool.map(
          lambda a: liveness.Probe(a, self.probe_timeout_secs), self.addresses))
    return [(t, r) for t, r in enumerate(reasons) if r is not None]

  def Explain(self, lost):
    """'task 1 at a:p (stage 1) does not answer (connection refused)'."""
    if not lost:
      return 'every task answers again'
    return '; '.join('%s does not answer (%s)' % (self.Describe(t), reason)
                     for t, reason in lost)

  def WaitServing(self, wait_secs, poll_secs=0.5):
    """Polls until every task answers.

    Args:
      wait_secs: the longest wait.
      poll_secs: pause between rounds of probes.

    Returns:
      [] when every task answers, else the last round's [(task, reason)].
    """
    deadline = time.time() + wait_secs
    while True:
      lost = self.Unreachable()
      if not lost or time.time() >= deadline:
        return lost
      time.sleep(min(poll_secs, max(0.0, deadline - time.time())))

  def _MeshStep(self, target, timeout_secs):
    """One step in which every task adds up a value of every task."""
    graph = tf.Graph()
    device = (self.session_cluster.DeviceName if self.session_cluster else
              cluster_spec_lib.DeviceName)
    with graph.as_default():
      values = []
      for task in range(len(self.addresses)):
        with tf.device(device(task)):
          # Random, so that graph optimization cannot fold the sums away.
          values.append(tf.random.uniform([]))
      sums = []
      for task in range(len(self.addresses)):
        with tf.device(device(task)):
          sums.append(tf.add_n(values))
    timeout_ms = int(timeout_secs * 1000)
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=timeout_ms)
    if self.session_cluster:
      self.session_cluster.Configure(config)
    sess = tf.compat.v1.Session(target, graph=graph, config=config)
    try:
      sess.run(sums, options=tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms))
    except BaseException:
      _ABANDONED.append(sess)
      raise
    sess.close()

  def Connect(self, target, wait_secs=CONNECT_WAIT_SECS,
              step_timeout_secs=10.0, gone=None, lost_wait_secs=None):
    """Checks that every task reaches every other, retrying for wait_secs.

    A check step that timed out or met an unavailable task is tried once
    more even past wait_secs (then the whole check takes up to wait_secs
    and two step timeouts).

    Args:
      target: the session target (task 0's 'grpc://host:port').
      wait_secs: how long to keep retrying.
      step_timeout_secs: the longest one try may take.
      gone: an optional function, true once a task is known to be gone for
        good (a local worker process that exited): a task that does not
        answer is then not waited for.
      lost_wait_secs: how long to wait for a task that does not answer
        (None: wait_secs), when the caller waits for it itself; a step
        that fails while every task answers is still retried for
        wait_secs.

    Raises:
      TaskUnreachableError: the tasks that do not answer, after
        lost_wait_secs (at once if `gone()`), or the last error of the
        check after wait_secs.
    """
    start = time.time()
    deadline = start + wait_secs
    lost_deadline = start + (wait_secs if lost_wait_secs is None
                             else lost_wait_secs)
    stalled = 0
    while True:
      lost = self.Unreachable()
      if lost and gone is not None and gone():
        lost_deadline = time.time()
      if not lost:
        try:
          self._MeshStep(target, step_timeout_secs)
          return
        except tf.errors.OpError as e:
          reason = '%s: %s' % (type(e).__name__,
                               e.message.strip().splitlines()[0][:300])
          if isinstance(e, (tf.errors.DeadlineExceededError,
                            tf.errors.UnavailableError)):
            stalled += 1
      # A step that timed out or found a task unavailable once is tried
      # again even past the deadline: a connection between two tasks that
      # a healed partition left stalled holds the first step until it
      # recovers or is replaced.
      if lost and time.time() >= lost_deadline:
        raise TaskUnreachableError(
            '%s (--cluster_spec %s). Start the servers (python -m '
            'gpipe.worker) or fix the addresses, then run the same '
            'command again' % (self.Explain(lost), ','.join(self.addresses)))
      if not lost and time.time() >= deadline and stalled != 1:
        raise TaskUnreachableError(
            'the tasks of --cluster_spec (%s) answer, but a step across them '
            'fails: %s. Check that every task can reach every other at the '
            'addresses of the cluster spec' % (', '.join(self.addresses),
                                                reason))
      time.sleep(0.5)
