"""Cluster descriptions: which worker tasks exist and at which addresses.

The worker binary and the trainer read the same descriptions:

* ``worker=host:port,host:port`` (the trainer's ``--cluster_spec`` syntax;
  several jobs are separated by ``@``, e.g. ``worker=a:1,b:1@ps=c:1``);
* a JSON cluster dict, ``{"worker": ["host:port", ...]}``;
* ``TF_CONFIG``, TensorFlow's convention for multi-worker jobs,
  ``{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": i}}``
  (given as JSON text, in the environment or as a flag value);
* Slurm's environment inside an ``srun`` step, read through
  ``tf.distribute.cluster_resolver.SlurmClusterResolver``;
* ``@path``: a file holding any of the text forms, read again whenever the
  caller asks (``SpecFile``; the trainer's ``--elastic`` re-reads it, so a
  supervisor can add or replace hosts by rewriting it).

Only the job ``worker`` runs pipeline stages; other jobs of a description
(``chief``, ``ps``, ``evaluator``) are not served or contacted. Errors say
what was wrong, name the value and show a good description.
"""

import dataclasses
import json
import os
from typing import Optional, Tuple

JOB = 'worker'
EXAMPLE = ("e.g. 'worker=10.0.0.1:2222,10.0.0.2:2222', "
           '\'{"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}\' or TF_CONFIG='
           '\'{"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, '
           '"task": {"type": "worker", "index": 0}}\'')
# The first port of the tasks on a Slurm node (task i on a node: base + i).
SLURM_PORT_BASE = 8888
# More than any node's task count (see FromSlurm).
_NODE_SLOTS = 1 << 16


class ClusterSpecError(ValueError):
  """A cluster description that cannot be used, with what to change."""


@dataclasses.dataclass(frozen=True)
class ClusterDescription:
  """The worker tasks of a cluster, and which one this process is.

  Attributes:
    workers: 'host:port' of worker task 0, 1, ...
    task: this process's worker task index (None: not a worker, e.g. the
      trainer).
    source: where the description came from ('--cluster_spec', 'TF_CONFIG',
      'Slurm'...), for messages.
    other_jobs: {job: addresses} of the description's jobs other than
      'worker' (kept for messages; never served).
  """
  workers: Tuple[str, ...]
  task: Optional[int] = None
  source: str = '--cluster_spec'
  other_jobs: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()

  @property
  def num_tasks(self):
    return len(self.workers)

  def Dict(self):
    """{'worker': [host:port, ...]}, for tf.train.ClusterSpec."""
    return {JOB: list(self.workers)}

  def Target(self, task=0):
    """The gRPC session target of worker `task`."""
    return 'grpc://' + self.workers[task]

  def Name(self, task):
    """'worker task 1 (10.0.0.2:2222)', for messages."""
    return '%s task %d (%s)' % (JOB, task, self.workers[task])

  def Spec(self):
    """The description in the --cluster_spec syntax, 'worker=h:p,h:p'."""
    return '%s=%s' % (JOB, ','.join(self.workers))


def DeviceName(task, device_type='CPU', index=0, job=JOB):
  """The canonical device string of a task's device (short names fail in RPCs).

  Args:
    task: the task index in `job`.
    device_type: 'CPU', 'GPU' or 'TPU' (any case).
    index: the device's index of that type on the task.
    job: the job name.

  Returns:
    '/job:worker/replica:0/task:<task>/device:<TYPE>:<index>'.
  """
  return '/job:%s/replica:0/task:%d/device:%s:%d' % (job, task,
                                                      device_type.upper(),
                                                      index)


def _CheckAddress(address, where):
  """Raises ClusterSpecError unless `address` is 'host:port'."""
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ClusterSpecError(
        '%s: %r is not host:port (a host name or IP address, a colon, a port '
        'number 1-65535); %s' % (where, address, EXAMPLE))


