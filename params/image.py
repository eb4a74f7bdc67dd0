"""Registered AmoebaNet image classification configurations.

Names are ``image.<ClassName>`` (Lingvo's registry), e.g.
``image.AmoebaNetB_18_512_ImageNet``. (L, D) = L normal cells over three
stacks, D filters.

* ``AmoebaNetB_18_512_ImageNet``: the paper's 557M ImageNet model: 480x480,
  4 stages, RMSProp, label smoothing 0.1, drop path 0.7, dropout 0.5,
  auxiliary head weight 0.4.
* ``AmoebaNetD_18_256_ImageNet``: the throughput model (Table 2), 224x224.
* ``AmoebaNetD_18_208`` ... ``AmoebaNetD_72_512``: the Table 1 family (82M to
  1.8B parameters, 224x224, batch 128) on 1, 1, 2, 4 and 8 stages.
* ``AmoebaNetB_18_512_Cifar10`` / ``_Cifar100`` / ``_OxfordPets`` /
  ``_Food101`` / ``_StanfordCars``: transfer configs (480x480, new softmax,
  flip + cutout).
* ``AmoebaNetD_Digits``: the offline default, a small AmoebaNet-D on
  scikit-learn's digits, 2 stages x 4 micro-batches, trains on a CPU.

Pipeline stages go on ``stage_devices`` of the PipeliningLayer; left unset,
they are the devices of the Lingvo cluster's model split (the trainer sets
them up).
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import optimizer
from lingvo.core import schedule
from tasks.image import inputs
from tasks.image import network
from tasks.image import task


class AmoebaNetImageNetBase(base_model_params.SingleTaskModelParams):
  """AmoebaNet on ImageNet (imagenet2012 via tfds, manual download dir).

  Subclasses set the class attributes below.
  """
  GENOTYPE = 'D'
  NUM_CELLS = 18
  FILTERS = 256
  IMAGE_SIZE = 224
  NUM_CLASSES = 1000
  BATCH_SIZE = 128
  NUM_STAGES = 2
  NUM_MICRO_BATCHES = 8
  DATASET = 'imagenet2012'
  TRAIN_SPLIT = 'train'
  TEST_SPLIT = 'validation'
  MANUAL_DIR = '~/tensorflow_datasets/downloads/manual'
  CUTOUT_SIZE = 0
  AUX_HEAD = True
  DROP_PATH_KEEP_PROB = 0.7
  DROPOUT_KEEP_PROB = 0.5
  LABEL_SMOOTHING = 0.1
  AUX_LOSS_WEIGHT = 0.4
  MAX_STEPS = 1000000
  # RMSProp with an exponentially decaying learning rate (0.97 per ~2.4
  # ImageNet epochs at batch 128), as the TPU reference trains AmoebaNets.
  LEARNING_RATE = 0.128
  LR_DECAY_STEPS = 24000
  WEIGHT_DECAY = 4e-5

  def _Input(self, split, is_training):
    return inputs.TfdsImageInput.Params().Set(
        dataset=self.DATASET, split=split, manual_dir=self.MANUAL_DIR,
        image_size=self.IMAGE_SIZE, batch_size=self.BATCH_SIZE,
        is_training=is_training, repeat=is_training,
        shuffle_buffer=10000 if is_training else 0,
        cutout_size=self.CUTOUT_SIZE if is_training else 0)

  def Train(self):
    return self._Input(self.TRAIN_SPLIT, True)

  def Test(self):
    return self._Input(self.TEST_SPLIT, False)

  def Network(self):
    """The AmoebaNetParams of this config."""
    return network.AmoebaNetParams().Set(
        genotype=self.GENOTYPE, num_cells=self.NUM_CELLS,
        filters=self.FILTERS, num_classes=self.NUM_CLASSES,
        image_size=self.IMAGE_SIZE, aux_head=self.AUX_HEAD,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB,
        drop_path_decay_steps=self.MAX_STEPS,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB)

  def Pipeline(self, net):
    """The PipeliningLayer over the flat layers of `net`, cut by flops."""
    micro_batch = self.BATCH_SIZE // self.NUM_MICRO_BATCHES
    return pipeline.PipeliningLayer.Params().Set(
        name='network', layers=network.LayerParams(net),
        num_stages=self.NUM_STAGES, num_micro_batches=self.NUM_MICRO_BATCHES,
        partition_cost='flops',
        input_shapes=network.InputShapes(net, micro_batch))

  def _Optimize(self, p):
    tp = p.train
    tp.optimizer = optimizer.RMSProp.Params().Set(decay=0.9, momentum=0.9,
                                                  epsilon=1.0)
    tp.learning_rate = self.LEARNING_RATE
    tp.lr_schedule = schedule.ExponentialSchedule.Params().Set(
        start=(0, 1.0), limit=(self.LR_DECAY_STEPS * 100, 0.97**100))
    tp.l2_regularizer_weight = self.WEIGHT_DECAY
    tp.max_steps = self.MAX_STEPS
    return p

  def Task(self):
    net = self.Network()
    p = task.ImageClassificationTask.Params().Set(
        name='image_classifier', network=self.Pipeline(net),
        num_classes=self.NUM_CLASSES, label_smoothing=self.LABEL_SMOOTHING,
        aux_loss_weight=self.AUX_LOSS_WEIGHT)
    return self._Optimize(p)


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_ImageNet(AmoebaNetImageNetBase):  # pylint: disable=invalid-name
  """The paper's AmoebaNet-B (18, 512), 557M parameters, 480x480, 4 stages."""
  GENOTYPE = 'B'
  NUM_CELLS = 18
  FILTERS = 512
  IMAGE_SIZE = 480
  BATCH_SIZE = 64
  NUM_STAGES = 4
  NUM_MICRO_BATCHES = 16


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_256_ImageNet(AmoebaNetImageNetBase):  # pylint: disable=invalid-name
  """AmoebaNet-D (18, 256), the throughput model of Table 2 (224x224)."""
  GENOTYPE = 'D'
  NUM_CELLS = 18
  FILTERS = 256
  BATCH_SIZE = 128
  NUM_STAGES = 2
  NUM_MICRO_BATCHES = 32


