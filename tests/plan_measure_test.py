"""Measuring a profile: layers' bytes and times, calibration, a model's inputs."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

from gpipe.plan import calibrate
from gpipe.plan import profiling
from gpipe.plan import simulator
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from tasks import dense
from tests import graph_rewrites
from tests import toy_layers
from tools.plan import model_profile

DEVICES = graph_rewrites.VirtualCpus(2)


def _Dense(name, width=16):
  return dense.DenseLayer.Params().Set(
      name=name, input_dim=width, output_dim=width, activation='RELU',
      params_init=py_utils.WeightInit.Gaussian(0.1))


class MeasureTest(test_utils.TestCase):

  def testBytesFromTheGraphAndEqualLayersMeasuredOnce(self):
    layers = [_Dense('a'), _Dense('b'), _Dense('c', 16)]
    specs = (tf.TensorSpec([32, 16], tf.float32),)
    got = profiling.MeasureLayers(layers, specs, [4, 8], repeats=1, warmup=0)
    self.assertLen(got, 3)
    for layer in got:
      self.assertEqual(layer.param_bytes, 4 * (16 * 16 + 16))
      self.assertEqual([m.rows for m in layer.measurements], [4, 8])
    at8 = got[0].measurements[1]
    self.assertEqual((at8.input_bytes, at8.output_bytes), (8 * 16 * 4,) * 2)
    # The backward of relu(x W + b) reads x (for dW) and the output (relu's
    # mask): two tensors of the micro-batch; W reads x and dy.
    self.assertEqual(at8.activation_bytes, 2 * 8 * 16 * 4)
    self.assertEqual(at8.weight_bytes, 2 * 8 * 16 * 4)
    # Of those, its input and its output (the next layer's input).
    self.assertEqual((at8.input_read_bytes, at8.output_read_bytes),
                     (8 * 16 * 4,) * 2)
    self.assertGreaterEqual(min(at8.forward, at8.backward, at8.weight), 0.0)
    # Equal layers on equal inputs: one measurement.
    self.assertIs(got[1].measurements[0], got[0].measurements[0])

  def testTimesGrowWithTheWorkAndBytesWithTheRows(self):
    # A 512-wide layer at 8 and at 1024 rows: 128 times the work (tens of
    # milliseconds for the three tasks at 1024 rows, tens of microseconds at
    # 8) takes longer, whatever else the machine runs: the fastest of 3
    # runs each. (B and W alone are differences of two runs, B of F+B less
    # F, W of F+B+W less F+B, which a busy machine can swamp.)
    (layer,) = profiling.MeasureLayers(
        [_Dense('wide', 512)], (tf.TensorSpec([8, 512], tf.float32),),
        [8, 1024], repeats=3, warmup=1)
    small, big = layer.measurements
    self.assertGreater(big.forward, small.forward)
    self.assertGreater(big.forward + big.backward + big.weight,
                       small.forward + small.backward + small.weight)
    # Every tensor of the micro-batch: 128 times the rows, the bytes.
    for field in ('input_bytes', 'output_bytes', 'activation_bytes',
                  'weight_bytes', 'input_read_bytes', 'output_read_bytes'):
      self.assertEqual(getattr(big, field), 128 * getattr(small, field),
                       field)
    self.assertEqual(small.input_bytes, 8 * 512 * 4)

  def testLossIsCountedInTheLastLayer(self):
    layers = [_Dense('a'), _Dense('b')]
    specs = (tf.TensorSpec([8, 16], tf.float64),)
    loss = (toy_layers.SquaredErrorLoss.Params(),
            tf.TensorSpec([8, 16], tf.float32))
    got = profiling.MeasureLayers(layers, specs, [4], loss=loss, repeats=1,
                                  warmup=0)
    first, last = got[0].measurements[0], got[1].measurements[0]
    self.assertGreater(last.activation_bytes, first.activation_bytes)
    self.assertNotEqual(last.output_bytes, first.output_bytes)

  def testDeviceAndCalibration(self):
    device = profiling.MeasureDevice(repeats=1, warmup=0)
    self.assertGreater(device['memory_bandwidth'], 1e6)
    self.assertGreaterEqual(device['call_seconds'], 0.0)
    layers = [_Dense('a'), _Dense('b')]
    specs = (tf.TensorSpec([8, 16], tf.float32),)
    loss = (toy_layers.SquaredErrorLoss.Params(),
            tf.TensorSpec([8, 16], tf.float32))
    profile = profiling.MeasureModel('toy', layers, specs, 8, [2, 4],
                                     loss=loss, repeats=1, warmup=0)
    calibrated = calibrate.CalibrateProfile(
        profile, '', DEVICES, layers, specs, [2, 4], loss=loss)
    self.assertLen(calibrated.factors, 2)
    for f in calibrated.factors:
      # A split backward's factor shared out over its tasks as traced.
      self.assertGreater(min(f.F, f.B, f.W), 0.0)
      self.assertGreaterEqual(min(f.BW, f.R), 0.0)
    self.assertGreaterEqual(calibrated.contention, 1.0)
    # The hand-over: a latency no lower, a bandwidth no higher.
    self.assertGreaterEqual(calibrated.handover.latency,
                            profile.handover.latency)
    self.assertGreater(calibrated.handover.bandwidth, 0.0)
    self.assertLessEqual(calibrated.handover.bandwidth,
                         profile.handover.bandwidth)
    config = simulator.Configuration(1, 2, (1, 1), 2, 'zb_auto', 'always')
    prediction = simulator.Predict(calibrated, config)
    # Each device (one stage each) is busy for its stage's calibrated task
    # times, M of each kind: the per-task costs add up to the device's time;
    # the step holds the span and the update.
    models = simulator.StageModels(calibrated, config)
    for busy, model in zip(prediction.busy_seconds, models):
      self.assertAllClose(busy, 2 * (model.forward + model.backward +
                                     model.weight), rtol=1e-9, atol=0)
    self.assertGreaterEqual(prediction.span_seconds,
                            max(prediction.busy_seconds))
    self.assertGreater(prediction.step_seconds, prediction.span_seconds)

  def testCalibrationOnASampleOfTheLayers(self):
    layers = [_Dense('a'), _Dense('b')]
    specs = (tf.TensorSpec([64, 16], tf.float32),)
    profile = profiling.MeasureModel('toy', layers, specs, 64, [2, 4],
                                     repeats=1, warmup=0)
    # A second layer that cannot be built on the first one's output: only
    # the sample of the first layer may be calibrated.
    unbuildable = [layers[0], _Dense('b', width=8)]
    calibrated = calibrate.CalibrateProfile(
        profile, '', DEVICES, unbuildable, specs, [2, 4], num_layers=1)
    self.assertEqual([f.rows for f in calibrated.factors], [2, 4])
    self.assertEqual(calibrated.batch, 64)
    self.assertEqual(calibrated.layers, profile.layers)
    with self.assertRaisesRegex(ValueError, 'at least one layer'):
      calibrate.CalibrateProfile(profile, '', DEVICES, layers, specs, [2],
                                 num_layers=0)


class ModelProfileTest(test_utils.TestCase):

  def testRegisteredModelsInputsAndLossAreCaptured(self):
    described = model_profile.Describe('toy.PipelinedDigitsMlp')
    self.assertEqual(described.batch, 32)
    (spec,) = described.input_specs
    self.assertEqual(spec.shape.as_list(), [32, 64])
    loss_params, targets = described.loss
    self.assertEqual(loss_params.cls.__name__, 'ImageLossLayer')
    # As the task hands them to the pipeline: int64, device memory on a GPU.
    self.assertEqual(targets.label.dtype, tf.int64)
    cfg = model_profile.model_select.ModelParams('toy.PipelinedDigitsMlp')
    self.assertEqual(model_profile.OptimizerCosts(cfg), (2, 7.0))


if __name__ == '__main__':
  tf.test.main()