def _Description(jobs, where, task=None, source='--cluster_spec'):
  """A ClusterDescription from {job: [address]}, checked."""
  if not isinstance(jobs, dict) or not jobs:
    raise ClusterSpecError('%s: expected a dict of jobs {"worker": [...]}, '
                           'got %r; %s' % (where, jobs, EXAMPLE))
  checked = {}
  for job, addresses in jobs.items():
    if isinstance(addresses, dict):  # {task index: address}, as ClusterSpec
      try:
        addresses = [addresses[i] for i in sorted(addresses, key=int)]
      except ValueError:
        raise ClusterSpecError('%s: job %r maps tasks %r: task indices must '
                               'be numbers' % (where, job, list(addresses)))
    if (not isinstance(addresses, (list, tuple)) or not addresses or
        not all(isinstance(a, str) for a in addresses)):
      raise ClusterSpecError(
          '%s: job %r needs a non-empty list of "host:port" strings, got %r; '
          '%s' % (where, job, addresses, EXAMPLE))
    for address in addresses:
      _CheckAddress(address, '%s (job %r)' % (where, job))
    checked[str(job).strip()] = tuple(a.strip() for a in addresses)
  if JOB not in checked:
    raise ClusterSpecError(
        "%s: needs a 'worker' job (the tasks that run pipeline stages); it "
        'has %s; %s' % (where, ', '.join(repr(j) for j in checked), EXAMPLE))
  workers = checked.pop(JOB)
  seen = {}
  for i, address in enumerate(workers):
    if address in seen:
      raise ClusterSpecError(
          '%s: worker tasks %d and %d have the same address %s: each task '
          'needs its own host:port; %s' % (where, seen[address], i, address,
                                           EXAMPLE))
    seen[address] = i
  if task is not None and not 0 <= task < len(workers):
    raise ClusterSpecError(
        '%s: task index %d is out of range: the cluster has %d worker '
        'task(s), indices 0..%d' % (where, task, len(workers),
                                    len(workers) - 1))
  return ClusterDescription(
      workers=workers, task=task, source=source,
      other_jobs=tuple(sorted(checked.items())))


def ParseJobs(text, where='--cluster_spec'):
  """{job: [host:port, ...]} from 'worker=host:port,host:port[@job=...]'.

  Args:
    text: the description; jobs separated by '@'.
    where: names the description in errors.

  Returns:
    A dict for tf.train.ClusterSpec, with a 'worker' job.

  Raises:
    ClusterSpecError: a malformed description, with an example of a good one.
  """
  jobs = {}
  for part in text.split('@'):
    if '=' not in part:
      raise ClusterSpecError('%s=%r: expected job=host:port,...; %s' %
                             (where, text, EXAMPLE))
    job, addresses = part.split('=', 1)
    addresses = [a.strip() for a in addresses.split(',') if a.strip()]
    if not addresses:
      raise ClusterSpecError('%s=%r: job %r lists no host:port; %s' %
                             (where, text, job.strip(), EXAMPLE))
    for address in addresses:
      _CheckAddress(address, '%s=%r' % (where, text))
    jobs[job.strip()] = addresses
  if JOB not in jobs:
    raise ClusterSpecError("%s=%r: needs a 'worker' job; %s" %
                           (where, text, EXAMPLE))
  return jobs


def _TaskOf(config, where, require_worker):
  """The worker index of TF_CONFIG's "task" (None when it has none)."""
  task = config.get('task')
  if task is None:
    if require_worker:
      raise ClusterSpecError(
          '%s has no "task": a worker needs {"task": {"type": "worker", '
          '"index": i}} to know which address is its own' % where)
    return None
  if not isinstance(task, dict):
    raise ClusterSpecError('%s: "task" must be {"type": "worker", "index": '
                           'i}, got %r' % (where, task))
  task_type = task.get('type', JOB)
  index = task.get('index', 0)
  if isinstance(index, str) and index.isdigit():
    index = int(index)
  if not isinstance(index, int) or isinstance(index, bool):
    raise ClusterSpecError('%s: task index must be a number, got %r' %
                           (where, index))
  if task_type != JOB:
    if require_worker:
      raise ClusterSpecError(
          '%s: task type %r: this process serves pipeline stages, which run '
          'on tasks of type "worker"; give it {"task": {"type": "worker", '
          '"index": i}} (tasks of type %r are not gpipe workers)' %
          (where, task_type, task_type))
    return None
  return index


