"""Pipelined autoregressive decoding: M lanes of a batch through K stages.

A decoder cut into the stages of its training pipeline decodes one token per
step, and step t+1 needs the token step t chose at the last stage. The batch
is split into M lanes that follow each other through the stages (the
schedule is ``gpipe.schedules.decode_lanes``, drawn there): while stage k
runs lane m's step t, stage k+1 runs lane m-1's step t, and lane m's token
goes back to the first stage for its step t+1.

The model describes each stage as a ``LaneStage``: its device, the theta it
reads, and ``step(theta, t, carry, state, constants) -> (carry, state)``:

* ``carry`` flows along the stages within a step: the first stage receives
  the lane's *feedback* (what the last stage returned at step t-1, e.g. the
  chosen tokens), each later stage what the one before returned;
* ``state`` stays with the stage and lane from step to step, on the stage's
  device (e.g. the key/value caches of its layers): a loop variable placed
  there, never sent anywhere;
* ``constants`` are the stage's per-lane inputs that do not change (e.g. the
  source keys and values of its cross-attention), also on its device.

``Decode`` builds one ``tf.while_loop`` over the steps, with the K x M
(stage, lane) steps unrolled in its body. Each is one call op of the stage's
step function (traced once per stage, ``_StepFunction``), named
``stage<k>_D<m>`` (``pipeline_tasks``: phase D, lane m) so that traces give
the measured timeline. Each device's calls are chained by control
dependencies in the schedule's order (``task_ops.ScheduledOps``), and
from one step to the next by the device's own step counter, a loop variable
every call reads: TensorFlow's dataflow loop runs several steps at once
(``parallel_iterations``), so lane 0's step t+1 starts as soon as its token
is back, while later lanes still finish step t.

Early stopping per lane: with ``lane_done(feedback)``, a lane that is done
(e.g. every sequence in it ended) costs nothing more: each stage's call sits
in a ``tf.cond`` on the lane's flag that passes its state through instead,
and the other lanes go on.

``ForwardInLanes`` runs stages forward-only over the same lanes
(``gpipe.schedules.inference``), e.g. a decoder's encoder before the loop.

A model decodes from its pipeline's stages (``PipeliningLayer.Stages()``,
``gpipe.stage_layers.StageLayers``) with the pieces every autoregressive
model needs, so that it writes only its step:

* ``LoopStages``: the stages of the loop (those with step work; consecutive
  ones on one device joined into one call per lane and step);
* ``NumLanes``: M for a batch, by default one lane per loop stage, checked
  (``LaneCounts``: the numbers of lanes a batch allows);
* ``Encode``: layers that run once per batch before the loop (an encoder)
  forward-only over their stages, each lane's share of their outputs;
* ``Decode``: the loop, given each loop stage's ``LaneStage``.

docs/INFERENCE.md shows a model doing so.
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import micro_batch
from gpipe import randomness
from gpipe import replicas
from gpipe import stage as stage_lib
from gpipe import task_ops
from gpipe import xla
from gpipe.schedules import decode_lanes
from gpipe.schedules import inference
from gpipe.schedules import pipeline_tasks
from lingvo import compat as tf

DECODE = pipeline_tasks.DECODE


class LaneStage(
    collections.namedtuple('LaneStage', ['stage', 'device', 'theta', 'step'])):
  """One stage of a pipelined decoder.

  Attributes:
    stage: its index k in the pipeline (names its tasks ``stage<k>_D<m>``).
    device: where it runs and keeps its state.
    theta: a nest of tensors and variables its step reads (the same for
      every lane; read once on `device` before the loop).
    step: function(theta, t, carry, state, constants) -> (carry, state): one
      decoding step of one lane, t a scalar int32 tensor; the returned state
      has the structure, shapes and dtypes of the given one.
  """

  __slots__ = ()


def _Specs(tensors):
  return [tf.TensorSpec(t.shape, t.dtype) for t in tensors]


class _StepFunction:
  """A stage's step traced into a graph function, once per lane signature.

  The function takes (theta, t, carry, state, constants), flattened, and
  returns the flat (carry, state). It holds no control flow: early stopping
  is a ``tf.cond`` around its call in the loop body (a ``tf.cond`` inside the
  function made the worker run the stage's matmuls several times slower).
  """

  def __init__(self, lane_stage, compile=None):  # pylint: disable=redefined-builtin
    self.lane_stage = lane_stage
    self.compile = compile
    self._traced = {}

  def _Trace(self, theta, carry, state, constants):
    """The concrete function and carry structure for these inputs."""
    flat = [tf.nest.flatten(x) for x in (theta, carry, state, constants)]
    key = tuple(tuple((tuple(t.shape.as_list()), t.dtype.name) for t in f)
                for f in flat)
    if key in self._traced:
      return self._traced[key]
    structs = (theta, carry, state, constants)
    stage = self.lane_stage
    out = {}

    def Fn(theta_flat, t, carry_flat, state_flat, const_flat):
      theta_x, carry_x, state_x, const_x = [
          tf.nest.pack_sequence_as(s, list(f)) for s, f in zip(
              structs, (theta_flat, carry_flat, state_flat, const_flat))]
      with tf.device(stage.device):
        new_carry, new_state = stage.step(theta_x, t, carry_x, state_x,
                                          const_x)
      tf.nest.assert_same_structure(new_state, state_x)
      out['carry'] = new_carry
      return tf.nest.flatten(new_carry) + tf.nest.flatten(new_state)

    specs = [_Specs(f) for f in flat]
    specs = [specs[0], tf.TensorSpec([], tf.int32)] + specs[1:]
    name = 'stage%d_%s' % (stage.stage, DECODE)
    jit = xla.Compiles(self.compile)
    fn = xla.Trace(Fn, specs, jit, name, stage_lib.NO_INLINE)
    what = 'stage %d decoding step' % stage.stage
    if jit and not xla.Resolve(
        self.compile, what,
        {'step function': xla.Problems(fn, stage.device)}, stage.device):
      fn = xla.Trace(Fn, specs, False, name, stage_lib.NO_INLINE)
    self._traced[key] = (fn, out['carry'])
    return self._traced[key]

  def Call(self, lane, t, done, carry, state, constants):
    """One step of lane `lane` at this stage.

    Args:
      lane: m (names the call op).
      t: the step, a scalar int32 tensor on the stage's device.
      done: a scalar bool tensor (whether the lane is done): if true, the
        call is skipped, the carry is zeros and the state stays; or None
        without early stopping.
      carry: the carry into this stage.
      state: the lane's state at this stage.
      constants: the lane's constants at this stage.

    Returns:
      (carry, state, ops): the ops the task's order chains: the call, or
      with early stopping the cond's predicate (its start) and an output
      (its end).
    """
    stage = self.lane_stage
    fn, carry_struct = self._Trace(stage.theta, carry, state, constants)
    num_carry = len(tf.nest.flatten(carry_struct))

    scope = pipeline_tasks.OpScope(stage.stage, DECODE, lane)

    def Run():
      # Named by its task also inside the tf.cond (the trace finds it so).
      with tf.name_scope(scope):
        results = fn(tf.nest.flatten(stage.theta), t, tf.nest.flatten(carry),
                     tf.nest.flatten(state), tf.nest.flatten(constants))
      return list(results) if isinstance(results, (list, tuple)) else [
          results]

    def Skip():
      zeros = []
      for x in tf.nest.flatten(carry_struct):
        if not x.shape.is_fully_defined():
          raise ValueError(
              'stage %d: with early stopping a step\'s carry needs static '
              'shapes (a done lane hands over zeros); %s has shape %s' %
              (stage.stage, x.name, x.shape))
        zeros.append(tf.zeros(x.shape, x.dtype))
      return zeros + [tf.identity(x) for x in tf.nest.flatten(state)]

    with tf.device(stage.device):
      if done is None:
        results = Run()
        ops = [results[0].op]
      else:
        with tf.name_scope(scope):
          run = tf.logical_not(done)
          results = tf.cond(run, Run, Skip)
        # TensorFlow lowers the cond to switches on `run` and merges of its
        # outputs: the task starts with `run` and ends with its outputs, so
        # those are what the device's order chains (a control edge on the
        # If op itself does not survive the lowering).
        ops = [run.op, results[0].op]
    new_carry = tf.nest.pack_sequence_as(carry_struct, results[:num_carry])
    new_state = tf.nest.pack_sequence_as(state, results[num_carry:])
    return new_carry, new_state, ops


def _CheckLanes(stages, feedback, states, constants):
  """Refuses inputs that do not give every stage every lane."""
  if not stages:
    raise ValueError('pipelined decoding needs at least one stage; got none')
  num_lanes = len(feedback)
  if num_lanes < 1:
    raise ValueError('pipelined decoding needs at least one lane; got none')
  for name, per_stage in (('states', states), ('constants', constants)):
    if len(per_stage) != len(stages):
      raise ValueError('%s: one list per stage: %d stages, %d lists' %
                       (name, len(stages), len(per_stage)))
    for i, lanes in enumerate(per_stage):
      if len(lanes) != num_lanes:
        raise ValueError('%s of stage %d: one entry per lane: %d lanes, %d '
                         'entries' % (name, stages[i].stage, num_lanes,
                                      len(lanes)))


def Decode(stages, feedback, states, constants, num_steps, lane_done=None,
           parallel_iterations=10, compile=None):  # pylint: disable=redefined-builtin
  """Runs `num_steps` decoding steps of every lane through `stages`.

  Args:
    stages: the LaneStages in pipeline order.
    feedback: per lane, the first stage's carry at step 0 (a nest of
      tensors, e.g. the start tokens).
    states: per stage, per lane, its state at step 0 (on the stage's
      device).
    constants: per stage, per lane, its constant inputs (on its device).
    num_steps: T, a Python int.
    lane_done: optional function(feedback) -> scalar bool tensor: the lane
      needs no more steps. Evaluated on the last stage's device after each
      step; a done lane's calls skip their work and keep its feedback and
      states.
    parallel_iterations: steps the loop may run at once (2 lets lane 0's
      next step overlap the current one of the other lanes).
    compile: None, or 'xla' / 'xla_where_possible': each stage's step
      function is XLA-compiled (the pipelining layer's ``compile``;
      gpipe.xla). An op XLA cannot compile is an error with 'xla'; with
      'xla_where_possible' that stage's step runs uncompiled.

  Returns:
    (feedback, states): per lane the last stage's carry after the last step
    (or after the lane was done), and per stage, per lane, the states.

  Raises:
    ValueError: no stage, no lane, or states/constants not given for every
      stage and lane.
  """
  _CheckLanes(stages, feedback, states, constants)
  # Each stage's theta read once on its device, not once per call.
  stages = [s._replace(theta=stage_lib.ReadTheta(s.theta, s.device))
            for s in stages]
  num_stages, num_lanes = len(stages), len(feedback)
  early_stop = lane_done is not None
  fns = [_StepFunction(s, compile) for s in stages]
  devices, step_orders = decode_lanes.StepOrders(
      [replicas.Canonical(s.device) for s in stages], num_lanes)
  device_of = [devices.index(replicas.Canonical(s.device)) for s in stages]
  orders = [[pipeline_tasks.Task(stages[i].stage, m, DECODE)
             for i, m in order] for order in step_orders]
  last = stages[-1]
  # Per device, its step counter: every call on the device reads it and the
  # next step's counter waits for the device's last call, which chains the
  # device's calls from one step to the next.
  counters = []
  for i in range(len(devices)):
    with tf.device(stages[device_of.index(i)].device):
      counters.append(tf.constant(0, tf.int32))
  with tf.device(last.device):
    dones = [tf.constant(False) for _ in range(num_lanes)]
    if early_stop:
      dones = [lane_done(f) for f in feedback]

  def Body(i, counters, feedback, dones, states):
    scheduled_ops = task_ops.ScheduledOps(orders)
    carries = {}
    ops = {}
    new_states = [list(lanes) for lanes in states]
    # Built in the order of the ticks of one stage per device, so each
    # call's inputs exist when it is made.
    tasks = sorted(((s, m) for s in range(num_stages)
                    for m in range(num_lanes)), key=lambda x: (sum(x), x[0]))
    for s, m in tasks:
      carry = feedback[m] if s == 0 else carries[(s - 1, m)]
      carries[(s, m)], new_states[s][m], call_ops = fns[s].Call(
          m, counters[device_of[s]], dones[m] if early_stop else None, carry,
          states[s][m], constants[s][m])
      scheduled_ops.Register(pipeline_tasks.Task(stages[s].stage, m, DECODE),
                             call_ops)
      ops[(s, m)] = call_ops[-1]
    new_counters = []
    for d, order in enumerate(step_orders):
      with tf.device(stages[order[-1][0]].device):
        with tf.control_dependencies([ops[order[-1]]]):
          new_counters.append(counters[d] + 1)
    new_feedback, new_dones = [], []
    with tf.device(last.device):
      for m in range(num_lanes):
        out = carries[(num_stages - 1, m)]
        if early_stop:
          # A done lane's last stage handed over zeros: keep its feedback.
          out = tf.nest.map_structure(
              lambda old, new, done=dones[m]: tf.compat.v2.where(done, old,
                                                                 new),
              feedback[m], out)
          new_dones.append(tf.logical_or(dones[m], lane_done(out)))
        else:
          new_dones.append(dones[m])
        new_feedback.append(out)
    return i + 1, new_counters, new_feedback, new_dones, new_states

  with tf.device(stages[0].device):
    start = tf.constant(0, tf.int32)
  _, _, feedback, _, states = tf.while_loop(
      lambda i, *_: i < num_steps, Body,
      (start, counters, list(feedback), dones, [list(s) for s in states]),
      parallel_iterations=parallel_iterations)
  return feedback, states


def ForwardInLanes(stage_fns, thetas, lane_inputs, seed=0):
  """Runs stages forward-only over lanes, in the forward-only schedule.

  Each device runs its stages' F tasks lane after lane
  (``gpipe.schedules.inference.ForwardOrders``), chained by control
  dependencies; lane m goes from stage to stage as its outputs are handed
  over. For inference: no gradients, no re-materialization.

  Args:
    stage_fns: the ``gpipe.stage.StageFunctions`` of consecutive stages,
      first stage first, built with remat=False (their `index` is k).
    thetas: per stage, its NestedMap {key: layer theta}.
    lane_inputs: per lane, the first stage's inputs (a tuple).
    seed: mixed into the lanes' seeds (``randomness.MicroBatchSeed``).

  Returns:
    Per lane, the last stage's outputs (a tuple), on its device.
  """
  num_lanes = len(lane_inputs)
  first = stage_fns[0].index
  _, orders = inference.ForwardOrders(
      [replicas.Canonical(f.device) for f in stage_fns], num_lanes)
  # The orders count stages from 0; the tasks keep their pipeline indices.
  orders = [[t._replace(stage=t.stage + first) for t in order]
            for order in orders]
  scheduled_ops = task_ops.ScheduledOps(orders)
  current = list(lane_inputs)
  for fns, theta in zip(stage_fns, thetas):
    step = stage_lib.StepOnDevice(fns.device)
    theta = stage_lib.ReadTheta(theta, fns.device)
    accumulated = fns.InitialAccumulatorValues()
    outputs = []
    for m in range(num_lanes):
      with tf.device(fns.device):
        lane_seed = randomness.MicroBatchSeed(step, m, seed)
      result = fns.Call(stage_lib.MicroBatchCall(
          theta=theta, args=current[m], seed=lane_seed, step=step,
          micro_batch=m, targets=None, check_d_outputs=None,
          accumulator_values=accumulated), scheduled_ops)
      accumulated = result.accumulator_values
      outputs.append(tuple(result.outputs))
    current = outputs
  return current


def LoopStages(stages, has_step=None, join=None):
  """The stages of a decoding loop, first stage first.

  Stages without work in a step (e.g. those holding only encoder layers)
  sit out; consecutive ones on the same device become one, so that each
  lane's step makes one call per device there, not one per stage.

  Args:
    stages: the pipeline's stages in order: ``StageLayers``
      (``PipeliningLayer.Stages()``) or a model's own view of them, any
      objects with a ``device``.
    has_step: function(stage) -> whether the stage has work in each step
      (None: every stage has).
    join: function(stage, next stage) -> the two as one stage on the first
      one's device (None: ``stage.Joined(next stage)``, as StageLayers
      has).

  Returns:
    The loop's stages, first stage first.
  """
  merged = []
  for s in stages:
    if has_step is not None and not has_step(s):
      continue
    if merged and (replicas.Canonical(merged[-1].device) ==
                   replicas.Canonical(s.device)):
      merged[-1] = (join(merged[-1], s) if join is not None else
                    merged[-1].Joined(s))
    else:
      merged.append(s)
  return merged


def LaneCounts(batch):
  """The numbers of lanes a batch of `batch` examples allows: its divisors.

  A lane holds whole examples (with all their beams): M must divide the
  batch.

  Args:
    batch: examples decoded together.

  Returns:
    The divisors of `batch`, ascending.
  """
  return [d for d in range(1, batch + 1) if batch % d == 0]


def NumLanes(num_loop_stages, batch, num_lanes=None, beam_size=1,
             what='lanes'):
  """M for a batch of `batch` examples, checked.

  Args:
    num_loop_stages: the stages of the decoding loop (``LoopStages``: one
      per device in a row).
    batch: examples in the batch (an int).
    num_lanes: the lanes asked for, or None for the default: the largest
      number of lanes dividing the batch up to
      ``decode_lanes.DefaultNumLanes`` (one lane per loop stage).
    beam_size: beams per example (errors name them).
    what: the setting the errors name, e.g. 'mt: decode_micro_batches'.

  Returns:
    M.

  Raises:
    ValueError: M < 1, M larger than the batch, or M not dividing it.
  """
  if num_lanes is None:
    default = decode_lanes.DefaultNumLanes(num_loop_stages, batch)
    return max(d for d in LaneCounts(batch) if d <= default)
  if num_lanes < 1:
    raise ValueError('%s=%d: give a number of lanes >= 1' % (what, num_lanes))
  if num_lanes > batch:
    raise ValueError(
        '%s=%d lanes but the batch has only %d examples: use at most %d '
        'lanes' % (what, num_lanes, batch, batch))
  if batch % num_lanes:
    raise ValueError(
        '%s=%d does not divide the batch of %d examples%s: a lane holds '
        'whole examples%s; use one of %s' % (
            what, num_lanes, batch,
            ' x %d beams' % beam_size if beam_size > 1 else '',
            ' with all their beams' if beam_size > 1 else '',
            ', '.join(str(d) for d in LaneCounts(batch))))
  return num_lanes


def Encode(stages, theta, inputs, num_lanes, args_fn=None, outputs_fn=None,
           compile=None):  # pylint: disable=redefined-builtin
  """Runs layers once over a batch, forward-only, before the decoding loop.

  The layers (e.g. an encoder's) run over their stages' devices as a
  forward-only pipeline (``ForwardInLanes``) in
  ``decode_lanes.EncoderMicroBatches`` micro-batches: at least as many as
  lanes, so that it idles little; each lane's outputs are its consecutive
  micro-batches' outputs.

  Args:
    stages: the ``StageLayers`` holding those layers, consecutive stages
      first stage first (e.g. ``[s.Only(IsEncoder) for s in
      net.Stages()]``; stages left without layers are dropped).
    theta: the pipelining layer's theta.
    inputs: a nest of tensors, the batch along dimension 0 (static).
    num_lanes: M, dividing the batch.
    args_fn: function(micro-batch of `inputs`) -> the first layer's FProp
      arguments (a tuple); None: (micro-batch,).
    outputs_fn: function(the last layer's outputs, a tuple) -> the nest of
      tensors each lane keeps; None: the outputs.
    compile: the pipelining layer's ``compile`` (None, 'xla',
      'xla_where_possible': gpipe.xla).

  Returns:
    Per lane, its rows of outputs_fn(outputs), on the last stage's device.

  Raises:
    ValueError: no stage holds a layer, or M does not divide the batch.
  """
  stages = [s for s in stages if s.layers]
  if not stages:
    raise ValueError('Encode: none of the stages holds a layer to run')
  fns = [stage_lib.StageFunctions(s.index, s.layers, s.keys, s.device,
                                  remat=False, compile=compile)
         for s in stages]
  devices = {replicas.Canonical(s.device) for s in stages}
  batch = micro_batch.StaticBatchSize(inputs, 0)
  num_parts = decode_lanes.EncoderMicroBatches(len(devices), batch, num_lanes)
  with tf.device(stages[0].device):
    parts = micro_batch.Split(inputs, num_parts, 0)
  outputs = ForwardInLanes(
      fns, [s.Theta(theta) for s in stages],
      [tuple(args_fn(part)) if args_fn else (part,) for part in parts])
  if outputs_fn is not None:
    outputs = [outputs_fn(out) for out in outputs]
  per_lane = max(num_parts // num_lanes, 1)
  with tf.device(stages[-1].device):
    if num_parts < num_lanes:
      return micro_batch.Split(outputs[0], num_lanes, 0)
    return [micro_batch.Merge(outputs[m * per_lane:(m + 1) * per_lane], 0)
            for m in range(num_lanes)]
