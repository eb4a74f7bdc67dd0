"""Lingvo's GPipe layers and stacks on our executor equal Lingvo's executor.

Each case builds the same Lingvo params twice, once as they are (Lingvo's
StackedRecurrent executor) and once through ``gpipe.lingvo_adapter.FromLingvo``,
gives both the same variable values, and compares outputs and every gradient.
"""

from absl import flags
from absl.testing import parameterized
from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import lingvo_adapter
from gpipe.runtime import local_cluster
import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import hyperparams
from lingvo.core import layers_with_gpipe
from lingvo.core import py_utils
from lingvo.core import test_utils
from lingvo.tasks.lm import layers as lm_layers
from tests import graph_rewrites

graph_rewrites.Off()

K = 2
CONFIG = graph_rewrites.CpuConfig(K)
DIM, VOCAB, T, B = 8, 12, 5, 4


def _Transformer(cls, batch_dim, dtype=tf.float64):
  """Tiny params of one of Lingvo's GPipe Transformer stacks."""
  p = cls.Params().Set(name='stack', model_dim=DIM, num_encoder_layers=1,
                       num_decoder_layers=1, splits=K, num_micro_batches=2,
                       random_seed=7, dtype=dtype, state_dtype=dtype)
  p.batch_dim = batch_dim
  p.emb_tpl.token_emb.Set(vocab_size=VOCAB, embedding_dim=DIM)
  p.emb_tpl.position_emb.embedding_dim = DIM
  p.softmax_tpl.Set(num_classes=VOCAB, input_dim=DIM, num_shards=1)
  if cls is layers_with_gpipe.GPipeBatchMajorTransformerStack:
    p.packed_input = False
    for t in (p.encoder_tpl, p.decoder_tpl):
      t.Set(input_dim=DIM, output_dim=DIM)
      t.tr_atten_tpl.Set(input_dim=DIM, hidden_dim=DIM, num_heads=2)
      t.tr_fflayer_tpl.hidden_dim = 16
  else:
    for t in (p.encoder_tpl, p.decoder_tpl):
      t.source_dim = DIM
      _SetEverywhere(t, 'num_attention_heads', 2)
      if 'tr_fflayer_tpl' in t:
        t.tr_fflayer_tpl.hidden_dim = 16
  return p


def _SetEverywhere(p, name, value):
  """Sets param `name` in `p` and in every nested params of it."""
  for key, sub in p.IterParams():
    if key == name:
      p.Set(**{name: value})
    elif isinstance(sub, hyperparams.Params):
      _SetEverywhere(sub, name, value)


def _TransformerInputs(batch_dim):
  rng = np.random.RandomState(3)
  shape = (T, B) if batch_dim == 1 else (B, T)
  ids = lambda: tf.constant(rng.randint(1, VOCAB, shape), tf.int32)
  paddings = np.zeros(shape)
  paddings[-1:] = 1.0 if batch_dim == 1 else 0.0
  pad = tf.constant(paddings, tf.float64)
  return dict(source_input=ids(), source_paddings=pad, target_input=ids(),
              target_paddings=pad, labels=ids(),
              label_weights=tf.ones(shape, tf.float64))


def _Build(p, fprop):
  """Instantiates p on 2 CPUs; returns (vars by name, fetches)."""
  with cluster_factory.ForTestingWorker(cpus=K, split_size=K):
    py_utils.GetOrCreateGlobalStepVar()
    net = p.Instantiate()
    outputs = fprop(net)
  flat = [o for o in tf.nest.flatten(outputs) if o is not None]
  loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float64) *
                                 np.linspace(0.5, 1.5, o.shape.num_elements())
                                 .reshape(o.shape.as_list()))
                   for o in flat if o.dtype.is_floating])
  variables = net.vars.Flatten()
  grads = [tf.convert_to_tensor(g) for g in tf.gradients(loss, variables)]
  return net, {v.name: v for v in variables}, [loss] + flat, grads


def _Values(p, fprop, values=None, target=''):
  """Runs p's outputs and gradients; with `values`, loads them first."""
  config = None if target else CONFIG
  with tf.Graph().as_default(), tf.compat.v1.Session(
      target, config=config) as sess:
    net, variables, outputs, grads = _Build(p, fprop)
    sess.run(tf.global_variables_initializer())
    if values is not None:
      # Every variable's load in one run (as Variable.load does one by one:
      # its initializer, fed the value).
      sess.run([v.initializer for v in variables.values()],
               {v.initializer.inputs[1]: values[name]
                for name, v in variables.items()})
    own = sess.run(variables)
    out, grad = sess.run([outputs, grads])
    names = list(variables)
    return net, own, out, dict(zip(names, grad))


# (name, stack, batch_dim, also across 2 worker processes). The Evolved
# stack's run across processes is left out: it is GPipeTransformerStack with
# other encoder and decoder layers, whose cells take and give the same
# tensors (layers_with_gpipe's common Transformer FProp), so its stages cross
# processes exactly as TransformerTimeMajor's do; its own layers are compared
# in one process. (Its graphs take several times as long to build as the
# others': about 12 s for ours, against 3 to 5 s.)
STACKS = (
    ('TransformerTimeMajor', layers_with_gpipe.GPipeTransformerStack, 1,
     True),
    ('Evolved', layers_with_gpipe.GPipeEvolvedTransformerStack, 1, False),
    ('BatchMajor', layers_with_gpipe.GPipeBatchMajorTransformerStack, 0,
     True))


def setUpModule():
  # Lingvo's layers read flags (e.g. --tflite_compatible): use the defaults
  # when a runner other than tf.test.main imports this file.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


