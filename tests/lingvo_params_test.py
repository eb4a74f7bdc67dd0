"""Lingvo's PipeliningLayer params mean the same on our PipeliningLayer.

Each case runs the same cells on Lingvo's executor
(``lingvo.core.gpipe.PipeliningLayer``), on ``gpipe.PipeliningLayer`` with the
same params, and through ``gpipe.lingvo_adapter.FromLingvo``, with the same
variable values, and compares outputs, every gradient and the accumulators.
"""

from absl.testing import parameterized
import gpipe
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import lingvo_adapter
import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import gpipe as lingvo_gpipe_lib
from lingvo.core import py_utils
from lingvo.core import test_utils
from tests import graph_rewrites

graph_rewrites.Off()

K, DIM, BATCH = 2, 4, 4
CONFIG = graph_rewrites.CpuConfig(K)


class _SumAccumulator(base_layer.Accumulator):
  """Adds up what it is given (a float64 scalar)."""

  def DefaultValue(self):
    return tf.zeros([], tf.float64)

  def Update(self, value):
    self.SetValue(self.GetValue() + value)


class _Dense(base_layer.BaseLayer):
  """tanh(x w) (+ extra), passing `extra` (which may be None) through."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('seed', 1, 'Initializer seed.')
    p.Define('accumulate', False, 'Add sum(output) to an accumulator.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [DIM, DIM], py_utils.WeightInit.Gaussian(0.7, seed=p.seed),
        tf.float64))
    if p.accumulate:
      self.RegisterAccumulator('total', _SumAccumulator())

  def FProp(self, theta, x, extra=None):
    y = tf.tanh(tf.matmul(x, theta.w))
    if extra is not None:
      y += extra
    self.activation = y
    if self.params.accumulate:
      self.accumulators.total.Update(tf.reduce_sum(y))
    return y, extra

  @classmethod
  def FPropMeta(cls, p, x, extra=None):
    return py_utils.NestedMap(flops=1, out_shapes=(x, extra))


class _NestedDense(_Dense):
  """The same on a NestedMap(x=..., extra=...) (nested_map_fprop)."""

  def FProp(self, theta, inputs):
    y, _ = super().FProp(theta, inputs.x, inputs.extra)
    return py_utils.NestedMap(x=y, extra=inputs.extra)

  @classmethod
  def FPropMeta(cls, p, inputs):
    return py_utils.NestedMap(flops=1, out_shapes=(inputs,))


def _Cell(name, subs, **kwargs):
  return lingvo_gpipe_lib.FeatureExtractionLayer.Params().Set(
      name=name, sub=subs, **kwargs)


def _Cells(layer=_Dense, act_fetch=False, accumulate=False):
  def Sub(name, seed):
    return layer.Params().Set(name=name, seed=seed, accumulate=accumulate,
                              dtype=tf.float64)
  cell0 = _Cell('cell0', [Sub('a', 1), Sub('b', 2)])
  cell1 = _Cell('cell1', [Sub('c', 3), Sub('d', 4)])
  if act_fetch:
    cell0.Set(act_fetch_layers=['a'], num_act_outputs=1)
    cell1.Set(num_act_inputs=1, num_act_outputs=1)
  return [cell0, cell1]


CASES = {
    # name: (pipeline params, inputs(x, extra) -> FProp args)
    'before_tpl': (dict(cell_tpl=_Cells(), before_tpl=[
        _Dense.Params().Set(name='before', seed=9, dtype=tf.float64)]),
                   lambda x, e: (x,)),
    'none_inputs': (dict(cell_tpl=_Cells()), lambda x, e: (x, None)),
    'extra_inputs': (dict(cell_tpl=_Cells()), lambda x, e: (x, e)),
    'nested_map_fprop': (dict(cell_tpl=_Cells(_NestedDense),
                              nested_map_fprop=True),
                         lambda x, e: (py_utils.NestedMap(x=x, extra=None),)),
    'state_dtype_and_micro_batch_size': (dict(
        cell_tpl=_Cells(), state_dtype=tf.float64, micro_batch_size=2),
                                         lambda x, e: (x, e)),
    'accumulators': (dict(cell_tpl=_Cells(accumulate=True)),
                     lambda x, e: (x,)),
    'act_fetch_layers': (dict(cell_tpl=_Cells(act_fetch=True)),
                         lambda x, e: (x, e)),
}


def _Params(executor, case):
  settings, _ = CASES[case]
  if executor == 'ours':
    p = gpipe.PipeliningLayer.Params()
  else:
    p = lingvo_gpipe_lib.PipeliningLayer.Params()
  p.Set(name='pipe', num_micro_batches=2, dtype=tf.float64,
        state_dtype=tf.float64)
  p.Set(**{k: (v.Copy() if hasattr(v, 'Copy') else
               [x.Copy() for x in v] if isinstance(v, list) else v)
           for k, v in settings.items()})
  if executor == 'from_lingvo':
    p = lingvo_adapter.FromLingvo(p)
  return p


def _Run(executor, case, values=None):
  """Outputs, gradients and accumulator values by variable name suffix."""
  _, make_inputs = CASES[case]
  rng = np.random.RandomState(5)
  with tf.Graph().as_default(), tf.compat.v1.Session(config=CONFIG) as sess:
    with cluster_factory.ForTestingWorker(cpus=K, split_size=K):
      py_utils.GetOrCreateGlobalStepVar()
      net = _Params(executor, case).Instantiate()
      x = tf.constant(rng.randn(BATCH, DIM))
      extra = tf.constant(rng.randn(BATCH, DIM))
      out = net.FProp(net.theta, *make_inputs(x, extra))
    flat = [o for o in tf.nest.flatten(out) if o is not None]
    loss = tf.add_n([tf.reduce_sum(o * np.arange(1.0, 1.0 + o.shape[1]))
                     for o in flat])
    variables = net.vars.Flatten()
    grads = tf.gradients(loss, variables + [x])
    accs = net.GetAccumulatorValues().Flatten()
    # Lingvo's cells sit beside the pipeline's scope, ours inside it.
    names = [v.name.replace('pipe/', '') for v in variables]
    sess.run(tf.global_variables_initializer())
    if values is not None:
      for name, v in zip(names, variables):
        v.load(values[name], sess)
    own = dict(zip(names, sess.run(variables)))
    return own, sess.run([loss, flat, grads, accs]), out


class LingvoParamsTest(test_utils.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      [(case + '_' + ex, case, ex) for case in CASES
       for ex in ('ours', 'from_lingvo')])
  def testSameAsLingvosExecutor(self, case, executor):
    values, ref, _ = _Run('lingvo', case)
    own, got, out = _Run(executor, case, values)
    self.assertCountEqual(values, own)
    ref_loss, ref_flat, ref_grads, ref_accs = ref
    loss, flat, grads, accs = got
    self.assertAllClose(ref_loss, loss, rtol=1e-12)
    self.assertLen(flat, len(ref_flat))
    for r, o in zip(ref_flat + ref_grads, flat + grads):
      self.assertAllClose(r, o, rtol=1e-12, atol=1e-12)
    self.assertLen(accs, len(ref_accs))
    self.assertAllClose(ref_accs, accs, rtol=1e-12)
    if case == 'accumulators':
      self.assertLen(accs, 4)
      self.assertNotAllClose(accs, np.zeros(4))
    if case in ('none_inputs', 'nested_map_fprop'):
      absent = out[1] if case == 'none_inputs' else out.extra
      self.assertIsNone(absent)
    if case == 'act_fetch_layers':
      self.assertLen(out, 3)


class _Loss(base_layer.BaseLayer):
  """Per-example loss of a cell's (y, extra) output: sum((y - t)^2)."""

  def FProp(self, theta, y, extra, targets):
    del extra
    return tf.reduce_sum(tf.square(y - targets), axis=-1)


