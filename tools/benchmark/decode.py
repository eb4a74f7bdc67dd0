"""The decode subcommand: pipelined decoding of a Transformer, K=1 vs K=2.

Decodes one batch of a T(L, H, A) encoder-decoder Transformer
(``tasks/mt``) greedily and with beam search on pinned one-core worker
processes: K=1 (one worker) with the unpipelined decoder and with the
pipelined one in M lanes, and K=2 (two workers) pipelined in M lanes
(``tasks/mt/pipelined_decode.py``, ``gpipe/lanes.py``). The network is cut
for decoding (``decode_cut.DecodeCut``: 2K stages, each device holding a
share of the encoder layers and a share of the decoder layers and softmax,
balanced by their decoding steps' times measured at the lanes' rows). Every
configuration restores the same weights (random, saved once), checks that
its tokens equal the K=1 unpipelined decoder's, and is timed interleaved
with the others; with random weights no sequence ends early, so every
decode runs all its steps.

Reported per configuration: sentences per second, the time per decoding
step (the latency of one token of a sentence), the speed-up over the best
K=1 configuration, and for pipelined ones the measured idle fraction of
each device over the decoding loop (from execution traces: the ``D`` tasks
of ``gpipe.schedules.pipeline_tasks``) beside the lane schedule's formula
``gpipe.schedules.decode_lanes.BubbleFraction`` and beside the same lane
schedule simulated with each stage's traced task time (its imbalance
without hand-over time), and the traced spans of
the encoder (its ``F`` tasks) and of the loop; the workers' peak memory;
and a timeline picture of one pipelined decode (encoder and first steps).
With ``--xla`` each pipelined configuration is also decoded with its stage
functions compiled by XLA (``compile='xla'``: the encoder stages and the
decoding steps), beside a table of its first decode (when XLA compiles)
and graph size.
"""

import collections
import os
import statistics
import tempfile
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
import numpy as np
from gpipe import pipeline
from gpipe import xla
from gpipe.schedules import pipeline_tasks
from gpipe.measure import timeline
from gpipe.schedules import decode_lanes
from gpipe.schedules import simulate
from lingvo import compat as tf
from lingvo.core import cluster_factory
from tasks.mt import blocks
from tasks.mt import decode_cut
from tasks.mt import model
from tasks.mt import pipelined_decode
from tasks.mt import stack
from tools.benchmark import report
from tools.benchmark import runner as runner_lib

# The Transformer decoded: T(4, 2048, 8), d_model 512, vocabulary 8000.
DECODE_MODEL = dict(vocab_size=8000, model_dim=512, hidden_dim=2048,
                    num_heads=8, num_layers=4, src_len=16, max_decode_len=16)
QUICK_DECODE_MODEL = dict(vocab_size=64, model_dim=32, hidden_dim=64,
                          num_heads=2, num_layers=2, src_len=6,
                          max_decode_len=4)


class DecodeConfig(
    collections.namedtuple('DecodeConfig',
                           ['num_stages', 'lanes', 'beam', 'batch',
                            'whole_layers', 'compile'])):
  """One decoding configuration; lanes None: the unpipelined decoder.

  ``whole_layers``: cut the decoder at whole layers only (for comparison
  with the cut into step parts). ``compile``: 'xla' compiles the stage
  functions (the network's ``compile``), None not.
  """

  __slots__ = ()

  @property
  def label(self):
    how = 'unpipelined' if self.lanes is None else 'M=%d' % self.lanes
    search = 'greedy' if self.beam == 1 else 'beam %d' % self.beam
    return 'K=%d %s %s%s%s' % (self.num_stages, how, search,
                               ' whole layers' if self.whole_layers else '',
                               ' ' + self.compile if self.compile else '')


DecodeConfig.__new__.__defaults__ = (False, None)


def Layers(shape):
  """The flat layer list of the Transformer of sizes `shape`, no dropout."""
  return stack.EncoderDecoderLayers(
      vocab_size=shape['vocab_size'], model_dim=shape['model_dim'],
      hidden_dim=shape['hidden_dim'], num_heads=shape['num_heads'],
      num_layers=shape['num_layers'], dropout_prob=0.0)


_MEASURED_COSTS = {}