def FromJson(text, where='--cluster_spec', require_worker=False,
             source=None):
  """A ClusterDescription from a JSON cluster dict or TF_CONFIG text.

  Args:
    text: '{"worker": [...]}' or '{"cluster": {...}, "task": {...}}'.
    where: names the description in errors.
    require_worker: the description must say which worker this process is
      (a "task" of type "worker").
    source: ClusterDescription.source (default: `where`).

  Returns:
    A ClusterDescription; its task is TF_CONFIG's worker index, if any.

  Raises:
    ClusterSpecError: bad JSON, no worker job, a bad address, a task that is
      not a worker (with require_worker) or an index out of range.
  """
  try:
    config = json.loads(text)
  except ValueError as e:
    raise ClusterSpecError('%s is not valid JSON (%s): %r; %s' %
                           (where, e, text, EXAMPLE)) from None
  if isinstance(config, dict) and 'cluster' in config:
    task = _TaskOf(config, where, require_worker)
    return _Description(config['cluster'], where, task, source or where)
  if require_worker:
    raise ClusterSpecError(
        '%s is a cluster dict without a "task": give the task index too '
        '(--task=i), or use TF_CONFIG with {"task": {"type": "worker", '
        '"index": i}}' % where)
  return _Description(config, where, None, source or where)


def SpecFile(text):
  """The file of an '@path' description, or None for the other forms."""
  text = (text or '').strip()
  return text[1:] if text.startswith('@') else None