class _Table1Base(AmoebaNetImageNetBase):
  """The Table 1 family: AmoebaNet-D, 224x224, batch 128."""
  GENOTYPE = 'D'
  BATCH_SIZE = 128
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_208(_Table1Base):  # pylint: disable=invalid-name
  """Table 1 Naive-1: 82M parameters, one stage."""
  NUM_CELLS = 18
  FILTERS = 208
  NUM_STAGES = 1
  NUM_MICRO_BATCHES = 1


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_416(_Table1Base):  # pylint: disable=invalid-name
  """Table 1 Pipeline-1: 318M parameters, one stage, re-materialized."""
  NUM_CELLS = 18
  FILTERS = 416
  NUM_STAGES = 1


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_544(_Table1Base):  # pylint: disable=invalid-name
  """Table 1 Pipeline-2: 542M parameters, 2 stages."""
  NUM_CELLS = 18
  FILTERS = 544
  NUM_STAGES = 2


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_36_544(_Table1Base):  # pylint: disable=invalid-name
  """Table 1 Pipeline-4: 1.05B parameters, 4 stages."""
  NUM_CELLS = 36
  FILTERS = 544
  NUM_STAGES = 4


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_72_512(_Table1Base):  # pylint: disable=invalid-name
  """Table 1 Pipeline-8: 1.8B parameters, 8 stages."""
  NUM_CELLS = 72
  FILTERS = 512
  NUM_STAGES = 8


class _TransferBase(AmoebaNetImageNetBase):
  """AmoebaNet-B (18, 512) fine-tuned on a smaller set: 480x480, new softmax.

  Initialize from an ImageNet checkpoint of AmoebaNetB_18_512_ImageNet
  (p.train.init_from_checkpoint_rules) except the classifier weights.
  """
  GENOTYPE = 'B'
  NUM_CELLS = 18
  FILTERS = 512
  IMAGE_SIZE = 480
  BATCH_SIZE = 64
  NUM_STAGES = 4
  NUM_MICRO_BATCHES = 16
  CUTOUT_SIZE = 160  # A third of the image side.
  TEST_SPLIT = 'test'
  MANUAL_DIR = ''
  LEARNING_RATE = 0.01
  LR_DECAY_STEPS = 2000
  MAX_STEPS = 20000


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_Cifar10(_TransferBase):  # pylint: disable=invalid-name
  """CIFAR-10 transfer (paper: 99.0% top-1)."""
  DATASET = 'cifar10'
  NUM_CLASSES = 10


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_Cifar100(_TransferBase):  # pylint: disable=invalid-name
  """CIFAR-100 transfer (paper: 91.3% top-1)."""
  DATASET = 'cifar100'
  NUM_CLASSES = 100


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_OxfordPets(_TransferBase):  # pylint: disable=invalid-name
  """Oxford-IIIT Pets transfer (paper: 95.9% top-1)."""
  DATASET = 'oxford_iiit_pet'
  NUM_CLASSES = 37


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_Food101(_TransferBase):  # pylint: disable=invalid-name
  """Food-101 transfer (paper: 93.0% top-1)."""
  DATASET = 'food101'
  NUM_CLASSES = 101
  TEST_SPLIT = 'validation'


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_StanfordCars(_TransferBase):  # pylint: disable=invalid-name
  """Stanford Cars transfer (tfds cars196; paper: 94.6% top-1)."""
  DATASET = 'cars196'
  NUM_CLASSES = 196


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_Digits(AmoebaNetImageNetBase):  # pylint: disable=invalid-name
  """The offline default: a small AmoebaNet-D on scikit-learn's digits.

  16x16 upsampled digits, CIFAR-style stem, (L, D) = (3, 16), an auxiliary
  head, drop path and dropout; 2 pipeline stages x 4 micro-batches.
  """
  GENOTYPE = 'D'
  NUM_CELLS = 3
  FILTERS = 16
  IMAGE_SIZE = 16
  NUM_CLASSES = 10
  BATCH_SIZE = 32
  NUM_STAGES = 2
  NUM_MICRO_BATCHES = 4
  DROP_PATH_KEEP_PROB = 0.9
  DROPOUT_KEEP_PROB = 0.8
  LABEL_SMOOTHING = 0.1
  MAX_STEPS = 600
  LEARNING_RATE = 0.002

  TEST_SPLIT = 'test'
  TEST_BATCH_SIZE = 40  # 9 batches cover the 360 test digits exactly.

  def _Input(self, split, is_training):
    return inputs.DigitsInput.Params().Set(
        split=split, image_size=self.IMAGE_SIZE,
        batch_size=self.BATCH_SIZE if is_training else self.TEST_BATCH_SIZE,
        is_training=is_training, repeat=is_training,
        shuffle_buffer=2000 if is_training else 0)

  def Network(self):
    net = super().Network()
    net.Set(in_channels=1, stem='cifar', stem_filters=32, bn_decay=0.9,
            drop_path_decay_steps=0)
    net.aux_features_dim = 64
    return net

  def _Optimize(self, p):
    tp = p.train
    tp.optimizer = optimizer.Adam.Params()
    tp.learning_rate = self.LEARNING_RATE
    tp.lr_schedule = schedule.CosineSchedule.Params().Set(
        initial_value=1.0, final_value=0.01, total_steps=self.MAX_STEPS)
    tp.max_steps = self.MAX_STEPS
    return p
