"""The timing-aware zero-bubble schedule: task orders from measured times.

ZB-H1 and ZB-V (``orders``) place the weight-gradient tasks W into the gaps
that unit task costs leave. Real stages differ: a backward B that recomputes
the forward costs about twice a forward, the last stage also runs the loss,
a cut is never perfectly even, and each hand-over between devices takes
time. The gaps then have other sizes, and a W placed for unit costs delays
the B that the previous stage waits for, or leaves a device idle.

``TimedZeroBubbleOrders`` builds the orders from the measured time of each
stage's F, B and W (``StageCosts``, written by the planner ``gpipe.plan``)
under a memory limit per stage, in the spirit of the automatic scheduling of
the zero-bubble paper (Qi et al., arXiv 2401.10241, section 3), in its own
form here:

1. List scheduling, one stage per device, on the measured times: whenever a
   device is free it starts, in this order of preference, a forward while
   it is still in its warm-up (the forwards a stage runs before its first
   backward, at most its memory limit), the oldest ready B (the critical
   path), a forward if the stage holds fewer micro-batches than its limit,
   else the oldest pending W. Hand-overs delay a task's inputs by their
   measured time.
2. Two policies for a W when nothing else is ready: fill the gap whatever
   its size, or run W only if it ends before the next B or F arrives (else
   wait for it, so the critical path is not delayed by a long W).
3. Three warm-up depths per stage: 1F1B's K-s forwards, ZB-H2's 2(K-s)-1
   (when the memory limit allows) and half-way.

These six candidates and ZB-H1's own orders for the same costs (when the
memory limits allow ZB-H1's) are simulated with the same times and
hand-overs (``simulate.TaskTimes``); the shortest step wins (ties: the least
memory, then the earlier candidate). So with measured costs the step is
never longer than ZB-H1's, and with equal task costs it is ZB-H1's,
(K-1)/(3M+K-1) idle: with 1F1B's memory the first device holds K forwards
and then waits K-1 ticks for its first B, with no W to run yet.
"""

import math

from gpipe.schedules import orders as orders_lib
from gpipe.schedules import pipeline_tasks
from gpipe.schedules import simulate

Task = pipeline_tasks.Task
FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT

# Fractions of the way from 1F1B's warm-up (K-s forwards) to ZB-H2's
# (2(K-s)-1) that the candidates try.
WARMUP_DEPTHS = (0.0, 0.5, 1.0)


