"""Parameter counts and settings of the registered mt.* configurations."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import flags
from absl.testing import parameterized
from lingvo import compat as tf
from lingvo import model_registry
from lingvo.core import test_utils
import params  # pylint: disable=unused-import  # registers mt.*
from params import mt
from tasks.mt import blocks
from tasks.mt import stack

# Paper figures: Table 1 (Transformer-L) and the multilingual section.
_TABLE1 = {3: 282.2e6, 13: 785.8e6, 103: 5.3e9, 415: 21.0e9, 1663: 83.9e9}
_T_MODELS = {
    'T6_8192_16': 400e6,
    'T24_8192_16': 1.3e9,
    'T12_16384_32': 1.3e9,
    'T32_16384_32': 3e9,
    'T64_16384_32': 6e9,
}


def _Config(name):
  return getattr(mt, name)()


class MtParamsTest(test_utils.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS(['mt_params_test'])

  @parameterized.parameters(*sorted(_TABLE1.items()))
  def testTransformerLWithinOnePercentOfTable1(self, num_layers, paper):
    layer_list = _Config('TransformerL_%d' % num_layers).Layers()
    self.assertLen(layer_list, num_layers + 2)
    parts = stack.CountByPart(layer_list)
    print('Transformer-L %d: %s (paper %.4g)' % (num_layers, dict(parts),
                                                  paper))
    self.assertAlmostEqual(parts['total'] / paper, 1.0, delta=0.01)
    # Separate input embedding and softmax weights, 32k x 2048 each.
    self.assertEqual(parts['embedding'], 32000 * 2048)
    self.assertEqual(parts['softmax'], 32000 * 2048 + 32000)

  def testT6Within3PercentOf400M(self):
    total = stack.CountParams(_Config('T6_8192_16').Layers())
    self.assertAlmostEqual(total / 400e6, 1.0, delta=0.03)

  def testTModelsBreakdownNextToPaper(self):
    rows = []
    for name, paper in sorted(_T_MODELS.items()):
      config = _Config(name)
      layer_list = config.Layers()
      parts = stack.CountByPart(layer_list)
      rows.append('%-14s paper %5.1fB counted %6.3fB  %s' %
                  (name, paper / 1e9, parts['total'] / 1e9, ', '.join(
                      '%s %.3fB' % (k, v / 1e9) for k, v in parts.items()
                      if k != 'total')))
      self.assertEqual(parts['total'], stack.CountParams(layer_list))
      self.assertEqual(
          sum(v for k, v in parts.items() if k != 'total'), parts['total'])
      # Shared source/target embedding; its own softmax.
      self.assertEqual(parts['embedding'], 64000 * 1024)
      # The paper rounds; the counts stay within 25% of its figures.
      self.assertAlmostEqual(parts['total'] / paper, 1.0, delta=0.25)
    print('\n'.join(rows))

  def testT64HasOneHundredTwentyEightLayersOnSixteenStages(self):
    config = _Config('T64_16384_32')
    layer_list = config.Layers()
    block_params = [p for p in layer_list
                    if p.cls in (blocks.EncoderLayer, blocks.DecoderLayer)]
    self.assertLen(block_params, 128)
    self.assertEqual(config.NUM_STAGES, 16)
    self.assertEqual(block_params[0].hidden_dim, 16384)
    self.assertEqual(block_params[0].num_heads, 32)
    self.assertEqual(block_params[0].model_dim, 1024)
    # Trainability fixes: ffn init scaled by 1/L, clipped logits.
    self.assertAlmostEqual(block_params[0].ffn_init_scale, 1.0 / 64)
    self.assertGreater(layer_list[-1].logits_abs_max, 0)

  @parameterized.parameters('mt.T6_8192_16', 'mt.T24_8192_16',
                            'mt.T12_16384_32', 'mt.T32_16384_32',
                            'mt.T64_16384_32', 'mt.TransformerL_3',
                            'mt.TransformerL_1663', 'mt.Transformer48',
                            'mt.NumbersSmall')
  def testRegistered(self, name):
    p = model_registry.GetParams(name, 'Train')
    network = p.task.network
    self.assertIs(network.layers[0].cls, blocks.EmbeddingLayer)
    self.assertIs(network.layers[-1].cls, blocks.SoftmaxLayer)
    self.assertEqual(p.task.max_decode_len, p.input.tgt_len)
    self.assertEqual(p.input.batch_size % network.num_micro_batches, 0)

  def testT64StructureHasTheLayersStagesAndMicroBatchesOfT64(self):
    # The 16-worker scale run (docs/BENCHMARKS.md): T64_16384_32's shape.
    small = model_registry.GetParams('mt.T64Structure_Numbers', 'Train')
    big = model_registry.GetParams('mt.T64_16384_32', 'Train')
    layers = small.task.network.layers
    self.assertLen(layers, len(big.task.network.layers))
    self.assertLen(layers, 130)  # 64 + 64 Transformer layers, emb, softmax
    self.assertEqual([lp.cls for lp in big.task.network.layers],
                     [lp.cls for lp in layers])
    self.assertEqual(16, small.task.network.num_stages)
    self.assertEqual(big.task.network.num_stages,
                     small.task.network.num_stages)
    self.assertEqual(32, small.task.network.num_micro_batches)
    self.assertEqual(0, small.input.batch_size % 32)

  def testNumbersSmallBuildsTwoStagesOfFourMicroBatches(self):
    p = model_registry.GetParams('mt.NumbersSmall', 'Train')
    self.assertEqual(p.task.network.num_micro_batches, 4)
    p.task.network.stage_devices = ['/device:CPU:0', '/device:CPU:1']
    with tf.Graph().as_default():
      task = p.task.Instantiate()
      self.assertEqual(task.network.num_stages, 2)
      self.assertLen(task.network.stage_sizes, 2)
      self.assertEqual(sum(task.network.stage_sizes), 8)  # 3 + 3 + 2


if __name__ == '__main__':
  tf.test.main()