def ReadSpecFile(path, where='--cluster_spec'):
  """The text of a description file (ClusterSpecError if unreadable)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ClusterSpecError('%s=@%s: cannot read the file (%s); write the '
                           'cluster into it, %s' %
                           (where, path, e.strerror or e, EXAMPLE)) from None
  if text.strip().startswith('@'):
    raise ClusterSpecError('%s=@%s: the file names another file (%s); write '
                           'the cluster itself into it' %
                           (where, path, text.strip()))
  return text


def Parse(text, where='--cluster_spec', require_worker=False):
  """A ClusterDescription from any of the text forms (see module doc).

  Args:
    text: 'worker=h:p,...', a JSON cluster dict, TF_CONFIG JSON, or '@path'
      of a file holding one of them.
    where: names the description in errors.
    require_worker: TF_CONFIG text must name a task of type "worker".

  Returns:
    A ClusterDescription (task: TF_CONFIG's worker index, if given).

  Raises:
    ClusterSpecError: the description cannot be used; the message says why
      and shows good ones.
  """
  text = text.strip()
  path = SpecFile(text)
  if path is not None:
    text = ReadSpecFile(path, where).strip()
    where = '%s=@%s' % (where, path)
  if not text:
    raise ClusterSpecError('%s is empty; %s' % (where, EXAMPLE))
  if text.startswith('{'):
    return FromJson(text, where, require_worker=require_worker)
  return _Description(ParseJobs(text, where), where, None, where)


def InSlurmStep(environ=None):
  """Whether this process is a task of a Slurm job step (run by srun)."""
  environ = os.environ if environ is None else environ
  return 'SLURM_PROCID' in environ and 'SLURM_STEP_NODELIST' in environ


def FromSlurm(port_base=SLURM_PORT_BASE, environ=None):
  """The worker tasks of the current Slurm job step, and this task's index.

  Every task of the step is a worker; tasks on a node use ports port_base,
  port_base + 1, ...; TensorFlow's SlurmClusterResolver orders the nodes by
  name (as ``LC_ALL=C sort`` does). Which GPUs a task sees is left to
  Slurm's own binding (``--gres``, ``--gpus-per-task``): the resolver's
  rewrite of CUDA_VISIBLE_DEVICES, which assumes a whole node's GPUs, is not
  used.

  Args:
    port_base: the first port on each node.
    environ: the environment (default os.environ).

  Returns:
    A ClusterDescription with this task's index.

  Raises:
    ClusterSpecError: not inside an srun step, or Slurm's variables do not
      describe a usable step.
  """
  environ = os.environ if environ is None else environ
  if not InSlurmStep(environ):
    raise ClusterSpecError(
        'no Slurm job step: SLURM_PROCID and SLURM_STEP_NODELIST are not set '
        '(start the workers with srun, e.g. srun --ntasks-per-node=1 python '
        '-m gpipe.worker)')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # The resolver reads os.environ: another environment is lent to it.
  saved = dict(os.environ)
  if environ is not os.environ:
    os.environ.update({k: v for k, v in environ.items()
                       if k.startswith('SLURM_')})
  try:
    # The resolver gives every task of a node its own GPU slot (and no more
    # tasks than slots): a slot per possible task, and no
    # CUDA_VISIBLE_DEVICES rewrite.
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=_NODE_SLOTS, gpus_per_task=1,
        auto_set_gpu=False)
    spec = resolver.cluster_spec().as_dict()
  except (RuntimeError, ValueError, KeyError) as e:
    raise ClusterSpecError(
        'Slurm step (SLURM_STEP_NODELIST=%r, SLURM_STEP_TASKS_PER_NODE=%r, '
        'SLURM_PROCID=%r) could not be resolved: %s' %
        (environ.get('SLURM_STEP_NODELIST'),
         environ.get('SLURM_STEP_TASKS_PER_NODE'),
         environ.get('SLURM_PROCID'), e)) from None
  finally:
    if environ is not os.environ:
      os.environ.clear()
      os.environ.update(saved)
  # The resolver sorts the hosts by name but takes SLURM_PROCID as the index
  # into that sorted list; Slurm numbers ranks in node-list order (node9
  # before node10). This task's own address is its node and local id.
  task = None
  node, local = environ.get('SLURMD_NODENAME'), environ.get('SLURM_LOCALID')
  if node and local is not None:
    own = '%s:%d' % (node, port_base + int(local))
    if own in spec.get(JOB, []):
      task = spec[JOB].index(own)
  if task is None:
    task_type, task = resolver.get_task_info()
    task = task if task_type == JOB else None
  return _Description(spec, 'Slurm step', task, 'Slurm')


def _HasWorkerJob(tf_config):
  """Whether TF_CONFIG text names a 'worker' job (else it is not ours)."""
  try:
    return bool(json.loads(tf_config).get('cluster', {}).get(JOB))
  except (ValueError, AttributeError):
    return True  # Let FromJson say what is wrong with it.


def Resolve(cluster_spec='', task=None, environ=None, slurm=True,
            port_base=SLURM_PORT_BASE, require_worker=False):
  """The cluster description a process was given, by precedence.

  1. `cluster_spec` (a flag: any form of Parse), with `task` if given;
  2. TF_CONFIG in the environment;
  3. Slurm's environment inside an srun step (if `slurm`).

  Args:
    cluster_spec: the flag's text ('' for none).
    task: this process's worker index from a flag (None: not given).
    environ: the environment (default os.environ).
    slurm: consider Slurm's environment.
    port_base: the first worker port on each Slurm node.
    require_worker: this process is a worker: its index must be known.

  Returns:
    A ClusterDescription, or None when nothing describes a cluster.

  Raises:
    ClusterSpecError: a description that cannot be used (see Parse), or
      with require_worker, one that does not say which worker this is.
  """
  environ = os.environ if environ is None else environ
  if cluster_spec:
    description = Parse(cluster_spec, require_worker=require_worker and
                        task is None)
    if task is not None:
      description = _Description(description.Dict(), '--cluster_spec', task,
                                 '--cluster_spec')
  elif environ.get('TF_CONFIG', '').strip() and (
      require_worker or _HasWorkerJob(environ['TF_CONFIG'])):
    description = FromJson(environ['TF_CONFIG'], 'TF_CONFIG',
                           require_worker=require_worker and task is None)
    if task is not None:
      description = _Description(description.Dict(), 'TF_CONFIG', task,
                                 'TF_CONFIG')
  elif slurm and InSlurmStep(environ):
    description = FromSlurm(port_base, environ)
  else:
    return None
  if require_worker and description.task is None:
    raise ClusterSpecError(
        'the cluster description (%s: %s) does not say which worker this '
        'process is: pass --task=i (0..%d), or TF_CONFIG with {"task": '
        '{"type": "worker", "index": i}}' %
        (description.source, description.Spec(), description.num_tasks - 1))
  return description