class StageCosts:
  """Measured task costs per stage, with hand-overs and memory limits.

  Callable as ``costs(task)`` -> the task's cost, so it goes wherever
  ``simulate.TaskCost`` takes costs (every schedule's orders, the
  simulator). Units are any (seconds, or relative to one task): only
  ratios matter for the orders.

  Attributes:
    forward: per stage, the cost of an F task.
    backward: per stage, of a B task (with re-materialization including
      its recomputed forward; without a split backward, also W's work).
    weight: per stage, of a W task (a batched W of c micro-batches: c
      times it).
    handover: per stage boundary k (between stages k and k+1), the time
      from the end of a task to its output being usable on the other
      stage's device; None: 0.
    max_in_flight: per stage, the most micro-batches it may hold between F
      and B (a memory limit), or None for the schedule's default.
    max_awaiting_weight: per stage, the most between F and W, or None.
  """

  def __init__(self, forward, backward, weight=None, handover=None,
               max_in_flight=None, max_awaiting_weight=None):
    """Constructor; the lists must have one entry per stage (K-1 handovers).

    Raises:
      ValueError: lists of different lengths, negative costs or limits
        below 1, naming them.
    """
    self.forward = [float(x) for x in forward]
    k = len(self.forward)
    self.backward = [float(x) for x in backward]
    self.weight = [float(x) for x in (weight if weight is not None else
                                      [0.0] * k)]
    self.handover = [float(x) for x in (handover or [0.0] * max(k - 1, 0))]
    self.max_in_flight = (None if max_in_flight is None else
                          [int(x) for x in max_in_flight])
    self.max_awaiting_weight = (None if max_awaiting_weight is None else
                                [int(x) for x in max_awaiting_weight])
    lengths = dict(B=len(self.backward), W=len(self.weight))
    if self.max_in_flight is not None:
      lengths['max_in_flight'] = len(self.max_in_flight)
    if self.max_awaiting_weight is not None:
      lengths['max_awaiting_weight'] = len(self.max_awaiting_weight)
    wrong = {name: n for name, n in lengths.items() if n != k}
    if wrong or len(self.handover) != max(k - 1, 0):
      raise ValueError(
          'task costs for %d stages need %d entries per phase and limit and '
          '%d hand-overs; got B/W/limits %s and %d hand-overs' %
          (k, k, max(k - 1, 0), wrong or lengths, len(self.handover)))
    if min(self.forward + self.backward + self.weight + self.handover +
           [0.0]) < 0:
      raise ValueError('task costs must be >= 0, got %s' % self.ToDict())
    for limits in (self.max_in_flight, self.max_awaiting_weight):
      if limits is not None and min(limits) < 1:
        raise ValueError('memory limits must allow >= 1 micro-batch per '
                         'stage, got %s' % limits)

  @property
  def num_stages(self):
    return len(self.forward)

  def __call__(self, task):
    s = task.stage
    if task.phase == FORWARD:
      return self.forward[s]
    if task.phase == BACKWARD:
      return self.backward[s]
    if pipeline_tasks.IsAll(task.micro_batch):
      return self.weight[s] * task.micro_batch.count
    return self.weight[s]

  def Delay(self, dependency, task):
    """The hand-over time between two tasks (0 within a stage)."""
    if dependency.stage == task.stage:
      return 0.0
    return self.handover[min(dependency.stage, task.stage)]

  def ToDict(self):
    """The costs as a dict of lists (``FromDict`` reads it back)."""
    out = dict(F=self.forward, B=self.backward, W=self.weight,
               handover=self.handover)
    if self.max_in_flight is not None:
      out['max_in_flight'] = self.max_in_flight
    if self.max_awaiting_weight is not None:
      out['max_awaiting_weight'] = self.max_awaiting_weight
    return out

  @classmethod
  def FromDict(cls, d):
    """StageCosts from ``ToDict``'s form (e.g. ``PipeliningLayer.task_costs``).

    Raises:
      ValueError: unknown keys, or what the constructor refuses.
    """
    known = ('F', 'B', 'W', 'handover', 'max_in_flight',
             'max_awaiting_weight')
    unknown = sorted(set(d) - set(known))
    if unknown or 'F' not in d or 'B' not in d:
      raise ValueError('task costs take the keys %s (F and B required); got '
                       '%s' % (', '.join(known), sorted(d)))
    return cls(d['F'], d['B'], d.get('W'), d.get('handover'),
               d.get('max_in_flight'), d.get('max_awaiting_weight'))


def PipelineCosts(remat, num_stages, task_costs=None):
  """The costs a pipeline orders its tasks by.

  Args:
    remat: the pipeline's remat mode ('always', 'except_last', 'never').
    num_stages: K.
    task_costs: None, or measured costs as a dict (``StageCosts.ToDict``,
      the ``task_costs`` param of ``gpipe.PipeliningLayer``).

  Returns:
    ``StageCosts`` from `task_costs`, else ``simulate.RematCosts``.

  Raises:
    ValueError: task costs for another number of stages, saying so.
  """
  if not task_costs:
    return simulate.RematCosts(remat, num_stages)
  costs = StageCosts.FromDict(dict(task_costs))
  if costs.num_stages != num_stages:
    raise ValueError('task_costs are for %d stages but the pipeline has %d: '
                     'plan again for this cut, or drop task_costs' %
                     (costs.num_stages, num_stages))
  return costs


def _Limits(costs, num_stages):
  """(max in flight, max awaiting W) per stage: `costs`' or ZB-H1's."""
  k = num_stages
  limits = getattr(costs, 'max_in_flight', None) or [k - s for s in range(k)]
  w_limits = getattr(costs, 'max_awaiting_weight', None) or [
      max(2 * k - s, limits[s]) for s in range(k)]
  if len(limits) != k or len(w_limits) != k:
    raise ValueError('memory limits for %d stages given to a %d-stage '
                     'schedule' % (len(limits), k))
  return limits, w_limits