def _StepCosts(shape, config, num_devices):
  """The measured step costs of the decoder layers' parts and the softmax.

  Measured once per lane size and search (``decode_cut.MeasuredStepCosts``
  with ``parts=True``, beam search's pick and cache reordering included);
  None for one device, which needs no cut.

  Raises:
    ValueError: a pipelined configuration without a lane count.
  """
  if num_devices == 1:
    return None
  if config.lanes is None:
    raise ValueError('%s: a cut over %d devices decodes in lanes; give the '
                     'configuration a lane count' % (config.label,
                                                     num_devices))
  rows = config.batch // config.lanes * config.beam
  key = tuple(sorted(shape.items())) + (rows, config.beam)
  if key not in _MEASURED_COSTS:
    layers = Layers(shape)
    decoder = [p for p in layers if p.cls in (blocks.DecoderLayer,
                                              blocks.SoftmaxLayer)]
    _MEASURED_COSTS[key] = decode_cut.MeasuredStepCosts(
        decoder, rows, shape['src_len'], shape['max_decode_len'],
        parts=True, beam_size=config.beam)
  return _MEASURED_COSTS[key]


class DecodeStep:
  """One configuration's graph, session and decode of its batch."""

  def __init__(self, config, shape, target, devices, checkpoint,
               cut='decode', cluster=None):
    """Builds the graph and restores (or first saves) the weights.

    Only the restore writes the saved variables (no initializer runs
    first), so a worker holds its stages' weights once.

    Args:
      config: a DecodeConfig.
      shape: the model sizes (DECODE_MODEL).
      target: the session target of the worker processes ('' in process).
      devices: K device strings, one per stage.
      checkpoint: the weights' path; saved there first if missing.
      cut: 'decode' (``decode_cut.DecodeCut``: 2K stages, the encoder and
        the decoder balanced on their own, the decoder by measured step
        times) or 'params' (weight bytes balanced: memory).
      cluster: the LocalCluster of `target`, if any: every run goes through
        its ``Call`` (a worker that dies fails it with the worker's error).
    """
    self.config = c = config
    self.times = []
    self.graph = tf.Graph()
    self._cluster = cluster
    start = time.time()
    layers = Layers(shape)
    with self.graph.as_default(), cluster_factory.SetEval(True):
      tf.random.set_seed(1)
      p = model.TransformerMTTask.Params().Set(
          name='mt', max_decode_len=shape['max_decode_len'], beam_size=c.beam)
      p.network = pipeline.PipeliningLayer.Params().Set(
          name='network', layers=layers, num_stages=c.num_stages,
          num_micro_batches=1, stage_devices=list(devices),
          compile=c.compile)
      self.step_costs = self.lead_parts = None
      if cut == 'decode':
        self.step_costs = _StepCosts(shape, c, len(devices))
        if c.whole_layers and self.step_costs:
          self.step_costs = [sum(x) if isinstance(x, list) else x
                             for x in self.step_costs]
        decode = decode_cut.DecodeCut(layers, devices, self.step_costs)
        self.lead_parts = decode.lead_parts
        p.network.Set(num_stages=len(decode.stage_sizes),
                      stage_sizes=decode.stage_sizes,
                      stage_devices=decode.stage_devices)
      else:
        p.network.partition_cost = cut
      task = p.Instantiate()
      self.stage_sizes = task.network.stage_sizes
      rng = np.random.RandomState(7)
      with tf.device(devices[0]):
        src = tf.constant(rng.randint(
            4, shape['vocab_size'], size=[c.batch, shape['src_len']]),
                          tf.int32)
        paddings = tf.zeros([c.batch, shape['src_len']])
      if c.lanes is not None:
        self.ids, _ = pipelined_decode.Decode(task, task.theta, src, paddings,
                                              c.beam, c.lanes,
                                              lead_parts=self.lead_parts)
      elif c.beam > 1:
        self.ids = task.BeamSearchDecode(task.theta, src, paddings,
                                         beam_size=c.beam)[0]
      else:
        self.ids, _ = task.GreedyDecode(task.theta, src, paddings)
      saved = task.vars.Flatten()
      self.weight_bytes = sum(
          v.shape.num_elements() * v.dtype.base_dtype.size for v in saved)
      # One restore per device, each reading only its own variables.
      saver = tf.train.Saver(saved, sharded=True)
      init_all = tf.compat.v1.global_variables_initializer()
      init_others = tf.compat.v1.variables_initializer(
          [v for v in tf.compat.v1.global_variables()
           if all(v is not w for w in saved)])
    self.build_seconds = time.time() - start
    # A lost worker fails the run instead of hanging it.
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=600 * 1000)
    if c.compile:
      xla.SessionConfig(config)
    self.session = tf.compat.v1.Session(target, graph=self.graph,
                                        config=config)
    with self.graph.as_default():
      if os.path.exists(checkpoint + '.index'):
        try:
          self._Call(lambda: self.session.run(init_others))
          self._Call(lambda: saver.restore(self.session, checkpoint))
        except BaseException:
          self.Close()
          raise
      else:
        self.session.run(init_all)
        saver.save(self.session, checkpoint, write_meta_graph=False)

  def _Call(self, fn):
    """fn(), through the cluster's Call if any, in this step's graph."""
    if self._cluster is None:
      return fn()

    def InGraph():
      # Call runs fn in a thread of its own: the default graph is per thread.
      with self.graph.as_default():
        return fn()

    return self._cluster.Call(InGraph)

  def Run(self, trace=False):
    """Decodes the batch; returns seconds (and the ids and RunMetadata)."""
    metadata = tf.compat.v1.RunMetadata() if trace else None
    options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE) if trace else None
    start = time.time()
    ids = self._Call(lambda: self.session.run(
        self.ids, options=options, run_metadata=metadata))
    seconds = time.time() - start
    return (seconds, ids, metadata) if trace else seconds

  def Close(self):
    if self._cluster is not None:
      # Also when a worker died: the close does not wait on it.
      self._cluster.CloseSession(self.session)
    else:
      self.session.close()


