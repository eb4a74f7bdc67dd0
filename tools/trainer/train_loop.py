"""The training loop: one synchronous update per mini-batch, resumable.

Each step runs the task's ``train_op`` (Lingvo learners: the optimizer and
learning-rate schedule of ``p.train``) once on one mini-batch; the pipeline
adds up the gradients of its micro-batches, so it is one update per
mini-batch. The loop:

* resumes from the newest checkpoint in logdir (weights, optimizer slots,
  global step), and skips the batches already consumed;
* saves a checkpoint every N steps and when it stops (end, Ctrl-C, SIGTERM);
  Ctrl-C and SIGTERM let the running step finish (counted, checked, logged)
  and stop before the next one, so that the exit checkpoint, the console and
  the step log name the same step (see _StopSignals);
* logs every step's metrics to logdir/train_steps.jsonl, prints a progress
  line and writes TensorBoard summaries every N steps, and traces a step
  every M steps for the pipeline timeline, bubbles and peak memory (and
  writes that step's timeline to logdir/traces/step_<N>.trace.json, which
  Perfetto and chrome://tracing open);
* stops with a clear error, without saving, on a NaN/Inf loss, and on a dead
  worker process or a step that exceeds its timeout (with
  ``--max_worker_restarts`` the trainer then restarts the workers and runs a
  new loop from the newest checkpoint: tools/trainer/cli.py).

A run that can restart (``--max_worker_restarts``, ``--elastic``) keeps its
built training graph: the next loop with the same configuration (a restart
of its workers, not a move to another shape) opens a new session on it
instead of building the model again, and starts its input at the newest
checkpoint's batch (the input's skip is fed when its iterator is
initialized: ``tasks.dataset_input``'s ``skip_at_initialization``).
"""

import math
import os
import re
import signal
import statistics
import sys
import threading
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.runtime import background
from gpipe.runtime import liveness
from gpipe.runtime import local_cluster
from gpipe.measure import timeline
from lingvo import compat as tf
from lingvo.core import py_utils
from tasks import dataset_input
from tools.trainer import checkpoints
from tools.trainer import model_graph
from tools.trainer import progress
from tools.trainer import sessions
from tools.trainer import startup
from tools.trainer import step_trace
from tools.trainer import summaries


# Set by the trainer binary (python -m tools.trainer), whose process ends
# with the run: a session on its local worker processes is then left open at
# the end instead of closed (see _RunSession). Callers of cli.main in their
# own process keep the default: their sessions are closed.
LEAVE_LOCAL_SESSIONS_OPEN = False

# Session runs left running on a lost master task or after a second Ctrl-C
# (_RunInThread); a new session waits until they end, so that none of their
# updates lands after its restore.
_PENDING_RUNS = []
# The master task is probed this often during a run; this many failed
# probes in a row mean it is lost.
MASTER_PROBE_SECS = 2.0
MASTER_PROBE_MISSES = 2

# Trace files of traced steps (Trace Event Format: open them in
# https://ui.perfetto.dev or chrome://tracing).
TRACE_DIR = 'traces'
# One entry per TrainLoop of this process (a restart makes another).
_LOOPS_STARTED = []
# How long the main thread waits for a session run between two looks at
# the loop's signals (_RunInThread).
_WAIT_SLICE_SECS = 0.2
# The training graph of this process's last loop that could restart, or
# one built ahead (TrainLoop.BuildAhead): [(its configuration's key,
# NestedMap(built, saver, init, input_init, skips, fetches), where it came
# from)], for the next loop of the same configuration; emptied when the
# run's training ends (ForgetKeptGraph).
_KEPT = []


def ForgetKeptGraph():
  """Lets the kept training graph go (the run's training has ended)."""
  del _KEPT[:]
# Steps timed as start-up phases (the first one optimizes, partitions and
# instantiates; the second shows a step without that).
STARTUP_STEPS = 2


def TracePath(logdir, step):
  """The pipeline trace file of traced step `step` in `logdir`."""
  return os.path.join(logdir, TRACE_DIR, 'step_%d.trace.json' % step)


class NonFiniteLossError(FloatingPointError):
  """The loss became NaN or Inf."""


class WorkerLostError(RuntimeError):
  """A pipeline worker died or stopped answering during training.

  Attributes:
    summary: what happened, without the advice on what to do next.
    noticed: when the trainer first saw the failure (time.time()): the
      failed session run's return, before the checks that name the lost
      task (a recovery's seconds count from here).
  """

  def __init__(self, message, summary=None, noticed=None):
    super().__init__(message)
    self.summary = summary or message.split(': training stopped')[0]
    self.noticed = noticed if noticed is not None else time.time()


def ConsoleMetrics(metrics):
  """The metrics worth a console column: the task's own and the lr."""
  shown = {
      k: v for k, v in metrics.items()
      if '/' not in k and k != 'num_samples_in_batch'
  }
  lr = LearningRate(metrics)
  if lr is not None:
    shown['lr'] = lr
  return shown


# A run this much off its plan's prediction is told to plan again.
PLAN_OFF = 0.25
# The TensorBoard run (a subdirectory of the logdir) of a plan's predicted
# examples/s: under the same tag as the measured, so the two share a chart.
PLAN_RUN = 'planned'