class _ListScheduler:
  """One candidate's list scheduling (see the module docstring, 1-2)."""

  def __init__(self, k, m, costs, limits, w_limits, warmup, wait_for_gaps):
    self.k, self.m = k, m
    self.cost = lambda task: simulate.TaskCost(costs, task)
    delay = getattr(costs, 'Delay', None)
    self.delay = delay or (lambda dep, task: 0.0)
    self.limits, self.w_limits = limits, w_limits
    self.warmup = warmup
    self.wait_for_gaps = wait_for_gaps
    self.finish = {}
    self.next_f = [0] * k  # Forwards (and backwards) go in micro-batch order.
    self.next_b = [0] * k
    self.awaiting_w = [[] for _ in range(k)]
    # free[s]: when stage s next picks a task. While it runs one, the task's
    # end; while it waits (waiting[s]), the earliest known arrival of an
    # input, or inf if none is on its way.
    self.free = [0.0] * k
    self.waiting = [False] * k
    self.orders = [[] for _ in range(k)]

  def _Arrival(self, task, deps):
    """When `task`'s inputs are all there, or None if not known yet."""
    if any(dep not in self.finish for dep in deps):
      return None
    return max([0.0] + [self.finish[dep] + self.delay(dep, task)
                        for dep in deps])

  def _Next(self, s, phase):
    """(task, arrival) of stage s's next F or B, or (None, None)."""
    i = self.next_f[s] if phase == FORWARD else self.next_b[s]
    if i >= self.m or (phase == BACKWARD and i >= self.next_f[s]):
      return None, None
    task = Task(s, i, phase)
    deps = pipeline_tasks.Dependencies(task, self.k, self.m, True)
    return task, self._Arrival(task, deps)

  def _Held(self, s):
    """(micro-batches between F and B, between F and W) on stage s."""
    return (self.next_f[s] - self.next_b[s],
            self.next_f[s] - self.next_b[s] + len(self.awaiting_w[s]))

  def _Run(self, s, task, t):
    # A neighbour's task may bring a waiting stage an input earlier than the
    # one it waits for (a B while it waits for an F): it picks again now.
    for n in (s - 1, s + 1):
      if 0 <= n < self.k and self.waiting[n]:
        self.free[n] = min(self.free[n], t)
    self.waiting[s] = False
    self.orders[s].append(task)
    self.finish[task] = self.free[s] = t + self.cost(task)
    if task.phase == FORWARD:
      self.next_f[s] += 1
    elif task.phase == BACKWARD:
      self.next_b[s] += 1
      self.awaiting_w[s].append(task.micro_batch)
    else:
      self.awaiting_w[s].remove(task.micro_batch)

  def _Pick(self, s, t):
    """The task stage s starts at time t, or the time to wait until."""
    held, held_w = self._Held(s)
    forward, f_at = self._Next(s, FORWARD)
    if held >= self.limits[s] or held_w >= self.w_limits[s]:
      forward, f_at = None, None
    backward, b_at = self._Next(s, BACKWARD)
    f_ready = forward is not None and f_at is not None and f_at <= t
    b_ready = backward is not None and b_at is not None and b_at <= t
    in_warmup = self.next_b[s] == 0 and held < self.warmup[s]
    if f_ready and (in_warmup or not b_ready):
      return forward
    if b_ready:
      return backward
    arrivals = [x for x in (f_at, b_at) if x is not None]
    if self.awaiting_w[s]:
      weight = Task(s, self.awaiting_w[s][0], WEIGHT)
      if (not self.wait_for_gaps or not arrivals or
          t + self.cost(weight) <= min(arrivals)):
        return weight
    if arrivals:
      return min(arrivals)
    return None  # Nothing known yet: wait for the other stages.

  def Orders(self):
    """Per stage (= device), its Tasks in run order.

    Raises:
      ValueError: the memory limits leave every stage waiting.
    """
    while True:
      busy = [s for s in range(self.k) if len(self.orders[s]) < 3 * self.m]
      if not busy:
        return self.orders
      t = min(self.free[s] for s in busy)
      waits = {}
      for s in busy:
        if self.free[s] != t:
          continue
        picked = self._Pick(s, t)
        if isinstance(picked, Task):
          self._Run(s, picked, t)
          break
        waits[s] = picked
      else:
        # Every stage free at t waits: until its next input arrives, or, if
        # no input is on its way yet, until a neighbour (the only stages it
        # takes inputs from) starts a task (``_Run`` wakes it).
        for s, until in waits.items():
          self.free[s] = math.inf if until is None else until
          self.waiting[s] = True
        if min(self.free[s] for s in busy) == math.inf:
          raise ValueError(
              'the memory limits %s / %s leave no stage anything to run at '
              'time %g' % (self.limits, self.w_limits, t))


