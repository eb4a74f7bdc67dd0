"""``--elastic``: a lost worker shrinks the run, a returning one grows it.

The run's tasks are the local worker processes of ``--worker_processes`` or
the servers of ``--cluster_spec`` / ``TF_CONFIG``, each known by its index
in that description (a *slot*: 'task 2'; tools/trainer/members.py). Sessions
run on a session cluster of the slots in use
(gpipe.runtime.session_cluster), so the run can go on over any of them,
whatever cluster the servers were started with.

When a task is lost (a step fails and the task does not answer):

1. a local worker is restarted first, while ``--max_worker_restarts``
   allows (one fresh process in its place, the others kept); the servers
   of a running cluster are waited for up to ``--worker_wait_secs`` (their
   supervisor restarts them; a cluster file given as ``@path`` is re-read,
   so one back at another address counts). Back in time: the run goes on
   in the same shape from the newest checkpoint, as without --elastic;
2. otherwise the run *shrinks*: a new shape for the devices of the tasks
   that serve (tools/trainer/reshape.py: the planner from the run's saved
   profile, else the fallback rule; the global batch and, where the counts
   allow, R x M are kept), the newest checkpoint restored in it, the input
   at the step it holds. When nothing fits, the run stops with what a
   device would need and the cap (ElasticError).

While training, a thread probes the lost and spare tasks (and re-reads the
cluster file) every ``POLL_SECS``; when they would let the run use more
devices, it *grows* at the next periodic checkpoint: the loop stops right
after saving it, and the run goes on in the larger shape from it, losing no
step.

Every move is said on the console (which task, the old and the new R, K, M
and schedule and how they were chosen, the steps redone since the
checkpoint, the seconds from the loss to the first step in the new shape),
written to TensorBoard at that first step (``trainer/devices``,
``trainer/replans``, ``trainer/recovery_secs``, ``trainer/steps_redone``,
beside ``examples_per_sec``) and appended to ``<logdir>/elastic.jsonl``.
"""

import dataclasses
import json
import os
import threading
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.measure import timeline
from gpipe.plan import profile as profile_lib
from gpipe.plan import search
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import local_cluster
from gpipe.runtime import session_cluster as session_cluster_lib
import numpy as np
from lingvo import compat as tf
from tools.trainer import checkpoints
from tools.trainer import evaler
from tools.trainer import members as members_lib
from tools.trainer import model_graph
from tools.trainer import model_select
from tools.trainer import planned
from tools.trainer import rebalance
from tools.trainer import remote_tasks
from tools.trainer import reshape
from tools.trainer import train_loop

EVENTS_FILE = 'elastic.jsonl'
# How often lost and spare tasks are probed (and the cluster file re-read)
# while training.
POLL_SECS = 2.0
USED, SPARE, LOST = members_lib.USED, members_lib.SPARE, members_lib.LOST
# Recoveries in a row without a step in between before the run gives up.
MAX_FRUITLESS = 3


class ElasticError(RuntimeError):
  """The run cannot go on on the tasks that serve; the text says why."""


