"""The GPU audit (gpipe/measure/gpu_audit.py), without a GPU.

Hand-made graphs whose findings are known from TensorFlow's kernel registry
come out exactly; the registered models' training graphs and the pipelined
decoding of the Transformers, on planned GPUs, come out clean (small
variants with the same layers and ops: a CPU-only op added to a stage of any
of them fails here); and the trainer's ``--mode=inspect_model
--device_type=gpu`` prints the audit.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl import flags
from absl.testing import parameterized
from gpipe.measure import gpu_audit
from lingvo import compat as tf
from lingvo.core import ops as lingvo_ops
from lingvo.core import test_utils
import params  # pylint: disable=unused-import  # registers the models
from params import image as image_params
from params import mt as mt_params
from tasks.image import cells
from tasks.image import network
from tests import graph_rewrites
from tests import trainer_testlib
from tools.trainer import inspect_model
from tools.trainer import model_graph
from tools.trainer import model_select
from tools.trainer import placement as placement_lib

graph_rewrites.Off()

GPU0 = '/job:worker/replica:0/task:0/device:GPU:0'
GPU1 = '/job:worker/replica:0/task:1/device:GPU:0'
HOST1 = '/job:worker/replica:0/task:1/device:CPU:0'


def _Call(fn, name, device, *args):
  """Calls concrete function `fn` as the executor does: scope, device."""
  with tf.name_scope(name), tf.device(device):
    return fn(*args)


def _Rows(result):
  """(kind, stage, op type, tensor or op name, calls) of each finding."""
  return sorted((f.kind, f.stage, f.op, f.node, f.calls)
                for f in result.findings)


class HandMadeGraphTest(test_utils.TestCase):
  """Graphs whose findings the registry fixes; the audit finds those."""

  def testCpuOnlyOpAndAHostOpInAStageFunction(self):
    # MatrixSquareRoot has CPU kernels only; the stage's body leaves it
    # unplaced, so it is on its call's GPU, falls back to task 1's host and
    # runs next to the explicitly placed Square: the host-GPU copies are the
    # argument into the Square and the square root back into the MatMul.
    @tf.function(autograph=False)
    def Stage(x):
      with tf.device('/device:CPU:0'):
        squared = tf.square(x, name='on_host')
      root = tf.linalg.sqrtm(squared, name='root')
      return tf.matmul(root, x, name='mm')

    with tf.Graph().as_default() as graph:
      fn = Stage.get_concrete_function(tf.TensorSpec([4, 4], tf.float32))
      x = tf.zeros([4, 4])
      for m in range(2):  # Two micro-batches: two calls of one body.
        _Call(fn, 'stage1_F%d' % m, GPU1, x)
    result = gpu_audit.Audit(graph)
    self.assertEqual(sorted([
        (gpu_audit.NO_GPU_KERNEL, 'stage1 F', 'MatrixSquareRoot', 'root', 2),
        (gpu_audit.HOST_CROSSING, 'stage1 F', 'MatrixSquareRoot', 'root:0',
         2),
        (gpu_audit.HOST_CROSSING, 'stage1 F', '_Arg', 'x:0', 2),
    ]), _Rows(result))
    no_kernel = [f for f in result.findings
                 if f.kind == gpu_audit.NO_GPU_KERNEL][0]
    self.assertEqual((GPU1, 'T=float32'), (no_kernel.device, no_kernel.dtype))
    self.assertIn('runs on task 1 CPU:0 (soft placement); hard placement '
                  'fails', no_kernel.detail)
    self.assertEqual([GPU1], list(result.devices))
    summary = result.devices[GPU1]
    self.assertEqual(([1], 2), (summary.stages, summary.micro_batches))
    report = '\n'.join(gpu_audit.Report(result))
    self.assertIn('1 no GPU kernel, 0 Lingvo op, 2 host crossing, 0 host '
                  'memory', report)
    self.assertIn('%s (stage 1, %d ops): 3 finding(s); host-GPU copies per '
                  'step: 4 (2 per micro-batch of 2)' % (GPU1, summary.num_ops),
                  report)
    # The same from the GraphDef.
    self.assertEqual(_Rows(result),
                     _Rows(gpu_audit.Audit(graph.as_graph_def())))

  def testADtypeTheGpuKernelLacks(self):
    # TensorFlow's GPU Split kernel takes floats only.
    with tf.Graph().as_default() as graph, tf.device(GPU0):
      tf.split(tf.zeros([4], tf.int64), 2, name='ids')
      tf.split(tf.zeros([4], tf.float32), 2, name='floats')
    result = gpu_audit.Audit(graph)
    self.assertEqual([(gpu_audit.NO_GPU_KERNEL, 'graph', 'Split', 'ids', 1)],
                     _Rows(result))
    self.assertEqual('T=int64', result.findings[0].dtype)

  def testLingvoOpWithoutGpuKernel(self):
    @tf.function(autograph=False)
    def Stage(x):
      check = lingvo_ops.assert_same_dim0([x, x], name='same_batch')
      with tf.control_dependencies([check]):
        return tf.identity(x)

    with tf.Graph().as_default() as graph:
      fn = Stage.get_concrete_function(tf.TensorSpec([4, 2], tf.float32))
      _Call(fn, 'stage0_F0', GPU0, tf.zeros([4, 2]))
    result = gpu_audit.Audit(graph)
    self.assertIn('AssertSameDim0', gpu_audit.LingvoOps())
    # The installed Lingvo registers its ops for CPU only: the assert runs
    # on the host and the GPU's tensor is copied there to be checked.
    self.assertEqual(sorted([
        (gpu_audit.LINGVO_OP, 'stage0 F', 'AssertSameDim0', 'same_batch', 1),
        (gpu_audit.HOST_CROSSING, 'stage0 F', '_Arg', 'x:0', 1),
    ]), _Rows(result))
    self.assertEqual('types=[float32]', result.findings[0].dtype)

  def testInt32ArgumentsStayOnTheHost(self):
    # On a GPU, a function's int32 arguments are in host memory: a gather
    # by int32 ids copies them to the device in every call; int64 ids stay
    # in device memory.
    @tf.function(autograph=False)
    def Stage(table, ids):
      return tf.gather(table, ids, name='lookup')

    with tf.Graph().as_default() as graph:
      table = tf.zeros([8, 2])
      for dtype, name in ((tf.int32, 'stage0_F0'), (tf.int64, 'stage1_F0')):
        fn = Stage.get_concrete_function(tf.TensorSpec([8, 2], tf.float32),
                                         tf.TensorSpec([3], dtype))
        _Call(fn, name, GPU0 if dtype == tf.int32 else GPU1, table,
              tf.zeros([3], dtype))
    result = gpu_audit.Audit(graph)
    self.assertEqual([(gpu_audit.HOST_MEMORY, 'stage0 F', '_Arg', 'ids:0', 1)],
                     _Rows(result))
    self.assertEqual(('int32', 'host memory -> device memory of GatherV2 '
                      '(lookup)'),
                     (result.findings[0].dtype, result.findings[0].detail))

  def testInt32ResultsLeaveFromHostMemory(self):
    # ArgMax's GPU kernel writes its int32 indices to device memory; a
    # function returns int32 from host memory (through the Identity
    # tf.function adds, whose int32 kernel is in host memory): one copy per
    # call.
    @tf.function(autograph=False)
    def Stage(x):
      return (tf.argmax(x, axis=-1, output_type=tf.int32, name='best32'),
              tf.argmax(x, axis=-1, output_type=tf.int64, name='best64'))

    with tf.Graph().as_default() as graph:
      fn = Stage.get_concrete_function(tf.TensorSpec([2, 3], tf.float32))
      _Call(fn, 'stage0_F0', GPU0, tf.zeros([2, 3]))
    result = gpu_audit.Audit(graph)
    self.assertEqual(
        [(gpu_audit.HOST_MEMORY, 'stage0 F', 'ArgMax', 'best32:0', 1)],
        _Rows(result))
    self.assertIn('device memory -> host memory of',
                  result.findings[0].detail)

  def testHandOversAndTheBatchOncePerStepAreNotFindings(self):
    # Stage 0 on GPU 0 hands its output to stage 1 on GPU 1; the batch comes
    # from the host (the input) once per step, split before the stages.
    @tf.function(autograph=False)
    def Stage(x):
      return tf.nn.relu(x)

    with tf.Graph().as_default() as graph:
      fn = Stage.get_concrete_function(tf.TensorSpec([2, 2], tf.float32))
      with tf.device(HOST1):
        batch = tf.ones([4, 2], name='input')
      with tf.device(GPU0):
        parts = tf.split(batch, 2, name='split')
      for m, part in enumerate(parts):
        out = _Call(fn, 'stage0_F%d' % m, GPU0, part)
        _Call(fn, 'stage1_F%d' % m, GPU1, out)
    result = gpu_audit.Audit(graph)
    self.assertEqual([], result.findings)
    self.assertEqual([GPU0, GPU1], sorted(result.devices))
    self.assertEqual('GPU audit: 2 GPU(s), no findings (from the kernel '
                     'registry, nothing run; soft placement as the trainer '
                     'sets it)', gpu_audit.Report(result)[0])

  def testLayerIsTheNameScope(self):
    self.assertEqual('stack_0/conv', gpu_audit.Layer(
        'gradients/recompute/stack_0/conv/Conv2D_grad/Conv2DBackpropInput'))
    self.assertEqual('', gpu_audit.Layer('MatMul'))


# The registered models, by what decides their ops: the family's layers and
# the options that add or change ops. A model with dropout or label
# smoothing has the ops of one without (and more), so those pick the
# representative of a structure rather than split it. Each structure's
# representative is built shrunk to a few small layers (the same layer and
# op types), its input standing in for its data.
def _Structure(cls):
  """(what decides the ops of registered model class `cls`, its rank)."""
  obj = cls()
  if issubclass(cls, image_params.AmoebaNetImageNetBase):
    net = obj.Network()
    return ('image', net.genotype, net.stem, net.aux_head,
            net.drop_path_decay_steps > 0, net.dropout_keep_prob < 1.0,
            cls.LABEL_SMOOTHING > 0), 0
  if issubclass(cls, mt_params.TransformerMTBase):
    return (('mt', _HasSource(cls), cls.LOGITS_ABS_MAX > 0,
             cls.SCALE_FFN_INIT),
            -int(cls.DROPOUT > 0) - int(cls.LABEL_SMOOTHING > 0))
  return (cls.__module__, cls.__name__), 0


def _HasSource(cls):
  """Whether Transformer model class `cls` has a source (an encoder).

  Read from its small variant's layers (``_Small``: one layer per stack, the
  same layer types): building the full layer list of a 64-layer model takes
  seconds.
  """
  return _Small(cls)().Layers()[0].has_source


def _Representatives():
  """{structure: the registered model name that represents it}."""
  best = {}
  for name in model_select.RegisteredNames():
    key, rank = _Structure(model_select.ModelParamsObject(name).__class__)
    if key not in best or (rank, name) < best[key]:
      best[key] = (rank, name)
  return {key: name for key, (_, name) in best.items()}


_SMALL = {
    # AmoebaNets: 3 cells (one per stack), narrow, 32x32 (digits: their own
    # 16x16 and one channel), their layer list cut to two cells (_TwoCells).
    image_params.AmoebaNetImageNetBase: dict(
        NUM_CELLS=3, FILTERS=8, IMAGE_SIZE=32, BATCH_SIZE=4, NUM_STAGES=2,
        NUM_MICRO_BATCHES=2),
    # Transformers: one encoder and one decoder layer (or one decoder layer),
    # d_model 8, a 32-token vocabulary, 4 tokens.
    mt_params.TransformerMTBase: dict(
        MODEL_DIM=8, HIDDEN_DIM=16, NUM_HEADS=2, NUM_LAYERS=1, VOCAB_SIZE=32,
        SRC_LEN=4, TGT_LEN=4, BATCH_SIZE=4, NUM_STAGES=2,
        NUM_MICRO_BATCHES=2),
}


def _TwoCells(layers, net, micro_batch):
  """AmoebaNet `layers` cut to the stem, two cells and the heads.

  A cell's ops follow from the model's genotype, whether the cell reduces and
  whether the cell before it reduced (then it reduces its previous state by a
  FactorizedReduceLayer; else it adjusts it by a 1x1 convolution, as it
  adjusts its current input, or not at all): the first reduction cell and the
  first normal cell after a reduction cell have every op of every cell. They
  are chained after the stem (their inputs' channels and resolutions from
  the layers before them), then the aux head and the classifier, sized for
  the normal cell. The training graphs of the AmoebaNet representatives so
  cut have the op types (with their dtypes) of the uncut ones: 2 cells where
  the ImageNet stem has 7, the CIFAR stem 5.

  Args:
    layers: network.LayerParams of `net`.
    net: the network.AmoebaNetParams.
    micro_batch: examples per micro-batch.

  Returns:
    The shorter list of layer params.
  """
  reduction = next(p for p in layers
                   if p.cls is cells.CellLayer and p.reduction)
  normal = next(p for p in layers
                if p.cls is cells.CellLayer and not p.reduction and
                p.prev_stride == 2)
  kept = []
  shapes = network.InputShapes(net, micro_batch)
  for p in (layers[0], reduction, normal):
    p = p.Copy()
    if p.cls is cells.CellLayer:
      # (current, previous) of the layer before; the stem has no previous.
      _, height, _, dim = shapes[0].ToTensorShape().as_list()
      _, prev_height, _, prev_dim = shapes[-1].ToTensorShape().as_list()
      p.Set(in_dim=dim, prev_dim=prev_dim, prev_stride=prev_height // height)
    shapes = p.cls.FPropMeta(p, *shapes).out_shapes
    kept.append(p)
  _, height, width, dim = shapes[0].ToTensorShape().as_list()
  aux, classifier = [p for p in layers if p.name == 'aux_head'] + layers[-1:]
  return kept + [aux.Copy().Set(in_dim=dim, height=height, width=width),
                 classifier.Copy().Set(in_dim=dim)]


def _Small(cls):
  """A subclass of registered model class `cls` with small dimensions."""
  for family, small in _SMALL.items():
    if issubclass(cls, family):
      attrs = dict(small)
      if cls.__name__ == 'AmoebaNetD_Digits':
        attrs.update(IMAGE_SIZE=cls.IMAGE_SIZE)
      if family is image_params.AmoebaNetImageNetBase:

        def Pipeline(self, net):
          p = cls.Pipeline(self, net)
          p.layers = _TwoCells(
              p.layers, net, self.BATCH_SIZE // self.NUM_MICRO_BATCHES)
          return p

        attrs.update(Pipeline=Pipeline)
      if getattr(cls, 'SRC_LEN', 0) == 1:  # Decoder-only: no source.
        attrs.update(SRC_LEN=1)
      return type('Small' + cls.__name__, (cls,), attrs)
  return cls


_REPRESENTATIVES = sorted(_Representatives().values())
# The representatives with a pipelined decoder (an encoder-decoder
# Transformer; the task's pipelined_decode).
_DECODERS = [
    n for n in _REPRESENTATIVES
    if issubclass(model_select.ModelParamsObject(n).__class__,
                  mt_params.TransformerMTBase) and
    _HasSource(model_select.ModelParamsObject(n).__class__)
]


def _PlannedGpus():
  """Two GPUs of two worker tasks, planned: they need not exist."""
  return placement_lib.Placement(
      2, cluster_spec='worker=h0:1,h1:1', device_type='gpu',
      devices_per_task=1, plan_only=True)


class RegisteredModelsTest(test_utils.TestCase, parameterized.TestCase):
  """Every registered model's stages on GPUs: no host fallback, no copies."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():  # Lingvo's layers read flags.
      flags.FLAGS(['gpu_audit_test'])

  def testEveryStructureIsAudited(self):
    self.assertEmpty(model_select.ImportErrors())
    # Digits, AmoebaNet-B and -D on ImageNet, the T(L, H, A) Transformers
    # with and without the deep-model fixes, decoder-only Transformer-L and
    # the toy model.
    self.assertContainsSubset(
        ['image.AmoebaNetB_18_512_Cifar10', 'image.AmoebaNetD_18_208',
         'image.AmoebaNetD_Digits', 'mt.NumbersSmall', 'mt.T12_16384_32',
         'mt.Transformer48', 'toy.PipelinedDigitsMlp'], _REPRESENTATIVES)
    self.assertEqual(['mt.NumbersSmall', 'mt.T12_16384_32'], _DECODERS)

  @parameterized.parameters(*_REPRESENTATIVES)
  def testStagesStayOnTheirGpus(self, name):
    small = _Small(model_select.ModelParamsObject(name).__class__)
    cfg = small().Model()
    cfg.input = small().GetDatasetParams('Train')
    cfg.input.stand_in = True
    model_select.SetStageDevices(cfg, [GPU0, GPU1], exact=True)
    lines = []
    result = inspect_model.AuditGpus(cfg, _PlannedGpus(), echo=lines.append)
    self.assertLen(result.devices, 2)
    self.assertFalse(result.findings, '%s (as %s):\n%s' % (
        name, small.__name__, '\n'.join(lines)))

  @parameterized.parameters(*_DECODERS)
  def testPipelinedDecodingStaysOnTheGpus(self, name):
    # The decoding loop's steps in lanes through the stages (greedy, and
    # beam search for the T(L, H, A) configs). Only the early stop of a
    # finished lane reads predicates on the host, counted apart.
    small = _Small(model_select.ModelParamsObject(name).__class__)
    cfg = small().Model()
    cfg.input = small().GetDatasetParams('Test')
    cfg.input.stand_in = True
    model_select.SetStageDevices(cfg, [GPU0, GPU1], exact=True)
    built = model_graph.Build(cfg, _PlannedGpus(), 'decode', seed=1)
    result = gpu_audit.Audit(built.graph)
    report = '\n'.join(gpu_audit.Report(result))
    self.assertFalse(result.findings, '%s (as %s, beam %d):\n%s' % (
        name, small.__name__, cfg.task.beam_size, report))
    self.assertEqual([2, 2], [d.predicates for d in result.devices.values()],
                     report)