def TimedZeroBubbleOrders(num_stages, num_micro_batches, costs=None):
  """Zero bubble from measured times: the best of seven candidate orders.

  See the module docstring. K=3, M=6 on uneven stages: stage 0's B costs
  3, stages 1 and 2's W 2, stage 2's F 2, every other task 1
  (``RenderSchedule('zb_auto', 3, 6, StageCosts([1, 1, 2], [3, 1, 1], [1,
  2, 2]))``; a task of cost c fills c cells). Device 2 runs F4 before W3
  (ZB-H1 runs W3 first), so B4 reaches devices 1 and 0 a tick earlier: 33
  ticks instead of ZB-H1's 34::

    d0 | F0 F1 F2 .  .  .  B0 B0 B0 F3 B1 B1 B1 B2 B2 B2 B3 B3 B3 F4 F5 W0 W1 W2 W3 B4 B4 B4 B5 B5 B5 W4 W5
    d1 | .  F0 F1 .  .  B0 F2 W0 W0 B1 F3 B2 W1 W1 B3 W2 W2 W3 W3 .  F4 F5 .  .  B4 W4 W4 B5 W5 W5 .  .  .
    d2 | .  .  F0 F0 B0 F1 F1 B1 F2 F2 B2 F3 F3 B3 W0 W0 W1 W1 W2 W2 .  F4 F4 B4 F5 F5 B5 W3 W3 W4 W4 W5 W5

  Args:
    num_stages: K, one per device.
    num_micro_batches: M.
    costs: None (unit costs), a phase dict, a function of the task, or
      ``StageCosts`` (with hand-overs and memory limits: at most
      ``max_in_flight[s]`` micro-batches between F and B on stage s,
      default K-s as 1F1B and ZB-H1; ``max_awaiting_weight[s]`` between F
      and W, default 2K-s).

  Returns:
    Per stage (= device), its Tasks in run order.

  Raises:
    ValueError: memory limits that leave no task to run.
  """
  simulate.CheckSizes(num_stages, num_micro_batches)
  k, m = num_stages, num_micro_batches
  limits, w_limits = _Limits(costs, k)
  delay = getattr(costs, 'Delay', None)
  candidates = []
  if all(limits[s] >= k - s and w_limits[s] >= 2 * k - s for s in range(k)):
    candidates.append(orders_lib.ZeroBubbleH1Orders(k, m, costs))
  seen = set()
  for depth in WARMUP_DEPTHS:
    warmup = tuple(
        min(limits[s], k - s + int(round(depth * (k - 1 - s))))
        for s in range(k))
    for wait_for_gaps in (False, True):
      if (warmup, wait_for_gaps) in seen:
        continue
      seen.add((warmup, wait_for_gaps))
      candidates.append(_ListScheduler(k, m, costs, limits, w_limits, warmup,
                                       wait_for_gaps).Orders())
  best = None
  for i, orders in enumerate(candidates):
    times = simulate.TaskTimes(orders, k, m, True, costs, delay)
    span = max(end for lane in times for _, _, end in lane)
    key = (round(span, 9), sum(simulate.PeakInFlight(orders)), i)
    if best is None or key < best[0]:
      best = (key, orders)
  return best[1]