def _AccumulatorRun(schedule, remat, pipelined):
  with tf.Graph().as_default(), tf.compat.v1.Session(config=CONFIG) as sess:
    py_utils.GetOrCreateGlobalStepVar()
    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=_Cells(accumulate=True), num_micro_batches=4,
        schedule=schedule, remat=remat, loss_tpl=_Loss.Params(),
        stage_devices=graph_rewrites.CpuDevices(2), dtype=tf.float64)
    net = p.Instantiate()
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(8, DIM))
    targets = tf.constant(rng.randn(8, DIM))
    fprop = net.FProp if pipelined else net.FPropUnpipelined
    loss = tf.reduce_sum(fprop(net.theta, x, targets=targets))
    grads = tf.gradients(loss, net.vars.Flatten())
    accs = net.GetAccumulatorValues().Flatten()
    sess.run(tf.global_variables_initializer())
    return sess.run([loss, grads, accs])


class AccumulatorScheduleTest(test_utils.TestCase, parameterized.TestCase):
  """Accumulators add up every micro-batch once under every schedule."""

  @parameterized.parameters(('gpipe', 'never'), ('1f1b', 'always'),
                            ('zb_h1', 'always'), ('zb_h1', 'never'))
  def testAccumulatorsAndGradientsEqualUnpipelined(self, schedule, remat):
    ref_loss, ref_grads, ref_accs = _AccumulatorRun(schedule, remat, False)
    loss, grads, accs = _AccumulatorRun(schedule, remat, True)
    self.assertAllClose(ref_loss, loss, rtol=1e-12)
    for r, g in zip(ref_grads, grads):
      self.assertAllClose(r, g, rtol=1e-10, atol=1e-12)
    self.assertLen(accs, 4)
    # Recomputation (remat) and the split backward do not count twice.
    self.assertAllClose(ref_accs, accs, rtol=1e-12)


