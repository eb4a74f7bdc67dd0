"""Shared by the schedule tests: the toy pipeline, its reference, its ops."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.schedules import pipeline_tasks
from gpipe import schedules
import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from tests import graph_rewrites
from tests import pipeline_testlib
from tests import toy_layers

CONFIG = graph_rewrites.CpuConfig(4)
CachedReference = pipeline_testlib.CachedReference
NUM_LAYERS = 6
# Layers per stage: uneven wherever the stage count allows it.
UNEVEN_SIZES = {1: [6], 2: [2, 4], 4: [1, 2, 2, 1]}


def Placement(name, k):
  """Stage devices (indices) for schedule `name` with K stages, or None."""
  if name == 'interleaved_1f1b':
    d = max(1, k // 2)  # v = 2 stages per device where K allows.
    return schedules.orders.RoundRobinPlacement(k, d)
  if name == 'zb_v':
    return schedules.orders.VPlacement(k) if k % 2 == 0 else None
  return list(range(k))


def Allowed(name, k, m):
  """Whether `name` runs K stages and M micro-batches."""
  devices = Placement(name, k)
  if devices is None:
    return False
  try:
    schedules.Orders(name, devices, m)
  except ValueError:
    return False
  return True


def Layers(use_bn=False, keep_prob=0.8):
  return pipeline_testlib.DenseLayers(NUM_LAYERS, use_bn=use_bn,
                                      keep_prob=keep_prob)


def Pipeline(name, layers, k, m, **kwargs):
  """Schedule `name`'s K-stage pipeline of `layers`, its loss inside.

  Stage s runs on CPU Placement(name, k)[s]; kwargs set other params.
  """
  settings = dict(
      schedule=name,
      stage_devices=['/device:CPU:%d' % d for d in Placement(name, k)],
      loss_tpl=toy_layers.SquaredErrorLoss.Params().Set(dtype=tf.float64))
  settings.update(kwargs)
  return pipeline_testlib.Pipeline(layers, k, m, **settings)


def Net(name, k, m, remat, layers=None, **kwargs):
  kwargs.setdefault('stage_sizes', UNEVEN_SIZES[k])
  return Pipeline(name, layers or Layers(), k, m, remat=remat, **kwargs)


def LossAndGrads(net, inputs, targets, pipelined):
  fprop = net.FProp if pipelined else net.FPropUnpipelined
  out = fprop(net.theta, *inputs, targets=targets)
  loss = tf.reduce_mean(out.per_example)
  xs = Trainable(net) + [
      x for x in tf.nest.flatten(inputs) if x.dtype.is_floating]
  grads = tf.gradients(loss, xs, colocate_gradients_with_ops=True)
  return loss, grads


def Trainable(net):
  return [v for v in net.vars.Flatten() if v.trainable]


def CallOps(graph):
  """{Task: call op} of every stage task in `graph`."""
  found = {}
  for op in graph.get_operations():
    task = pipeline_tasks.ParseOpName(op.name)
    if task is not None:
      found[task] = op
  return found


def AssertMatches(test, net, inputs, targets, sess, reference_key=None):
  """Loss and every gradient of `net` equal the unpipelined ones.

  Args:
    test: the TestCase.
    net: the pipeline.
    inputs: its inputs (a tuple).
    targets: the loss layer's targets.
    sess: the session of the graph.
    reference_key: optional: the unpipelined values are computed once per
      key and test class (see pipeline_testlib.CachedReference); the key
      must name everything they depend on (layers, inputs, targets,
      micro-batches).
  """
  loss, grads = LossAndGrads(net, inputs, targets, pipelined=True)
  cache, refs = CachedReference(test, reference_key)
  if refs is None:
    ref_loss, ref_grads = LossAndGrads(net, inputs, targets, pipelined=False)
    sess.run(tf.global_variables_initializer())
    values, refs = sess.run([[loss] + grads, [ref_loss] + ref_grads])
    if reference_key is not None:
      cache[reference_key] = refs
  else:
    sess.run(tf.global_variables_initializer())
    values = sess.run([loss] + grads)
  num_float_inputs = len(
      [x for x in tf.nest.flatten(inputs) if x.dtype.is_floating])
  test.assertLen(values, 1 + len(Trainable(net)) + num_float_inputs)
  test.assertLen(refs, len(values))
  for v, r in zip(values, refs):
    test.assertAllClose(r, v, rtol=1e-10, atol=1e-12)


def AssertEmbeddingGradientMatches(test, sess, name, **kwargs):
  """An embedding stage's sparse gradient equals the unpipelined one.

  Args:
    test: the TestCase.
    sess: its session (4 CPU devices).
    name: the schedule (K=2, M=4).
    **kwargs: more PipeliningLayer params.
  """
  layers = [toy_layers.Embedding.Params().Set(
      name='emb', dtype=tf.float64,
      params_init=py_utils.WeightInit.Gaussian(0.5, seed=1))]
  layers += Layers()[:3]
  kwargs.setdefault('stage_sizes', [1, 3])
  net = Pipeline(name, layers, 2, 4, **kwargs)
  rng = np.random.RandomState(4)
  ids = tf.constant(rng.randint(0, 10, size=[8]), tf.int32)
  targets = tf.constant(rng.randn(8, 8))
  results = []
  for fprop in (net.FProp, net.FPropUnpipelined):
    loss = tf.reduce_mean(fprop(net.theta, ids, targets=targets).per_example)
    grads = tf.gradients(loss, Trainable(net))
    results.append([loss] + [tf.convert_to_tensor(g) for g in grads])
  sess.run(tf.global_variables_initializer())
  values, refs = sess.run(results)
  for v, r in zip(values, refs):
    test.assertAllClose(r, v, rtol=1e-10, atol=1e-12)


def AssertCallsFollowOrders(test, calls, orders):
  """The graph's task calls are the orders' tasks, chained in their order.

  Args:
    test: the TestCase.
    calls: {Task: call op} (CallOps).
    orders: per device, its Tasks in run order.
  """
  test.assertCountEqual(calls, [t for order in orders for t in order])
  for order in orders:
    for prev, nxt in zip(order, order[1:]):
      test.assertIn(calls[prev], calls[nxt].control_inputs,
                    '%s before %s' % (pipeline_tasks.Label(prev),
                                      pipeline_tasks.Label(nxt)))