class StandInInputTest(test_utils.TestCase):
  """An input's stand-in batches have its data's structure, without data."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS(['gpu_audit_test'])

  def testStandInsLookLikeTheOfflineData(self):
    for name in ('image.AmoebaNetD_Digits', 'mt.NumbersTiny',
                 'toy.PipelinedDigitsMlp'):
      for dataset in ('Train', 'Test'):
        input_params = model_select.ModelParams(name, dataset).input
        with tf.Graph().as_default():
          real = input_params.Instantiate().Dataset().element_spec
          input_params.stand_in = True
          stand_in = input_params.Instantiate().Dataset().element_spec
        self.assertEqual(real, stand_in, '%s %s' % (name, dataset))


class InspectModelTest(test_utils.TestCase):

  def testInspectModelPrintsTheAuditForPlannedGpus(self):
    # No GPU here, and none needed: the devices are planned.
    code, out, err = trainer_testlib.RunInProcess(
        model=trainer_testlib.TOY, mode='inspect_model', device_type='gpu')
    self.assertEqual(0, code, err)
    lines = out.strip().splitlines()
    self.assertIn('total params: %d' % 13130, lines)
    self.assertEqual('GPU audit: 2 GPU(s), no findings (from the kernel '
                     'registry, nothing run; soft placement as the trainer '
                     'sets it)', lines[-3])
    self.assertRegex(lines[-2], r'^/device:GPU:0 \(stage 0, \d+ ops\): none$')
    self.assertRegex(lines[-1], r'^/device:GPU:1 \(stage 1, \d+ ops\): none$')


if __name__ == '__main__':
  tf.test.main()