def _TracedTasks(metadata):
  """(decoding-loop tasks (phase D), encoder tasks (phase F)) of a run."""
  tasks = timeline.ParseStepStats(metadata.step_stats)
  return ([t for t in tasks if t.phase == pipeline_tasks.DECODE],
          [t for t in tasks if t.phase == pipeline_tasks.FORWARD])


def _TimedModelBubbles(tasks, num_lanes, num_steps):
  """Each device's idle fraction in the lane schedule with traced task times.

  Every task of a stage costs the median traced time of that stage's
  decoding tasks, and hand-overs are free: what the stages' imbalance alone
  leaves idle, to set beside the unit-cost formula and the measurement.

  Args:
    tasks: the traced decoding tasks (one stage per device).
    num_lanes: M.
    num_steps: T.

  Returns:
    Per device, its idle fraction.
  """
  stages = sorted({t.stage for t in tasks})
  cost = [statistics.median(t.end - t.start for t in tasks if t.stage == s)
          for s in stages]
  _, orders = decode_lanes.DeviceOrders(len(stages), num_lanes, num_steps)
  times = simulate.TaskTimes(
      orders, len(stages), num_lanes, costs=lambda task: cost[task.stage],
      dependencies=lambda task: decode_lanes.Dependencies(task, len(stages)))
  span = max(end for device in times for _, _, end in device)
  return [1.0 - sum(end - start for _, start, end in device) / span
          for device in times]


def _FirstSteps(tasks, num_steps):
  """The tasks of the first `num_steps` steps of each (stage, lane, phase)."""
  seen = collections.Counter()
  kept = []
  for t in sorted(tasks, key=lambda t: t.start):
    seen[t.stage, t.micro_batch, t.phase] += 1
    if seen[t.stage, t.micro_batch, t.phase] <= num_steps:
      kept.append(t)
  return kept


