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
"""

import collections

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
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
    theta: a nest of tensors its step reads (the same for every lane).
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