def PlanLine(planned, intervals, first_step, model):
  """The console line setting a plan's prediction beside the run's speed.

  Args:
    planned: the examples/s the plan predicted (``--plan``).
    intervals: (steps, examples/s, clean) of each logged interval after the
      loop's first (whose steps build and warm up); clean: without a
      checkpoint, an evaluation or a traced step, which the plan does not
      predict. Clean intervals count when there are any; a last interval
      shorter than the others (max_steps not a multiple of the logging
      period) only when nothing else does.
    first_step: the step the loop started from.
    model: the registered model (for the planner's command line).

  Returns:
    'the plan predicted P examples/s; this run from step S: M (the median
    of N logged intervals after the first), E% slower|faster than planned',
    with what to do when the two are more than PLAN_OFF apart (or, when
    every interval held a checkpoint, evaluation or trace, how to log to
    compare steps alone); or a line saying there was too little to compare.
  """
  measured_ones = [i for i in intervals if i[1] > 0]
  counted = [i for i in measured_ones if i[2]]
  clean = bool(counted)
  counted = counted or measured_ones
  full = max((steps for steps, _, _ in counted), default=0)
  rates = [rate for steps, rate, _ in counted if steps == full]
  if not rates:
    return ('the plan predicted %.1f examples/s; this run from step %d logged '
            'too few intervals after its first to compare (log more often: '
            '--log_every_n_steps)' % (planned, first_step))
  measured = statistics.median(rates)
  off = measured / planned - 1
  if round(100 * off) == 0:
    how = 'as fast as planned'
  else:
    how = '%.0f%% %s than planned' % (100 * abs(off),
                                      'slower' if off < 0 else 'faster')
  line = ('the plan predicted %.1f examples/s; this run from step %d: %.1f '
          '(the median of %d logged interval%s after the first%s), %s' % (
              planned, first_step, measured, len(rates),
              's' if len(rates) > 1 else '',
              '' if clean else
              ', each with a checkpoint, evaluation or traced step', how))
  if not clean:
    line += ('. The plan predicts steps alone: log more often than the '
             'checkpoints and traces come (--log_every_n_steps below '
             '--checkpoint_every_n_steps and --trace_every_n_steps) to '
             'compare them')
  elif abs(off) > PLAN_OFF:
    line += (': the machine is %s than when the plan was made, the plan was '
             'made elsewhere, or its prediction missed. Plan again here '
             '(python -m tools.plan --model=%s --devices=N --plan_out=FILE, '
             'then --plan=FILE: the checkpoints resume)' % (
                 'slower or busier' if off < 0 else 'faster or quieter',
                 model))
  return line


def LearningRate(metrics):
  """The learning rate among Lingvo's learner metrics ('learning_rate/..')."""
  for key in sorted(metrics):
    if key == 'learning_rate' or key.startswith('learning_rate/'):
      return metrics[key]
  return None