class TransformerStacksTest(test_utils.TestCase, parameterized.TestCase):
  """Each stack on ours, in one process (and across 2), equals Lingvo's."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cluster = local_cluster.LocalCluster(K)

  @classmethod
  def tearDownClass(cls):
    cls.cluster.Stop()
    super().tearDownClass()

  def _AssertClose(self, ref_out, ref_grads, out, grads):
    self.assertLen(ref_out, len(out))
    # The variables are float64, but some of Lingvo's attention and position
    # ops compute in float32: the executors agree to float32's rounding.
    for r, o in zip(ref_out, out):
      self.assertAllClose(r, o, rtol=2e-5, atol=2e-6)
    for name in ref_grads:
      self.assertAllClose(ref_grads[name], grads[name], rtol=2e-5,
                          atol=2e-6, msg=name)

  @parameterized.named_parameters(*STACKS)
  def testSameOutputsAndGradientsAsLingvo(self, cls, batch_dim,
                                         across_workers):
    p = _Transformer(cls, batch_dim)

    def FProp(net):
      return net.FProp(net.theta, **_TransformerInputs(batch_dim))

    _, values, ref_out, ref_grads = _Values(p, FProp)
    # In one process with 2 devices, as Lingvo's executor ran.
    ours = lingvo_adapter.FromLingvo(p)
    net, own, out, grads = _Values(ours, FProp, values)
    self.assertIsInstance(net, cls)
    self.assertIsInstance(net, lingvo_adapter.LingvoPipeliningLayer)
    # Same variables, same names: a checkpoint fits either executor.
    self.assertCountEqual(values, own)
    self._AssertClose(ref_out, ref_grads, out, grads)
    report = net.PartitionReport().splitlines()
    self.assertLen(report, 2 + K)
    self.assertIn('| cell_1 .. cell_1 | '
                  '/job:localhost/replica:0/task:0/device:CPU:1 |', report[2])
    self.assertIn('| {:,} |'.format(sum(np.size(v) for v in values.values())),
                  report[-1])
    if not across_workers:
      return
    # Across 2 worker processes (where Lingvo's executor cannot run).
    ours.stage_devices = self.cluster.devices
    net, _, out, grads = _Values(ours, FProp, values, self.cluster.target)
    for k, cell in enumerate(net.params.cell_tpl):
      for var in net.children[cell.name].vars.Flatten():
        self.assertIn('/job:worker/replica:0/task:%d' % k, var.device)
    self._AssertClose(ref_out, ref_grads, out, grads)


def _LmGraph(executor):
  """GPipeTransformerLm (Lingvo's or with its stack on ours) + Adam step."""
  p = lm_layers.GPipeTransformerLm.CommonParams(
      vocab_size=VOCAB, model_dim=DIM, hidden_dim=16, num_heads=2,
      num_layers=2, splits=K, num_micro_batches=2, num_shards=1,
      residual_dropout_prob=0.0)
  p.random_seed = 3
  if executor == 'ours':
    p.stack = lingvo_adapter.FromLingvo(p.stack)  # The one line.
  rng = np.random.RandomState(4)
  with cluster_factory.ForTestingWorker(cpus=K, split_size=K):
    step = py_utils.GetOrCreateGlobalStepVar()
    net = p.Instantiate()
    ids = tf.constant(rng.randint(1, VOCAB, (B, T)), tf.int32)
    labels = py_utils.NestedMap(
        class_ids=tf.constant(rng.randint(1, VOCAB, (B, T)), tf.int32),
        class_weights=tf.ones((B, T)))
    xent, _ = net.FProp(net.theta, ids, tf.zeros((B, T)), labels=labels)
  loss = xent.avg_xent
  train_op = tf.train.AdamOptimizer(0.05).minimize(
      loss, var_list=net.vars.Flatten(), global_step=step)
  return net, loss, train_op


class LanguageModelTest(test_utils.TestCase):
  """GPipeTransformerLm trains on ours; checkpoints go both ways."""

  def _Session(self, graph=None):
    return tf.compat.v1.Session(graph=graph, config=CONFIG)

  def testTrainsAndCheckpointsRoundTrip(self):
    ckpt_dir = self.create_tempdir().full_path
    # Our graph is built once: trained in one session, restored in another.
    ours_graph = tf.Graph()
    with ours_graph.as_default():
      net, ours_loss_op, train_op = _LmGraph('ours')
      self.assertIsInstance(net.stack, lingvo_adapter.LingvoPipeliningLayer)
      ours_saver = tf.train.Saver()
      init = tf.global_variables_initializer()
    with self._Session(ours_graph) as sess:
      sess.run(init)
      losses = [sess.run([ours_loss_op, train_op])[0] for _ in range(4)]
      ours_loss = sess.run(ours_loss_op)
      ours_path = ours_saver.save(sess, ckpt_dir + '/ours')
    self.assertLess(ours_loss, losses[0])
    # Ours -> Lingvo's executor: same variables, same loss.
    with tf.Graph().as_default(), self._Session() as sess:
      net, loss, train_op = _LmGraph('lingvo')
      self.assertNotIsInstance(net.stack, lingvo_adapter.LingvoPipeliningLayer)
      tf.train.Saver().restore(sess, ours_path)
      self.assertAllClose(ours_loss, sess.run(loss), rtol=1e-5)
      sess.run(train_op)  # Adam's slots came along too.
      lingvo_loss = sess.run(loss)
      lingvo_path = tf.train.Saver().save(sess, ckpt_dir + '/lingvo')
    # Lingvo's -> ours: a new session of our graph, every variable restored.
    with self._Session(ours_graph) as sess:
      ours_saver.restore(sess, lingvo_path)
      self.assertAllClose(lingvo_loss, sess.run(ours_loss_op), rtol=1e-5)
    self.assertLess(lingvo_loss, ours_loss)


if __name__ == '__main__':
  tf.test.main()