def Decode(args):
  """Pipelined decoding: sentences/s, per-token latency, bubble, K=1 vs K=2."""
  shape = QUICK_DECODE_MODEL if args.quick else DECODE_MODEL
  lanes = [int(m) for m in args.lanes.split(',')]
  beams = [int(b) for b in args.beams.split(',')]
  whole = [int(m) for m in args.whole_layer_lanes.split(',') if m.strip()]
  length = shape['max_decode_len']
  settings = dict(shape, lanes=lanes, beams=beams, whole_layer_lanes=whole,
                  batch=args.batch,
                  beam_batch=args.beam_batch, steps=args.steps,
                  trace_steps=args.trace_steps, priority=args.priority)
  header, info = report.Header('Pipelined decoding', settings)
  result = dict(machine=info, settings=settings, configs=[])
  runner = runner_lib.Runner(priority=args.priority, log=report.Log)
  checkpoint = os.path.join(tempfile.mkdtemp(), 'decode_model')
  steps = []
  try:
    for beam in beams:
      batch = args.batch if beam == 1 else args.beam_batch
      configs = [DecodeConfig(1, None, beam, batch)]
      configs += [DecodeConfig(k, m, beam, batch) for k in (1, 2)
                  for m in lanes if batch % m == 0]
      configs += [DecodeConfig(2, m, beam, batch, True) for m in whole
                  if batch % m == 0]
      if args.xla:
        configs += [c._replace(compile='xla') for c in configs
                    if c.lanes is not None]
      for c in configs:
        cluster = runner.Cluster('gpipe', c.num_stages)
        step = DecodeStep(c, shape, cluster.target, cluster.devices,
                          checkpoint)
        report.Log('built %-28s in %5.1f s' % (c.label, step.build_seconds))
        steps.append(step)
    # Every configuration decodes the unpipelined K=1 decoder's tokens.
    reference, decoded = {}, []
    for step in steps:
      # The first decode (XLA compiles the stage functions in it).
      step.first_seconds, ids, _ = step.Run(trace=True)
      if step.config.lanes is None and step.config.num_stages == 1:
        reference[step.config.beam] = ids
      decoded.append(ids)
    for step, ids in zip(steps, decoded):
      step.same_tokens = bool(np.array_equal(ids,
                                             reference[step.config.beam]))
    seconds = runner.TimeInterleaved(steps, args.steps, args.warmup)
    rows = []
    for step in steps:
      c = step.config
      traced = []
      if c.lanes is not None:
        for _ in range(args.trace_steps):
          run_seconds, _, metadata = step.Run(trace=True)
          tasks, encoder = _TracedTasks(metadata)
          traced.append((timeline.BubbleFractions(tasks, 'device'), tasks,
                         encoder))
        traced.sort(key=lambda r: statistics.mean(r[0]))
      median = seconds[c.label]
      entry = dict(
          K=c.num_stages, M=c.lanes, beam=c.beam, batch=c.batch,
          whole_layers=c.whole_layers,
          stage_sizes=step.stage_sizes, lead_parts=step.lead_parts,
          step_costs=step.step_costs, seconds=median,
          sentences_per_second=c.batch / median,
          ms_per_token=1e3 * median / length, same_tokens=step.same_tokens,
          compile=c.compile, first_seconds=step.first_seconds,
          build_seconds=step.build_seconds,
          graph_ops=len(step.graph.get_operations()),
          graph_bytes=step.graph.as_graph_def().ByteSize())
      if traced:
        bubbles, tasks, encoder = traced[len(traced) // 2]
        stages = len({t.stage for t in tasks})
        entry.update(measured_bubbles=bubbles,
                     formula_bubble=decode_lanes.BubbleFraction(
                         stages, c.lanes, length),
                     timed_model_bubbles=_TimedModelBubbles(
                         tasks, c.lanes, length),
                     loop_seconds=timeline.Span(tasks),
                     encoder_seconds=timeline.Span(encoder))
        step.tasks = encoder + tasks
      result['configs'].append(entry)
    for beam in beams:
      mine = [e for e in result['configs'] if e['beam'] == beam]
      best_one = max(e['sentences_per_second'] for e in mine if e['K'] == 1)
      for e in mine:
        e['speedup_over_best_k1'] = e['sentences_per_second'] / best_one
        rows.append([
            'greedy' if beam == 1 else 'beam %d' % beam, e['K'],
            ('unpipelined' if e['M'] is None else
             '%d, whole layers' % e['M'] if e['whole_layers'] else
             str(e['M'])) + (', ' + e['compile'] if e['compile'] else ''),
            e['batch'],
            e['sentences_per_second'], e['ms_per_token'],
            '%.2fx' % e['speedup_over_best_k1'],
            ', '.join('%.0f%%' % (100 * b)
                      for b in e.get('measured_bubbles', [])) or '-',
            '%.0f%%' % (100 * e['formula_bubble'])
            if 'formula_bubble' in e else '-',
            ', '.join('%.0f%%' % (100 * b)
                      for b in e.get('timed_model_bubbles', [])) or '-',
            '%.0f / %.0f' % (1e3 * e['encoder_seconds'],
                             1e3 * e['loop_seconds'])
            if 'loop_seconds' in e else '-',
            'yes' if e['same_tokens'] else 'NO'])
    peaks = {}
    for k in (1, 2):
      cluster = runner.Cluster('gpipe', k)
      peaks[k] = cluster.PeakRssBytes()
    result['worker_peak_rss_bytes'] = peaks
    pipelined = [(s, e) for s, e in zip(steps, result['configs'])
                 if e['K'] == 2 and e['M'] is not None and e['beam'] == 1
                 and not e['whole_layers']]
    if args.timeline and pipelined:
      s, e = max(pipelined, key=lambda x: x[1]['sentences_per_second'])
      timeline.RenderPNG(
          _FirstSteps(s.tasks, args.timeline_steps),
          'pipelined greedy decode, K=2, M=%d: the encoder (F) and the '
          'first %d steps (D)' % (
              e['M'], args.timeline_steps), args.timeline, by='device')
  finally:
    for step in steps:
      step.Close()
    runner.Close()
  text = header + '\n' + report.Table(
      ['search', 'K', 'M', 'batch', 'sentences/s', 'ms per token',
       'vs best K=1', 'measured bubble per device', 'lane formula',
       'lanes with traced task times', 'encoder / loop ms', 'tokens = unpipelined'], rows) + '\n\nWorker peak memory (VmHWM): ' + (
           '; '.join('K=%d: %s' % (k, ', '.join(
               '%.0f MiB' % (b / 2**20) if b else '?' for b in peaks[k]))
                     for k in sorted(peaks)))
  xla_rows = _XlaRows(result['configs'])
  if xla_rows:
    text += ('\n\nXLA-compiled stages (compile=\'xla\') beside uncompiled '
             '(first decode: when XLA compiles):\n\n') + report.Table(
                 ['search', 'K', 'M', 'sentences/s', 'XLA sentences/s',
                  'XLA speed-up', 'first decode s', 'XLA first decode s',
                  'graph build s', 'XLA graph build s', 'graph ops',
                  'XLA graph ops', 'graph KiB', 'XLA graph KiB'], xla_rows)
  print(text)
  result['markdown'] = text
  report.Write(args, result, lambda plt: _Plot(plt, result, beams))
  return result


def _XlaRows(configs):
  """Rows of each XLA-compiled configuration beside its uncompiled twin."""
  key = lambda e: (e['beam'], e['K'], e['M'], e['batch'], e['whole_layers'])
  plain = {key(e): e for e in configs if not e['compile']}
  rows = []
  for e in configs:
    p = plain.get(key(e))
    if not e['compile'] or p is None:
      continue
    rows.append([
        'greedy' if e['beam'] == 1 else 'beam %d' % e['beam'], e['K'],
        e['M'], p['sentences_per_second'], e['sentences_per_second'],
        '%.2fx' % (e['sentences_per_second'] / p['sentences_per_second']),
        p['first_seconds'], e['first_seconds'], p['build_seconds'],
        e['build_seconds'], p['graph_ops'], e['graph_ops'],
        p['graph_bytes'] / 1024.0, e['graph_bytes'] / 1024.0])
  return rows


def _Plot(plt, result, beams):
  """Sentences/s over M, one panel per beam size, K=1 unpipelined dotted."""
  fig, axes = plt.subplots(1, len(beams), figsize=(5 * len(beams), 3.4),
                           squeeze=False)
  for ax, beam in zip(axes[0], beams):
    configs = [e for e in result['configs'] if e['beam'] == beam and
               not e.get('compile')]
    for e in configs:
      if e['M'] is None:
        ax.axhline(e['sentences_per_second'], color='k', linestyle=':',
                   label='K=1 unpipelined')
    for k, style in ((1, 'o-'), (2, 's-')):
      curve = sorted((e['M'], e['sentences_per_second']) for e in configs
                     if e['K'] == k and e['M'] is not None and
                     not e.get('whole_layers'))
      if curve:
        ax.plot(*zip(*curve), style, label='K=%d in lanes' % k)
    whole = [(e['M'], e['sentences_per_second']) for e in configs
             if e.get('whole_layers')]
    if whole:
      ax.plot(*zip(*whole), 'kx', label='K=2, decoder cut at whole layers')
    ax.set_xscale('log', base=2)
    ax.set(xlabel='lanes M', ylabel='sentences / s',
           title='greedy' if beam == 1 else 'beam %d' % beam)
    ax.legend(fontsize=8)
  return fig