class TrainLoop:
  """Trains a registered model in `logdir`, resuming where it stopped."""

  def __init__(self, run, after_checkpoint=None, echo=print, watch=None):
    """Configures the loop (nothing runs yet).

    Args:
      run: the tools.trainer.run_config.RunConfig (params, placement, logdir,
        seed and the periods).
      after_checkpoint: optional function(checkpoint path) called after
        each periodic checkpoint and the final one (e.g. an evaluation).
      echo: prints a console line.
      watch: optional hooks of a run that changes its devices
        (tools.trainer.elastic.Elastic): ``Built(model)`` once the graph is
        built, ``FirstStep(step, writer)`` after the loop's first step,
        ``Traced(step, tasks)`` after each traced step (its stage tasks,
        gpipe.measure.timeline), and ``MoveAtCheckpoint(step)`` after each
        periodic checkpoint, which ends the loop there when it returns
        True (``moved``).
    """
    self._run = run
    self._placement = run.placement
    self._logdir = run.logdir
    self._ckpt_every = max(1, run.checkpoint_every_n_steps)
    self._log_every = max(1, run.log_every_n_steps)
    self._trace_every = run.trace_every_n_steps
    self._after_checkpoint = after_checkpoint
    self._last_saved = None
    self._done_after = None
    self._echo = echo
    self._watch = watch
    # The last step done (restored or trained), and whether the loop ended
    # at a checkpoint for the watch to move the run (see __init__).
    self.step = None
    self.moved = False
    # The loop's SIGTERM/SIGINT handlers (_StopSignals), once it started.
    self._signals = None
    self._interrupted = None
    # Start-up phases up to the second step, written to startup.json: from
    # the trainer's start, or after a restart from this loop's (``Run``).
    self._graph_ops = None
    self._first_loop = None
    self._startup = None

  def _StartLog(self):
    """Starts the start-up log: this loop's run starts."""
    self._first_loop = not _LOOPS_STARTED
    if _LOOPS_STARTED:
      self._startup = startup.StartupLog(origin=time.time())
    else:
      self._startup = startup.StartupLog()
      self._startup.Mark('trainer start (imports, flags, workers)',
                         time.time() - startup.TrainerStartTime())
    _LOOPS_STARTED.append(True)

  @classmethod
  def BuildAhead(cls, run, echo=print):
    """Builds `run`'s training graph now, for its loop to take as kept.

    A caller that knows the run it starts next (``tools/trainer/
    timed_run.py``, while the planner measures the layers) builds its graph
    while the workers have nothing to run; the run's own loop then finds it
    kept, as a restarted loop finds its own, and starts from the session.
    Nothing runs on a worker, and no loop counts as started.

    Args:
      run: the RunConfig the next loop will train.
      echo: prints a console line.

    Returns:
      True if the graph was built; False if `run` resumes from a checkpoint
      in its logdir (its loop builds then: the checkpoint is checked
      against the graph).
    """
    loop = cls(run, echo=echo)
    loop._startup = startup.StartupLog(origin=time.time())  # Not written.
    cfg, resume = loop._TrainParams()
    if resume:
      return False
    loop._Build(cfg, resume, keep=True)
    return True

  def _TrainParams(self):
    """The Train() params, positioned after the batches already consumed."""
    resume = checkpoints.Newest(self._logdir)
    start_step = 0
    if resume:
      try:
        start_step = checkpoints.GlobalStepOf(resume)
      except (tf.errors.NotFoundError, ValueError):
        start_step = 0  # Not ours, or unreadable: CheckCompatible says so.
    cfg = self._run.train.Copy()
    if 'skip_at_initialization' in cfg.input and self._Restartable():
      cfg.input.skip_at_initialization = True
    if start_step and 'skip_batches' in cfg.input:
      # One batch per step: resume exactly where the data left off.
      cfg.input.skip_batches = start_step
    elif start_step:
      self._echo('warning: the input %s has no skip_batches param: the '
                 'resumed run reads its data from the start' %
                 cfg.input.cls.__name__)
    return cfg, resume

  def _Restartable(self):
    """Whether a loop of this run may follow this one in the same shape."""
    return bool(self._run.max_worker_restarts or self._placement.elastic)

  def _KeyOf(self, cfg):
    """What a kept graph must have been built for to serve `cfg`.

    The input's position is not part of it (fed at initialization); the
    logdir is (the saver writes there).
    """
    cfg = cfg.Copy()
    if 'skip_batches' in cfg.input:
      cfg.input.skip_batches = 0
    placement = self._placement
    return (cfg.ToText(), self._run.seed, self._run.square_norms,
            os.path.abspath(self._logdir),
            placement.session_cluster is not None, placement.distributed,
            placement.num_cpus, tuple(placement.devices or ()))

  def _Build(self, cfg, resume, keep=False):
    """The training graph, saver and ops: built, or kept from the last loop.

    Args:
      cfg: the Train() params (``_TrainParams``).
      resume: the checkpoint the run resumes from, or None.
      keep: keep the graph for the next loop of this configuration even if
        this run cannot restart (``BuildAhead``).

    Returns:
      NestedMap(built, saver, init, input_init, skips, fetches): input_init
      (None without such inputs) initializes the inputs' iterators, which
      read the batches to skip from the placeholders `skips`.
    """
    # A graph is kept for a run that may restart or built ahead for it:
    # none is looked for otherwise.
    key = (self._KeyOf(cfg) if keep or _KEPT or self._Restartable() else
           None)
    if key is not None and _KEPT and _KEPT[0][0] == key:
      parts, origin = _KEPT[0][1], _KEPT[0][2]
      self._graph_ops = len(parts.built.graph.get_operations())
      self._echo('kept the training graph %s (the same configuration): a '
                 'new session, no rebuild' % origin)
      with self._startup.Phase('graph kept %s' % origin):
        if self._watch is not None:
          self._watch.Built(parts.built.model)
        if resume:
          checkpoints.CheckCompatible(resume, parts.saver.variables)
      return parts
    del _KEPT[:]  # Its memory, before the next graph is built.
    started = time.time()
    built = model_graph.Build(cfg, self._placement, 'train', self._run.seed,
                              phases=self._startup,
                              square_norms=self._run.square_norms)
    task = built.task
    self._graph_ops = len(built.graph.get_operations())
    self._echo('built the training graph in %.1f s' % (time.time() - started))
    if self._watch is not None:
      self._watch.Built(built.model)
    for line in model_graph.Describe(built.model):
      self._echo(line)
    with built.graph.as_default(), self._startup.Phase(
        'saver and initializers'):
      saver = checkpoints.Checkpointer(self._logdir)
      if resume:
        # Before anything is written to logdir: a checkpoint of another model
        # stops the run here and stays as it is.
        checkpoints.CheckCompatible(resume, saver.variables)
      init = tf.group(tf.compat.v1.global_variables_initializer(),
                      tf.compat.v1.local_variables_initializer(),
                      tf.compat.v1.tables_initializer())
      initializers = tf.compat.v1.get_collection(dataset_input.INITIALIZERS)
      input_init = tf.group(*initializers) if initializers else None
      fetches = {
          'train': task.train_op,
          'metrics': {k: v[0] for k, v in task.eval_metrics.items()},
      }
      built.graph.finalize()
    parts = py_utils.NestedMap(
        built=built, saver=saver, init=init, input_init=input_init,
        skips=built.graph.get_collection(dataset_input.SKIPS),
        fetches=fetches)
    if keep or self._Restartable():
      _KEPT.append((key, parts, 'built ahead' if keep else
                    'of the last run'))
    return parts

  def Run(self):
    """Trains to max_steps; returns (global step, path of last checkpoint)."""
    self._StartLog()
    cfg, resume = self._TrainParams()
    max_steps = self._run.max_steps or cfg.task.train.max_steps
    parts = self._Build(cfg, resume)
    self._AwaitPendingRuns()
    with self._startup.Phase('session'):
      sess = self._placement.NewSession(parts.built.graph)
    # Savers refuse to work in eager mode: run inside the model's graph.
    with parts.built.graph.as_default():
      return self._RunSession(sess, parts, max_steps, cfg, resume)

  def _RunSession(self, sess, parts, max_steps, cfg, resume):
    """Initializes or restores, trains, then runs after_checkpoint."""
    built, saver, fetches = parts.built, parts.saver, parts.fetches
    try:
      options = self._placement.RunOptions()
      with self._startup.Phase('variable initialization'):
        self._Guarded(lambda: sess.run(parts.init, options=options),
                      'while initializing the variables', resume)
      if resume:
        self._Guarded(lambda: saver.RestoreFrom(sess, resume),
                      'while restoring %s' % resume, resume)
      # Written once the checkpoint has been read: a run that stops on a bad
      # checkpoint leaves the logdir as it was.
      with open(os.path.join(self._logdir, 'train_params.txt'), 'w') as f:
        f.write(cfg.ToText())
      step = int(sess.run(built.global_step))
      if parts.input_init is not None:
        # Where the restored step's data left off (_TrainParams), or the
        # run's own skip_batches on a fresh start.
        self._Guarded(lambda: sess.run(
            parts.input_init,
            feed_dict={s: cfg.input.skip_batches for s in parts.skips},
            options=options), 'while initializing the input', resume)
      self.step = step
      if resume:
        self._echo('resumed from %s at step %d' % (resume, step))
      step, path = self._Loop(sess, saver, fetches, built.global_step, step,
                              max_steps, cfg.input.batch_size, resume)
    except BaseException:
      if self._placement.elastic:
        # The run goes on over the tasks that serve, which keep this
        # session's variables until it is closed.
        sessions.CloseOrAbandon(sess)
      elif self._placement.distributed:
        # Closing a distributed session waits for every worker, forever if
        # one died: leave it open (on a lost worker the caller exits the
        # process without closing it).
        sessions.Abandon(sess)
      else:
        sess.close()
      raise
    if (LEAVE_LOCAL_SESSIONS_OPEN and self._placement.cluster is not None and
        not self._placement.elastic):
      # The process ends with the run and stops its local workers: closing
      # would only deregister the graphs on each of them (14 s with 16
      # workers). Left open, the process exits without the interpreter's
      # cleanup (cli.main), which would close it too.
      sessions.Abandon(sess)
    else:
      sess.close()
    if path and self._done_after != path and not self._interrupted:
      self._AfterCheckpoint(path)  # Not after a stop: see cli._Train.
    return step, path

  def _AwaitPendingRuns(self):
    """Waits for the runs a lost master task left behind to end.

    Not with a session cluster (--elastic): each session's state is its
    own there, so a run left on an old session cannot reach the new one's.
    """
    if self._placement.elastic:
      return
    timeout = self._placement.step_timeout_ms / 1000 + 30
    while _PENDING_RUNS:
      thread = _PENDING_RUNS[0]
      if thread.is_alive():
        self._echo('waiting for the step left on the lost master task to end '
                   '(at most the step timeout, %d s)' %
                   (self._placement.step_timeout_ms // 1000))
        thread.join(timeout)
      _PENDING_RUNS.pop(0)

  def _WriteStartup(self):
    """Writes startup.json and a line: the start-up until this step."""
    result = self._startup.Write(
        os.path.join(self._logdir, 'startup.json'),
        model=self._run.model, graph_ops=self._graph_ops)
    self._echo('start-up: %.1f s from the %s to the end of step %d; '
               'trainer peak memory %.0f MiB (phases in %s)' % (
                   result['since_trainer_start'],
                   'trainer\'s start' if self._first_loop else
                   'restart (or move)',
                   int(result['phases'][-1]['phase'].split()[-1]),
                   result['trainer_peak_bytes'] / 2**20,
                   os.path.join(self._logdir, 'startup.json')))

  def _AfterCheckpoint(self, path):
    if self._after_checkpoint is not None:
      self._after_checkpoint(path)
      self._done_after = path

  def _Loop(self, sess, saver, fetches, global_step, step, max_steps,
            batch_size, last_ckpt):
    """Runs steps until max_steps or a stop request; see the module docstring.

    Ctrl-C and SIGTERM only request a stop (_StopSignals): the loop ends
    between two steps and saves the step it ended on. A second Ctrl-C stops
    at once without saving.
    """
    self._signals = _StopSignals()
    with self._signals:
      try:
        return self._Steps(sess, saver, fetches, global_step, step,
                           max_steps, batch_size, last_ckpt)
      except KeyboardInterrupt:
        self._echo('stopped at once by a second Ctrl-C, without saving the '
                   'steps after the last checkpoint (%s): run the same '
                   'command to resume from it' % (self._last_saved or
                                                  'none yet'))
        raise

  @property
  def stop_requested(self):
    """The signal that asked the loop to stop ('SIGTERM', 'SIGINT'), or None."""
    return self._signals.received if self._signals is not None else None

  @property
  def interrupted(self):
    """The signal that stopped the loop before max_steps, or None."""
    return self._interrupted

  def _Steps(self, sess, saver, fetches, global_step, step, max_steps,
             batch_size, last_ckpt):
    """_Loop's steps and exit checkpoint (within its signal handlers)."""
    writer = summaries.Writer(self._logdir)
    # Steps past `step` that an earlier run wrote are redone: TensorBoard
    # shows the new ones only (as the step log keeps one history).
    writer.Restart(step)
    step_log = progress.StepLog(self._logdir, resume_step=step)
    replicas = self._run.data_parallel
    meter = progress.Progress(step, max_steps, replicas=replicas)
    if self._placement.restarts:
      # TensorBoard shows where the run went on after a restart.
      writer.Scalars(step, {'trainer/worker_restarts':
                                self._placement.restarts})
      writer.Flush()
    start_step = step
    # The plan's predicted examples/s (--plan), written beside the measured
    # (PLAN_RUN); each logged interval after this loop's first, for the
    # comparison at the end (PlanLine), and whether a checkpoint, an
    # evaluation or a traced step fell in the current one.
    planned = self._run.planned_examples_per_second
    plan_writer = self._PlanWriter(step) if planned else None
    intervals = []
    disturbed = False
    saved_step = step if last_ckpt else None
    self._last_saved = last_ckpt
    state_ok = True
    try:
      while step < max_steps:
        # Checked only here, between two steps: the step a signal arrived in
        # has been counted, checked, logged and (on a period) saved.
        if self.stop_requested:
          self._signals.announced = True
          self._interrupted = self.stop_requested
          if saved_step == step:
            self._echo('interrupted after step %d (%s): its checkpoint %s '
                       'is saved' % (step, self.stop_requested, last_ckpt))
          else:
            self._echo('interrupted after step %d (%s): saving a checkpoint '
                       '%s' % (step, self.stop_requested,
                               _ForceHint(self.stop_requested)))
          break
        self._CheckWorkers('before step %d' % (step + 1), last_ckpt)
        trace = self._trace_every and (step + 1 == start_step + 2 or
                                       (step + 1) % self._trace_every == 0)
        metadata = tf.compat.v1.RunMetadata() if trace else None
        steps_run = step - start_step
        if steps_run < STARTUP_STEPS:
          with self._startup.Phase('step %d' % (steps_run + 1)):
            out = self._RunStep(sess, fetches, trace, metadata, step,
                                last_ckpt)
          if steps_run + 1 == STARTUP_STEPS or step + 1 >= max_steps:
            self._WriteStartup()
        else:
          out = self._RunStep(sess, fetches, trace, metadata, step, last_ckpt)
        # One update per run. (A global step fetched in the same run as the
        # update may be read before or after its increment.)
        step += 1
        self.step = step
        metrics = {k: float(v) for k, v in out['metrics'].items()}
        loss = metrics['loss']
        if not math.isfinite(loss):
          state_ok = False
          raise NonFiniteLossError(
              'the loss is %s at step %d: training stopped. The weights after '
              'this step were not saved; the last good checkpoint is %s. Try '
              'a smaller learning rate (--model_params_override='
              '"task.train.learning_rate=...") or gradient clipping, and '
              'resume or start a new --logdir.' % (loss, step, last_ckpt or
                                                   '(none yet)'))
        step_log.Append(step, metrics)
        meter.Count(metrics.get('num_samples_in_batch', batch_size))
        if self._watch is not None and step == start_step + 1:
          self._watch.FirstStep(step, writer)
        if trace:
          self._WriteTrace(writer, step, metadata)
          disturbed = True
        if step % self._log_every == 0 or step >= max_steps:
          interval_start = meter.last_step
          line, rate = meter.Line(step, ConsoleMetrics(metrics))
          self._echo(line)
          if interval_start != start_step:
            intervals.append((step - interval_start, rate, not disturbed))
          disturbed = False
          if plan_writer is not None:
            # Flushed by its Close: nothing to wait for within a step.
            plan_writer.Scalars(step, {'examples_per_sec': planned})
          scalars = dict(metrics)
          scalars['examples_per_sec'] = rate
          if replicas > 1:
            # A synchronous step: each replica takes 1/R of the mini-batch.
            scalars['examples_per_sec_per_replica'] = rate / replicas
          lr = LearningRate(metrics)
          if lr is not None:
            scalars['learning_rate'] = lr
          writer.Scalars(step, scalars)
          writer.Flush()
        if step % self._ckpt_every == 0:
          last_ckpt = self._Save(sess, saver, step)
          saved_step = step
          self._AfterCheckpoint(last_ckpt)
          disturbed = True  # The next interval's time holds them.
          if (self._watch is not None and step < max_steps and
              self._watch.MoveAtCheckpoint(step)):
            self.moved = True
            break
    except BaseException:
      # A failed run may have applied part of an update: never save it over
      # the last good checkpoint. (A second Ctrl-C ends here too: it stops
      # without saving.)
      state_ok = False
      raise
    finally:
      writer.Close()
      step_log.Close()
      if state_ok:
        last_ckpt = self._SaveAtExit(sess, saver, global_step, saved_step,
                                     last_ckpt)
      if plan_writer is not None:
        self._ClosePlanWriter(plan_writer)
    if planned and not self.moved and step > start_step:
      # After the loop and its exit checkpoint: a line never costs a step.
      self._echo(PlanLine(planned, intervals, start_step, self._run.model))
    return step, last_ckpt

  def _PlanWriter(self, step):
    """The event writer of the plan's prediction (PLAN_RUN), or None.

    A display only: a directory it cannot write is said, not fatal.
    """
    try:
      plan_writer = summaries.Writer(os.path.join(self._logdir, PLAN_RUN))
      plan_writer.Restart(step)
      return plan_writer
    except (tf.errors.OpError, OSError) as e:
      self._echo('the plan\'s prediction is not written for TensorBoard '
                 '(%s): training goes on' % str(e).splitlines()[0])
      return None

  def _ClosePlanWriter(self, plan_writer):
    try:
      plan_writer.Close()
    except (tf.errors.OpError, OSError) as e:
      self._echo('the plan\'s prediction for TensorBoard could not be '
                 'written (%s)' % str(e).splitlines()[0])

  def _Save(self, sess, saver, step):
    path = self._Guarded(
        lambda: saver.Save(sess, step, options=self._placement.RunOptions()),
        'while saving the checkpoint of step %d' % step, self._last_saved)
    self._last_saved = path
    self._echo('saved %s' % path)
    return path

  def _SaveAtExit(self, sess, saver, global_step, saved_step, last_ckpt):
    """Saves the state at exit unless it is already saved."""
    try:
      # The step the checkpoint stores (the loop's count: a stop request
      # never cuts a step short).
      step = int(sess.run(global_step, options=self._placement.RunOptions()))
      if saved_step != step:
        return self._Save(sess, saver, step)
    except (tf.errors.OpError, FloatingPointError) as e:
      self._echo('could not save a checkpoint at exit (%s); the last one is '
                 '%s' % (str(e).splitlines()[0], last_ckpt))
    return last_ckpt

  def _CheckWorkers(self, doing, last_ckpt, wait_secs=0.0, noticed=None):
    """Raises WorkerLostError if a local worker died (waits up to wait_secs).

    Args:
      doing: what the trainer was doing, e.g. 'during step 7'.
      last_ckpt: the newest checkpoint path (for the message).
      wait_secs: keep checking this long (a worker's exit can be seen a
        moment after the RPC to it failed).
      noticed: when the failure that led here was seen (default: now).
    """
    deadline = time.time() + wait_secs
    while True:
      try:
        self._placement.CheckAlive()
      except local_cluster.WorkerDiedError as e:
        raise WorkerLostError(
            '%s %s: training stopped. The last checkpoint (%s) is intact: run '
            'the same command again to resume from it.' %
            (e, doing, last_ckpt or 'none yet'), noticed=noticed) from e
      if time.time() >= deadline:
        return
      time.sleep(0.1)

  def _RunStep(self, sess, fetches, trace, metadata, step, last_ckpt):
    """Runs training step `step` + 1; NaN/Inf checks become clear errors."""
    try:
      return self._Guarded(
          lambda: sess.run(fetches, options=self._placement.RunOptions(trace),
                           run_metadata=metadata),
          'during step %d' % (step + 1), last_ckpt)
    except tf.errors.InvalidArgumentError as e:
      if 'CheckNumerics' in e.message or 'not finite' in e.message:
        # Lingvo checks gradients for NaN/Inf (py_utils.CheckNumerics).
        raise NonFiniteLossError(
            'a NaN or Inf appeared at step %d (%s): training stopped. This '
            'step was not saved; the last good checkpoint is %s. Try a '
            'smaller learning rate (--model_params_override='
            '"task.train.learning_rate=...") or gradient clipping.' %
            (step + 1, _Reason(e), last_ckpt or '(none yet)')) from e
      raise

  def _Guarded(self, run, doing, last_ckpt):
    """Calls run() (session work); a lost worker or timeout: WorkerLostError.

    Args:
      run: a function running the session.
      doing: what it does, for messages ('during step 7').
      last_ckpt: the newest checkpoint path, for messages.

    Returns:
      What run() returns.
    """
    try:
      with _DeathWatch(self._placement, doing, last_ckpt,
                       recoverable=(self._placement.restarts <
                                    self._run.max_worker_restarts),
                       note=GaveUpNote(self._placement.restarts,
                                       self._run.max_worker_restarts)):
        if (self._placement.remote is not None or
            (self._signals is not None and self._signals.installed)):
          return self._RunInThread(run, doing, last_ckpt)
        return run()
    except tf.errors.DeadlineExceededError as e:
      noticed = time.time()
      self._CheckWorkers(doing, last_ckpt, wait_secs=self._LocalWaitSecs(),
                         noticed=noticed)
      summary = ('the session did not finish %s within the step timeout '
                 '(%d s)' % (doing, self._placement.step_timeout_ms // 1000))
      lost = self._LostRemoteTasks()
      summary += ': %s' % (lost or 'a worker is stuck or unreachable (%s)' %
                           _Reason(e))
      raise WorkerLostError(
          '%s. The last checkpoint (%s) is intact.' % (
              summary, last_ckpt or 'none yet'), summary=summary,
          noticed=noticed) from e
    except tf.errors.OpError as e:
      if not self._placement.distributed:
        raise
      noticed = time.time()
      self._CheckWorkers(doing, last_ckpt, wait_secs=self._LocalWaitSecs(),
                         noticed=noticed)
      if isinstance(e, (tf.errors.UnavailableError, tf.errors.AbortedError,
                        tf.errors.CancelledError, tf.errors.InternalError)):
        summary = 'a pipeline worker became unreachable %s (%s: %s)' % (
            doing, type(e).__name__, _Reason(e))
        lost = self._LostRemoteTasks()
        if lost:
          summary += ': ' + lost
        raise WorkerLostError(
            '%s. The last checkpoint (%s) is intact: restart the workers and '
            'run the same command to resume.' % (summary, last_ckpt or
                                                 'none yet'),
            summary=summary, noticed=noticed) from e
      raise

  def _RunInThread(self, run, doing, last_ckpt):
    """run() in a thread while this one watches signals and the master task.

    Python runs signal handlers only in the main thread, between bytecodes:
    while that thread is inside a session run, Ctrl-C and SIGTERM wait for
    the run to return, however long it takes. Here the main thread waits in
    short slices instead, so that a stop request is acknowledged at once
    and a second Ctrl-C (KeyboardInterrupt) stops a stuck run.

    With a running cluster, a session run whose master task died waits until
    the step timeout: no task is left to end it. A lost task other than the
    master fails the run by itself (the master ends the step), so only the
    master is probed. MASTER_PROBE_MISSES failed probes in a row,
    MASTER_PROBE_SECS apart, raise WorkerLostError.

    On WorkerLostError and on a second Ctrl-C the run's thread is left to
    end on its own (_PENDING_RUNS); nothing is saved after it.

    Args:
      run: a function running the session.
      doing: what it does, for messages ('during step 7').
      last_ckpt: the newest checkpoint path, for messages.

    Returns:
      What run() returns (what it raises is raised here).
    """
    # The default graph is per thread: the run's thread uses this one's.
    graph = tf.compat.v1.get_default_graph()

    def Run():
      with graph.as_default():
        return run()

    call = background.BackgroundCall(Run, name='trainer: ' + doing)
    remote = self._placement.remote
    misses = 0
    next_probe = time.time() + MASTER_PROBE_SECS
    try:
      # Slices, not one wait: a signal the kernel hands to another thread
      # does not wake this one, which runs the handler at its next wake-up.
      while not call.Wait(_WAIT_SLICE_SECS):
        if self.stop_requested and not self._signals.announced:
          self._signals.announced = True
          self._echo('%s %s: training stops once it ends %s' %
                     (self.stop_requested, doing,
                      _ForceHint(self.stop_requested)))
        if remote is None or time.time() < next_probe:
          continue
        reason = liveness.Probe(remote.addresses[0],
                                remote.probe_timeout_secs)
        next_probe = time.time() + MASTER_PROBE_SECS
        misses = misses + 1 if reason else 0
        if misses >= MASTER_PROBE_MISSES and not call.done:
          _PENDING_RUNS.append(call.thread)
          summary = "%s, the session's master, does not answer (%s) %s" % (
              remote.Describe(0), reason, doing)
          raise WorkerLostError(
              '%s: training stopped. The last checkpoint (%s) is intact: start '
              'the task again and run the same command to resume.' %
              (summary, last_ckpt or 'none yet'), summary=summary)
    except KeyboardInterrupt:
      # A second Ctrl-C: the caller stops without saving, so the run may go
      # on; a new session in this process waits for it (_AwaitPendingRuns).
      _PENDING_RUNS.append(call.thread)
      raise
    return call.Result()

  def _LocalWaitSecs(self):
    """Seconds to watch local workers after a failed run (none without).

    A local worker's exit can show a moment after the RPC to it failed.
    """
    return 3 if self._placement.cluster is not None else 0

  def _LostRemoteTasks(self):
    """The --cluster_spec tasks that do not answer now, as a clause.

    Returns:
      RemoteTasks.Explain's clause, or '' when every task answers (or
      there is no cluster spec).
    """
    remote = self._placement.remote
    lost = remote.Unreachable() if remote is not None else []
    return remote.Explain(lost) if lost else ''

  def _WriteTrace(self, writer, step, metadata):
    """Summaries of a traced step, and its trace file for Perfetto."""
    scalars, png, tasks = step_trace.Measure(
        metadata, title='step %d' % step)
    writer.Scalars(step, scalars)
    if png:
      writer.Image(step, 'pipeline/timeline', png)
    if tasks and self._watch is not None:
      self._watch.Traced(step, tasks)
    if tasks:
      os.makedirs(os.path.join(self._logdir, TRACE_DIR), exist_ok=True)
      timeline.WriteChromeTrace(tasks, TracePath(self._logdir, step),
                                step=step)
    writer.Flush()


def GaveUpNote(restarts, max_restarts):
  """' (gave up after N worker restart(s), ...)' once restarts ran out."""
  if not max_restarts:
    return ''
  return ' (gave up after %d worker restart(s), --max_worker_restarts=%d)' % (
      restarts, max_restarts)


class _DeathWatch:
  """Ends the process if a local worker dies while a step stays blocked.

  A step whose worker died usually fails at once with an RPC error, handled
  by the loop. When it does not (it can wait on the lost worker until the
  step timeout), this thread notices the dead process, waits `grace_secs`
  for the step to fail by itself (not if the worker was the sessions'
  master, worker 0: then nothing ends the step), then prints the error and
  exits: every checkpoint, summary and step-log line is already on disk.
  """

  def __init__(self, placement, doing, last_ckpt, poll_secs=0.5,
               grace_secs=5.0, recoverable=False, note=''):
    self._placement = placement
    self._recoverable = recoverable
    self._note = note
    self._doing = doing
    self._last_ckpt = last_ckpt
    self._poll_secs = poll_secs
    self._grace_secs = grace_secs
    self._done = threading.Event()
    self._thread = None

  def __enter__(self):
    # With a session cluster (--elastic) the survivors must keep running:
    # a lost master is noticed by the loop's probe instead (_RunInThread).
    if self._placement.cluster is not None and not self._placement.elastic:
      self._thread = threading.Thread(target=self._Watch, daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *unused):
    self._done.set()

  def _Watch(self):
    while not self._done.wait(self._poll_secs):
      try:
        self._placement.CheckAlive()
      except local_cluster.WorkerDiedError as e:
        # Without its master (worker 0) no task is left to end the step:
        # it cannot fail by itself, so it is not waited for.
        grace = 0 if e.task == 0 else self._grace_secs
        if self._done.wait(grace):
          return  # The step returned; the loop reports the dead worker.
        if self._recoverable:
          # Stopping every worker fails the blocked run with an RPC error;
          # the loop then restarts the workers.
          self._placement.Stop()
          return
        sys.stderr.write(
            'trainer: error: %s %s, and the session run did not return: '
            'training stopped%s. The last checkpoint (%s) is intact: run the '
            'same command again to resume from it.\n' %
            (e, self._doing, self._note, self._last_ckpt or 'none yet'))
        sys.stderr.flush()
        sys.stdout.flush()
        self._placement.Stop()
        os._exit(1)  # pylint: disable=protected-access


class _StopSignals:
  """SIGTERM and SIGINT (Ctrl-C) handlers of the training loop.

  Python runs a handler once the session run in progress returns, that is
  after the step's update was applied: a handler that raised would lose that
  step (not counted, checked or logged, yet saved by the exit checkpoint).
  These handlers only note the request; the loop stops between two steps.
  A second Ctrl-C while a stop is pending raises KeyboardInterrupt at once,
  so that a stuck step or save can still be stopped (without saving); a
  second SIGTERM changes nothing (a supervisor follows up with SIGKILL).

  Outside the loop (set-up, the final evaluation) Python's own behaviour is
  kept: Ctrl-C raises KeyboardInterrupt and SIGTERM ends the process, which
  leaves every checkpoint as it was. A signal the process was started with
  ignored (e.g. SIGINT of a background job of a script) stays ignored, and
  handlers are only set in the main thread (Python allows no other).

  Attributes:
    received: the name of the first signal received ('SIGTERM' or 'SIGINT'),
      or None.
    announced: whether the console was told (once is enough).
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.received = None
    self.announced = False
    self._previous = {}

  @property
  def installed(self):
    """Whether the handlers are set (they are while the loop runs)."""
    return bool(self._previous)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
          self._previous[signum] = signal.signal(signum, self._Handle)
    return self

  def __exit__(self, *unused):
    for signum, previous in self._previous.items():
      # None: a handler set outside Python; the default is the nearest.
      signal.signal(signum,
                    signal.SIG_DFL if previous is None else previous)
    self._previous = {}

  def _Handle(self, signum, unused_frame):
    if self.received is None:
      self.received = signal.Signals(signum).name
    elif signum == signal.SIGINT:
      raise KeyboardInterrupt()


def _ForceHint(received):
  """How to stop at once, once `received` ('SIGINT', 'SIGTERM') is pending."""
  return '(Ctrl-C %s stops at once, without saving)' % (
      'again' if received == 'SIGINT' else 'now')


_NOISE = ('Graph execution error', 'Detected at node', 'Node:', '[[', 'File ',
          'Additional GRPC error')


def _Reason(error):
  """The line of a TensorFlow error message that says what went wrong."""
  for line in error.message.splitlines():
    text = re.sub(r'^\(\d+\) ', '', line.strip())
    if (text and not text.startswith(_NOISE) and
        not re.match(r'\d+ (root|successful|derived) ', text)):
      return text[:300]
  return type(error).__name__