class RefusedTest(test_utils.TestCase):
  """What our executor cannot or will not do the Lingvo way is refused."""

  def _Instantiate(self, p):
    with cluster_factory.ForTestingWorker(cpus=K, split_size=K):
      py_utils.GetOrCreateGlobalStepVar()
      return p.Instantiate()

  def testFromLingvoNeedsALingvoGPipeLayer(self):
    with self.assertRaisesRegex(TypeError, 'FromLingvo takes the params of '
                                'lingvo.core.gpipe.PipeliningLayer .* got '
                                'params of _Dense'):
      lingvo_adapter.FromLingvo(_Dense.Params())

  def testScheduleThatNeedsTheLossInsideThePipeline(self):
    p = _Params('from_lingvo', 'extra_inputs').Set(schedule='1f1b')
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, "schedule '1f1b' .* needs the "
                                  'loss computed there'):
        self._Instantiate(p)

  def testMoreMicroBatchesThanExamples(self):
    # Lingvo quietly runs fewer micro-batches; we say so.
    for executor in ('ours', 'from_lingvo'):
      with tf.Graph().as_default():
        net = self._Instantiate(
            _Params(executor, 'extra_inputs').Set(num_micro_batches=8))
        with self.assertRaisesRegex(ValueError, 'batch 4 is not divisible by '
                                    '8 micro-batches'):
          net.FProp(net.theta, tf.zeros([BATCH, DIM], tf.float64))

  def testStateDtypeMismatch(self):
    p = _Params('ours', 'extra_inputs').Set(state_dtype=tf.float32)
    with tf.Graph().as_default():
      net = self._Instantiate(p)
      with self.assertRaisesRegex(
          ValueError, 'state_dtype is float32 but stage 0 hands over .* of '
          'dtype float64: cast it in the stage'):
        net.FProp(net.theta, tf.zeros([BATCH, DIM], tf.float64))

  def testNestedMapFPropTakesOneNestedMap(self):
    p = _Params('ours', 'nested_map_fprop')
    with tf.Graph().as_default():
      net = self._Instantiate(p)
      x = tf.zeros([BATCH, DIM], tf.float64)
      with self.assertRaisesRegex(ValueError, 'nested_map_fprop=True takes '
                                  'exactly one NestedMap input'):
        net.FProp(net.theta, x, x)

  def testBeforeLayerNeedsAName(self):
    p = _Params('ours', 'before_tpl')
    p.before_tpl[0].name = ''
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, r'before_tpl\[0\] needs a '
                                  'name of its own'):
        self._Instantiate(p)


if __name__ == '__main__':
  tf.test.main()