def StartShape(run):
  """The reshape.Shape of a settled run (its one pipeline)."""
  found = model_select.FindPipelines(run.train)
  if len(found) != 1:
    raise ValueError(
        '--elastic re-plans a model with one pipeline; %s has %d' %
        (run.model, len(found)))
  _, pp = found[0]
  k = model_select.NumStages(pp)
  r = run.data_parallel
  first = pp.replica_devices[0] if pp.replica_devices else pp.stage_devices
  d = len(set(first or [])) or k
  m = pp.num_micro_batches
  if not m:
    m = run.train.input.batch_size // (r * pp.micro_batch_size)
  return reshape.Shape(r, k, m, pp.schedule, max(1, k // d))


def StateBytes(path):
  """The bytes of every variable in checkpoint `path` (None if unreadable)."""
  try:
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
  except (tf.errors.OpError, OSError, ValueError):
    return None
  return sum(int(np.prod(shape or [1])) * dtypes[name].size
             for name, shape in shapes.items())


def ReadEvents(logdir):
  """The records of <logdir>/elastic.jsonl, in order ([] without it)."""
  path = os.path.join(logdir, EVENTS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class Elastic:
  """The elastic run: its tasks, its shape, and the moves between shapes."""

  def __init__(self, run, echo=print, poll_secs=POLL_SECS):
    """Takes over a settled run; `self.run` is the run to train first.

    Args:
      run: the settled RunConfig, on local workers or a running cluster. Its
        settings say the rest: the cluster file of --cluster_spec=@path
        (read again), --memory_per_device (the cap of new shapes),
        --max_worker_restarts, --worker_wait_secs, --connect_timeout_secs.
      echo: prints a console line.
      poll_secs: how often lost and spare tasks are probed while training.

    Raises:
      ValueError: a run without workers, with several pipelines, or a
        --memory_per_device that is not a size.
    """
    placement = run.placement
    if placement is None or not (placement.cluster is not None or
                                 placement.remote is not None):
      raise ValueError(
          '--elastic needs workers to lose: --worker_processes=N, or a '
          'running cluster (--cluster_spec or TF_CONFIG)')
    self._echo = echo
    self._placement = placement
    self._local = placement.cluster
    try:
      self._cap = (search.ParseBytes(run.memory_per_device)
                   if run.memory_per_device else None)
    except ValueError as e:
      raise ValueError('--memory_per_device: %s' % e) from None
    self._max_restarts = run.max_worker_restarts
    self._wait_secs = run.worker_wait_secs
    self._poll_secs = poll_secs
    # The serving tasks a grow was last considered for (_Watch).
    self._considered = None
    self._start_run = run
    self._start = StartShape(run)
    _, pp = model_select.FindPipelines(run.train)[0]
    self._num_layers = len(pp.layers) if pp.layers is not None else None
    profile_path = os.path.join(run.logdir, planned.PROFILE_FILE)
    self._profile = (profile_lib.Load(profile_path)
                     if os.path.exists(profile_path) else None)
    self.members = members_lib.Members(
        placement, echo, cluster_spec_lib.SpecFile(run.cluster_spec),
        run.connect_timeout_secs)
    self._lock = self.members.lock
    self.shape = self._start
    self.replans = 0
    self._choice = reshape.Choice(self._start, None, reshape.START,
                                  'as started')
    self._pending = None
    self._move = None
    self._fruitless = 0
    # The last step any loop did (steps redone count up to it).
    self._last_step = 0
    # Rebalancing: the watch over traced steps (Built), each stage device's
    # stage, the first cut's layer costs, and a proposed cut.
    self._rebalancer = None
    self._watched_shape = None
    self._stage_of = {}
    self._layer_costs = None
    self._rebalance = None
    # Whether a step ran since the last recovery (FirstStep).
    self._stepped = False
    self.run = self._Configure(self.members.In(USED), self._choice)
    if self._local is None:
      first = 'waited for up to %g s (--worker_wait_secs)' % self._wait_secs
    elif self._max_restarts:
      first = ('restarted while --max_worker_restarts=%d allows' %
               self._max_restarts)
    else:
      first = 'not restarted (--max_worker_restarts=0)'
    echo('elastic: %s on %d device(s) of %s; a lost task is %s, then the '
         'run goes on with the tasks that serve' % (
             self.shape.label, self.shape.num_devices,
             ', '.join(s.name for s in self.members.slots), first))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._Watch, daemon=True,
                                    name='elastic: watching tasks')
    self._thread.start()

  def Close(self):
    """Stops the watching thread."""
    self._stop.set()

  def Settle(self):
    """Writes a move no step followed (the final evaluation's) as done.

    Its record has first_step None and the seconds up to now.
    """
    event, self._pending = self._pending, None
    if event is None:
      return
    event['first_step'] = None
    event['secs'] = time.time() - event.pop('since')
    self._echo('elastic: %s in %s, no step after it: %.1f s from the loss '
               'to its end' % (event['kind'], event['new'], event['secs']))
    with open(os.path.join(self._start_run.logdir, EVENTS_FILE), 'a') as f:
      f.write(json.dumps(event, sort_keys=True) + '\n')

  def LostTasks(self):
    """The tasks in use that do not serve now, with why ('' if none)."""
    used = self.members.InUse()
    reasons = self.members.Reasons(used)
    return '; '.join('%s does not answer (%s)' % (s.Describe(),
                                                  reasons[s.index])
                     for s in used if reasons[s.index] is not None)

  # Shapes.

  def _Choose(self, num_devices, checkpoint=None):
    """The reshape.Choice for `num_devices` (NoShapeError if none fits)."""
    if self._profile is not None:
      return reshape.FromProfile(
          self._profile, self._start, num_devices, self._cap,
          dtype=self._start_run.fprop_dtype, model=self._start_run.model)
    got = reshape.Fallback(self._start, num_devices, self._num_layers)
    if self._cap is not None and checkpoint:
      reshape.CheckWeights(StateBytes(checkpoint), got.shape, self._cap)
    return got

  def _Params(self, cfg, choice, train):
    """A copy of the starting params `cfg` in the choice's shape.

    Measured task costs (``task_costs``, per stage) are kept only while they
    fit: a plan's own, or the starting ones if K and the cut are the same.

    Args:
      cfg: the starting run's train or test params.
      choice: the reshape.Choice to lay out (its plan or cut, if any).
      train: whether `cfg` trains (its M follows the shape).

    Returns:
      The changed copy.
    """
    cfg = cfg.Copy()
    before = []
    for _, pp in model_select.FindPipelines(cfg):
      # Laid out again by _Configure, for R replicas or one.
      pp.stage_devices = None
      pp.replica_devices = None
      before.append(_Cut(pp))
    s, start = choice.shape, self._start
    if choice.plan is not None:
      planned.Apply(cfg, choice.plan)
    elif s != start:
      model_select.SetPipelineShape(
          cfg, num_stages=s.num_stages if s.num_stages != start.num_stages
          else None,
          num_micro_batches=s.micro_batches if train else None,
          schedule=s.schedule if s.schedule != start.schedule else None)
    if choice.cut is not None:
      for _, pp in model_select.FindPipelines(cfg):
        pp.num_stages = len(choice.cut)
        pp.stage_sizes = list(choice.cut)
    for (_, pp), cut in zip(model_select.FindPipelines(cfg), before):
      if choice.cut is not None or (choice.plan is None and
                                    _Cut(pp) != cut):
        # Costs of other stages: the executor refuses those of another K,
        # and those of another cut would order the tasks wrongly.
        pp.task_costs = None
    return cfg

  def _Configure(self, slots, choice):
    """Lays the choice's shape out on the first of `slots`; the new run.

    The slots used are the fewest, in task order, whose devices hold the
    shape; the others are spares.
    """
    shape = choice.shape
    need = shape.num_devices
    used, count = [], 0
    for slot in sorted(slots, key=lambda s: s.index):
      if count >= need:
        break
      used.append(slot)
      count += len(slot.devices)
    cluster = session_cluster_lib.SessionCluster([s.address for s in used])
    task_devices, left = [], need
    for task, slot in enumerate(used):
      names = cluster.Rename(slot.devices, task)[:left]
      left -= len(names)
      task_devices.append(names)
    devices = [d for names in task_devices for d in names]
    train = self._Params(self._start_run.train, choice, True)
    model_select.SetStageDevices(train, devices, loop=shape.loop_stages,
                                 data_parallel=shape.replicas, exact=True)
    test = None
    if self._start_run.test is not None:
      test = self._Params(self._start_run.test, choice, False)
      model_select.SetStageDevices(
          test, devices[:len(devices) // shape.replicas],
          loop=shape.loop_stages, exact=True)
    self.members.Use(used, slots)
    self._placement.UseServers(
        [s.address for s in used], task_devices, [s.name for s in used],
        local_workers=[s.index for s in used] if self._local else None)
    self._placement.remote.SetStages(train)
    self.shape, self._choice = shape, choice
    return dataclasses.replace(
        self._start_run, train=train, test=test, data_parallel=shape.replicas,
        planned_examples_per_second=self._PlannedRate(choice))

  def _PlannedRate(self, choice):
    """A plan's predicted examples/s for `choice`'s run, or None.

    The plan (--plan) predicted the run as started: a move to another shape
    or cut is not the plan's; one back to the starting shape, laid out as
    it started (no cut or plan of its own), is.
    """
    if choice.how != reshape.START and not (
        choice.shape == self._start and choice.plan is None and
        choice.cut is None):
      return None
    return self._start_run.planned_examples_per_second

  # The loop's hooks (train_loop.TrainLoop's watch).

  def Built(self, model):
    """After a loop built its graph: watch its cut for slow devices."""
    pipes = model_graph.Pipelines(model)
    watching, self._rebalancer = self._rebalancer, None
    if len(pipes) != 1:
      return
    pipe = pipes[0]
    if pipe.layer_costs is not None and self._layer_costs is None:
      self._layer_costs = pipe.layer_costs
    self._stage_of = {}
    for devices in pipe.replica_devices:
      for k, device in enumerate(devices):
        self._stage_of.setdefault(device, set()).add(k)
    one_per_device = all(len(stages) == 1
                         for stages in self._stage_of.values())
    if self._layer_costs is None or not one_per_device or (
        pipe.num_stages < 2):
      return
    if watching is not None and self._watched_shape == self.shape:
      # A rebalanced cut of the same shape: what was measured stays.
      watching.UseCut(pipe.stage_sizes)
      self._rebalancer = watching
    else:
      self._rebalancer = rebalance.Rebalancer(self._layer_costs,
                                              pipe.stage_sizes)
    self._watched_shape = self.shape

  def Traced(self, step, tasks):
    """After a traced step: a slow device asks for a new cut."""
    if self._rebalancer is None:
      return
    busy = timeline.StageBusySeconds(tasks, by='device')
    seconds = [0.0] * len(self._rebalancer.sizes)
    for device, value in zip(timeline.Devices(tasks), busy):
      for k in self._stage_of.get(device, ()):
        seconds[k] = max(seconds[k], value)
    proposal = self._rebalancer.Observe(seconds, timeline.Span(tasks))
    if proposal is None:
      return
    with self._lock:
      if self._move is not None:
        return
      self._rebalance = proposal
      self._move = 'rebalancing after step %d: %s' % (step,
                                                      proposal.Describe())
    self._echo('elastic: %s; moving at the next checkpoint' % self._move)

  def FirstStep(self, step, writer):
    """After a loop's first step: TensorBoard, and the move's report."""
    scalars = {'trainer/devices': self.shape.num_devices,
               'trainer/replans': self.replans}
    event, self._pending = self._pending, None
    if event is not None:
      event['first_step'] = step
      event['secs'] = time.time() - event.pop('since')
      scalars['trainer/recovery_secs'] = event['secs']
      scalars['trainer/steps_redone'] = event['steps_redone']
      self._echo('elastic: first step in %s (step %d) %.1f s after %s' % (
          event['new'], step, event['secs'], 'the move began'
          if event['kind'] in ('grow', 'rebalance') else 'the loss'))
      with open(os.path.join(self._start_run.logdir, EVENTS_FILE), 'a') as f:
        f.write(json.dumps(event, sort_keys=True) + '\n')
    self._stepped = True
    writer.Scalars(step, scalars)
    writer.Flush()

  def MoveAtCheckpoint(self, step):
    """Whether the run moves (grows) now, after the checkpoint of `step`."""
    with self._lock:
      move = self._move
    if move is None:
      return False
    self._echo('elastic: moving at the checkpoint of step %d: %s' %
               (step, move))
    return True

  # Moves.

  def _Watch(self):
    """Probes lost and spare tasks; asks for a move when they add devices."""
    while not self._stop.wait(self._poll_secs):
      try:
        self._WatchOnce()
      except Exception as e:  # pylint: disable=broad-except
        # The watch must not end the run; the next round tries again.
        self._echo('elastic: warning: watching the tasks failed: %s: %s' %
                   (type(e).__name__, e))

  def _WatchOnce(self):
    """One round of _Watch."""
    self.members.Reread()
    with self._lock:
      if self._move is not None or not self.members.In(LOST, SPARE):
        return
    back = self.members.In(LOST)
    joined = self.members.Join(back) if back else []
    # Spares are probed too: one that stopped serving since it was
    # last seen would make a move to a shape that cannot be laid out.
    serving = self.members.In(USED) + self.members.Serving(
        self.members.In(SPARE))
    count = self.members.Devices(serving)
    considered = (frozenset((s.index, s.address) for s in serving),
                  self.shape)
    if count <= self.shape.num_devices or considered == self._considered:
      return
    # Planned once per set of serving tasks and shape, not every round.
    self._considered = considered
    try:
      choice = self._Choose(count, checkpoints.Newest(
          self._start_run.logdir))
    except reshape.NoShapeError:
      return
    if choice.shape.num_devices > self.shape.num_devices:
      with self._lock:
        self._move = '%s serve%s: %s -> %s on %d device(s)' % (
            ', '.join(s.Describe() for s in joined) or 'spare tasks',
            's' if len(joined) == 1 else '', self.shape.label,
            choice.shape.label, choice.shape.num_devices)
      self._echo('elastic: %s; moving at the next checkpoint' %
                 self._move)

  def _Event(self, kind, since, step_before, old, lost=(), added=()):
    """A move's record: written to elastic.jsonl after its first step.

    Args:
      kind: 'shrink', 'grow', 'rebalance' or 'restart'.
      since: when the loss was noticed (or the move began).
      step_before: the last step the ending loop did (None: none).
      old: the shape before.
      lost: the lost tasks, with why.
      added: the tasks taken in.

    Returns:
      A dict; steps_redone counts from the newest checkpoint to the last
      step ever done (a loss during a move redoes the first loss's steps).
    """
    ckpt = checkpoints.Newest(self._start_run.logdir)
    ckpt_step = checkpoints.GlobalStepOf(ckpt) if ckpt else 0
    self._last_step = max(self._last_step, step_before or 0, ckpt_step)
    before = self._last_step
    return dict(
        kind=kind, since=since, time=time.time(), lost=list(lost),
        added=list(added), old=old.label, new=self.shape.label,
        old_shape=old.ToJson(), new_shape=self.shape.ToJson(),
        devices=self.shape.num_devices, how=self._choice.how,
        note=self._choice.note, checkpoint=ckpt, checkpoint_step=ckpt_step,
        step_before=before, steps_redone=max(0, before - ckpt_step),
        tasks=[s.name for s in self.members.In(USED)])

  def Move(self, loop):
    """The run in the larger shape, after the loop stopped at a checkpoint."""
    since = time.time()
    with self._lock:
      self._move = None
      proposal, self._rebalance = self._rebalance, None
    if proposal is not None:
      return self._Rebalance(proposal, since, loop)
    serving = self.members.Serving(self.members.In(USED, SPARE))
    old = self.shape
    try:
      choice = self._Choose(self.members.Devices(serving),
                            checkpoints.Newest(self._start_run.logdir))
    except reshape.NoShapeError:
      choice = self._choice
    added = [s.Describe() for s in serving if s.state == SPARE]
    self.run = self._Configure(serving, choice)
    if choice.shape != old:
      self.replans += 1
    self._pending = self._Event('grow', since, loop.step, old, added=added)
    self._echo('elastic: growing to %d device(s) of %s: %s -> %s (%s: %s); '
               '%s, no step redone' % (
                   self.shape.num_devices, self.members.Describe(), old.label,
                   self.shape.label, choice.how, choice.note,
                   _From(self._pending)))
    return self.run

  def _Rebalance(self, proposal, since, loop):
    """The run in the same shape with the proposal's cut."""
    old = self.shape
    choice = dataclasses.replace(self._choice, how='rebalance',
                                 note=proposal.Describe(),
                                 cut=tuple(proposal.sizes))
    self.run = self._Configure(self.members.In(USED), choice)
    self.replans += 1
    self._pending = self._Event('rebalance', since, loop.step, old)
    self._pending.update(old_cut=list(proposal.old_sizes),
                         new_cut=list(proposal.sizes),
                         factors=list(proposal.factors),
                         predicted_gain=proposal.gain)
    self._echo('elastic: rebalancing %s: cut %s -> %s; %s, no step redone' %
               (self.shape.label, list(proposal.old_sizes),
                list(proposal.sizes), _From(self._pending)))
    return self.run

  def AfterLoss(self, error, loop):
    """The run to go on with after `error` (a WorkerLostError) in `loop`.

    Args:
      error: the train_loop.WorkerLostError (or a
        remote_tasks.TaskUnreachableError of a new session's check).
      loop: the TrainLoop it ended (its last step).

    Returns:
      A RunConfig: the same shape if every task serves again, else a
      smaller one.

    Raises:
      ElasticError: nothing fits on the tasks that serve, or recoveries
        keep failing; the text says why and what is kept.
    """
    # From when the failed step returned: the checks naming the lost task
    # (and a wait for a local worker's exit) count in the recovery.
    since = min(time.time(), getattr(error, 'noticed', None) or time.time())
    with self._lock:
      # A grow or rebalance proposed before the loss was for the shape it
      # ends (a cut of K stages, more devices than now): dropped; the watch
      # proposes again for the new shape.
      self._move, self._rebalance = None, None
      self._considered = None
    self._fruitless = 1 if self._stepped else self._fruitless + 1
    self._stepped = False
    unfinished, self._pending = self._pending, None
    summary = getattr(error, 'summary', None)
    if summary is None:
      # A new session's check (remote_tasks.Connect): its advice to start
      # the servers and run again is what the move does next.
      summary = '%s, starting the session of %s' % (
          str(error).split(' (--cluster_spec')[0], self.shape.label)
    self._echo('worker lost: %s' % summary)
    # The tasks the session ran on, one the cluster file moved among them.
    used = self.members.InUse()
    reasons = self.members.Reasons(used)
    for slot in used:
      if reasons[slot.index] is None and slot.devices is None:
        reasons[slot.index] = ('listed at a new address in the cluster file, '
                               'its devices not asked yet')
    lost = [s for s in used if reasons[s.index] is not None]
    for slot in lost:
      self._echo('elastic: %s is lost: %s' % (slot.Describe(),
                                              reasons[slot.index]))
    if lost and self._local is not None:
      lost = self.members.RestartLocal(lost, self._max_restarts)
    elif lost:
      lost = self.members.AwaitRemote(lost, self._wait_secs)
    old = self.shape
    ckpt = checkpoints.Newest(self._start_run.logdir)
    if not lost:
      if self._fruitless > MAX_FRUITLESS:
        raise ElasticError(
            '%s: the tasks serve, but %d recoveries in a row failed before '
            'a step: training stopped. The last checkpoint (%s) is intact' %
            (getattr(error, 'summary', error), self._fruitless - 1,
             ckpt or 'none yet'))
      kind, choice = 'restart', self._choice
      slots = used
    else:
      kind = 'shrink'
      self.members.Lose(lost)
      gone = {s.index for s in lost}
      kept = [s for s in used if s.index not in gone]
      in_use = {s.index for s in used}
      slots = kept + self.members.Serving(
          [s for s in self.members.In(SPARE) if s.index not in in_use])
      count = self.members.Devices(slots)
      try:
        choice = self._Choose(count, ckpt)
      except reshape.NoShapeError as e:
        raise ElasticError(
            'elastic: %s; %s: training stopped. The last checkpoint (%s) is '
            'intact: bring workers back (or raise --memory_per_device) and '
            'run the same command to resume from it' % (
                ', '.join('%s lost' % s.Describe() for s in lost), e,
                ckpt or 'none yet')) from None
    self.run = self._Configure(slots, choice)
    if kind == 'shrink':
      self.replans += 1
    lost_text = ['%s: %s' % (s.Describe(), reasons[s.index]) for s in lost]
    if unfinished is not None:
      # Lost again before the last move's first step: one move from the
      # shape and the time of the first loss.
      since, lost_text = unfinished['since'], unfinished['lost'] + lost_text
      old = reshape.Shape(**unfinished['old_shape'])
      if unfinished['kind'] != 'restart':
        kind = unfinished['kind'] if kind == 'restart' else kind
    self._pending = self._Event(kind, since, loop.step, old, lost=lost_text)
    event = self._pending
    if kind == 'restart':
      self._echo('elastic: every task serves: going on in %s %s, redoing '
                 '%d step(s)' % (self.shape.label, _From(event),
                                 event['steps_redone']))
    else:
      self._echo(
          'elastic: shrinking to %d device(s) of %s: %s -> %s (%s: %s); %s, '
          'redoing %d step(s)' % (
              self.shape.num_devices, self.members.Describe(), old.label,
              self.shape.label, choice.how, choice.note, _From(event),
              event['steps_redone']))
    return self.run


def _Cut(pp):
  """(K, stage sizes) of a pipeline's params: what its task costs are for."""
  sizes = pp.stage_sizes
  return (model_select.NumStages(pp),
          tuple(sizes) if sizes is not None else None)


def _From(event):
  """'from the checkpoint of step 10' (or from the start, without one)."""
  if event['checkpoint']:
    return 'from the checkpoint of step %d' % event['checkpoint_step']
  return 'from the start (no checkpoint yet)'


class Evaluation:
  """Evaluation on the shape in use; a task lost during it is a loss.

  ``InLoop`` is the training loop's ``after_checkpoint``: a task lost while
  it evaluates ends the loop with a WorkerLostError, and the run goes on
  from that checkpoint on the tasks that serve (that checkpoint's
  evaluation is not redone). ``Final`` evaluates after training and, on a
  loss, moves the run (``Elastic.AfterLoss``) and evaluates again.

  Attributes:
    loop: the training loop that ran last (AfterLoss reads its step).
  """

  def __init__(self, driver, echo=print, evaluate=None):
    """Constructor.

    Args:
      driver: the run's Elastic.
      echo: prints a console line.
      evaluate: evaler.Evaluate (tests give another).
    """
    self._driver = driver
    self._echo = echo
    self._evaluate = evaluate or evaler.Evaluate
    self.loop = None

  def InLoop(self, path):
    return self._Evaluate(path, retry=False)

  def Final(self, path):
    return self._Evaluate(path, retry=True)

  def _Evaluate(self, path, retry):
    while True:
      try:
        result = self._evaluate(self._driver.run, path=path, echo=self._echo)
        if retry:
          self._driver.Settle()
        return result
      except (tf.errors.OpError, local_cluster.WorkerDiedError,
              remote_tasks.TaskUnreachableError) as e:
        noticed = time.time()
        lost = self._driver.LostTasks()
        if not lost and isinstance(e, tf.errors.DeadlineExceededError):
          # As in training: a task that answers probes but not the step.
          lost = 'a task is stuck (the step timeout ran out)'
        if not lost:
          raise  # Not a lost task: the error is the evaluation's own.
        summary = 'a task was lost while evaluating %s (%s): %s' % (
            path, type(e).__name__, lost)
        error = train_loop.WorkerLostError(
            '%s. The checkpoints are intact.' % summary, summary=summary,
            noticed=noticed)
        if not retry:
          raise error from e
        self._driver.AfterLoss(error, self.loop)
