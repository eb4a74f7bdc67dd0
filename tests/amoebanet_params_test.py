"""AmoebaNet networks: the paper's parameter counts, layer list, registry."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from absl import flags
from absl.testing import parameterized
from lingvo import compat as tf
from lingvo import model_registry
from lingvo.core import test_utils
import params  # pylint: disable=unused-import  # registers params/image.py
from params import image as image_params
from tasks.image import network
from tests import graph_rewrites

graph_rewrites.Off()

# (config class, paper's parameter count). Table 1 (AmoebaNet-D, 224x224,
# 1000 classes) and the ImageNet AmoebaNet-B (18, 512).
PAPER_COUNTS = [
    ('AmoebaNetD_18_208', 82e6),
    ('AmoebaNetD_18_416', 318e6),
    ('AmoebaNetD_18_544', 542e6),
    ('AmoebaNetD_36_544', 1.05e9),
    ('AmoebaNetD_72_512', 1.8e9),
    ('AmoebaNetB_18_512_ImageNet', 557e6),
]


def _ParsedFlags():
  # Lingvo's registry reads --model_params_override.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['test'])


class ParamCountTest(test_utils.TestCase, parameterized.TestCase):
  """Counts from the built layers (no weights allocated) vs the paper."""

  @parameterized.named_parameters(*[(n, n, c) for n, c in PAPER_COUNTS])
  def testWithin3PercentOfPaper(self, name, paper):
    config = getattr(image_params, name)()
    count = network.CountParams(network.LayerParams(config.Network()))
    self.assertBetween(count / paper, 0.97, 1.03,
                       msg='%s: %d vs paper %g' % (config, count, paper))

  def testCountIsTheSumOverTheFlatList(self):
    net = network.AmoebaNetParams().Set(num_cells=3, filters=8,
                                        num_classes=10, image_size=16,
                                        stem='cifar')
    layers = network.LayerParams(net)
    # A cell's count does not depend on its name or drop path rate.
    renamed = [l.Copy().Set(name='x%d' % i) for i, l in enumerate(layers)]
    self.assertEqual(network.CountParams(layers),
                     network.CountParams(renamed))
    with tf.Graph().as_default():
      for p in layers:
        p.Copy().Instantiate()
      total = sum(v.shape.num_elements() for v in tf.trainable_variables())
    self.assertEqual(network.CountParams(layers), total)


class LayerListTest(test_utils.TestCase):
  """Structure of the flat layer list the pipeline cuts."""

  def testImageNetLayout(self):
    net = network.AmoebaNetParams().Set(genotype='D', num_cells=6,
                                        filters=16, image_size=64)
    layers = network.LayerParams(net)
    self.assertEqual([l.name for l in layers], [
        'stem', 'stem_cell_0', 'stem_cell_1', 'stack_0_cell_0',
        'stack_0_cell_1', 'reduction_1', 'stack_1_cell_0', 'stack_1_cell_1',
        'aux_head', 'reduction_2', 'stack_2_cell_0', 'stack_2_cell_1',
        'classifier'
    ])
    cells_ = [l for l in layers if hasattr(l, 'filters')]
    # Stem cells at D/4 and D/2; stacks at D, 2D, 4D.
    self.assertEqual([c.filters for c in cells_],
                     [4, 8, 16, 16, 32, 32, 32, 64, 64, 64])
    # Drop path: stem cells off, then keep prob falling with depth to 0.7.
    keeps = [c.drop_path_keep_prob for c in cells_]
    self.assertEqual(keeps[:2], [1.0, 1.0])
    self.assertTrue(all(a > b for a, b in zip(keeps[2:], keeps[3:])))
    self.assertAlmostEqual(keeps[-1], 0.7)
    # 64 -> 32 (stem conv) -> 16, 8 (stem cells) -> 4 (reduction_1).
    aux = [l for l in layers if l.name == 'aux_head'][0]
    self.assertEqual((aux.height, aux.width), (4, 4))

  def testFlopsMetaChainsThroughTheList(self):
    net = network.AmoebaNetParams().Set(num_cells=3, filters=8,
                                        num_classes=10, image_size=32)
    shapes = network.InputShapes(net, 2)
    for p in network.LayerParams(net):
      meta = p.cls.FPropMeta(p, *shapes)
      self.assertGreater(meta.flops, 0, p.name)
      shapes = meta.out_shapes
    self.assertEqual([s.ToTensorShape().as_list() for s in shapes],
                     [[2, 10], [2, 10]])  # logits, aux logits

  def testBadNumCells(self):
    with self.assertRaisesRegex(ValueError, 'multiple of 3'):
      network.LayerParams(network.AmoebaNetParams().Set(num_cells=4))


class RegistryTest(test_utils.TestCase, parameterized.TestCase):
  """Registered configurations instantiate their params."""

  @parameterized.parameters(
      'AmoebaNetB_18_512_ImageNet', 'AmoebaNetD_18_256_ImageNet',
      'AmoebaNetD_18_208', 'AmoebaNetD_72_512', 'AmoebaNetB_18_512_Cifar10',
      'AmoebaNetB_18_512_Cifar100', 'AmoebaNetD_Digits')
  def testRegistered(self, name):
    _ParsedFlags()
    p = model_registry.GetParams('image.' + name, 'Train')
    self.assertGreater(p.input.batch_size, 0)
    net = p.task.network
    self.assertEqual(p.input.batch_size % net.num_micro_batches, 0)
    self.assertEqual(net.layers[-1].num_classes, p.task.num_classes)

  def testImageNetModelIsThePapers(self):
    _ParsedFlags()
    p = model_registry.GetParams('image.AmoebaNetB_18_512_ImageNet', 'Train')
    self.assertEqual(p.task.network.num_stages, 4)
    self.assertEqual(p.input.image_size, 480)
    self.assertEqual(p.task.label_smoothing, 0.1)
    self.assertEqual(p.task.aux_loss_weight, 0.4)
    self.assertEqual(p.task.train.optimizer.cls.__name__, 'RMSProp')
    self.assertEqual(p.task.network.layers[-1].dropout_keep_prob, 0.5)
    self.assertIn('aux_head', [l.name for l in p.task.network.layers])

  def testDigitsTrainsPipelined(self):
    _ParsedFlags()
    p = model_registry.GetParams('image.AmoebaNetD_Digits', 'Train')
    self.assertEqual(p.task.network.num_stages, 2)
    self.assertGreaterEqual(p.task.network.num_micro_batches, 4)


if __name__ == '__main__':
  tf.test.main()
