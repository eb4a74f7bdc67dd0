"""Trainer pieces that need no training: model selection, overrides, inspect."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import time

from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import inspect_model
from tools.trainer import model_select
from tools.trainer import placement
from tools.trainer import progress

TOY = trainer_testlib.TOY
# 64x64+64 (three hidden layers) + 64x10+10 (logits).
TOY_PARAMS = 3 * (64 * 64 + 64) + 64 * 10 + 10


class ModelSelectTest(test_utils.TestCase):

  def testUnknownModelSuggestsClosestNames(self):
    with self.assertRaises(model_select.UnknownModelError) as ctx:
      model_select.ModelParamsObject('toy.PipelinedDigitMlp')
    self.assertIn("unknown model 'toy.PipelinedDigitMlp'", str(ctx.exception))
    self.assertIn('Did you mean: toy.PipelinedDigitsMlp', str(ctx.exception))

  def testUnknownFamilyStillSuggestsByClassName(self):
    with self.assertRaises(model_select.UnknownModelError) as ctx:
      model_select.ModelParamsObject('tiny.PipelinedDigitsMlp')
    self.assertIn(TOY, str(ctx.exception))

  def testOverrideAcceptsEqualsAndColonForms(self):
    cfg = model_select.ModelParams(
        TOY, 'Train',
        'task.train.learning_rate=0.5; task.train.max_steps : 7\n'
        'input.batch_size=16')
    self.assertEqual(0.5, cfg.task.train.learning_rate)
    self.assertEqual(7, cfg.task.train.max_steps)
    self.assertEqual(16, cfg.input.batch_size)

  def testOverrideGivesAParamThatIsNoneAValue(self):
    # Lingvo's text format alone leaves these None.
    cfg = model_select.ModelParams(
        'image.AmoebaNetB_18_512_Cifar10', 'Test',
        'input.data_dir=/data/tfds; task.network.stage_devices=["/cpu:0"]')
    self.assertEqual('/data/tfds', cfg.input.data_dir)
    self.assertEqual(['/cpu:0'], cfg.task.network.stage_devices)
    cfg = model_select.ModelParams('image.AmoebaNetB_18_512_Cifar10', 'Test',
                                   'input.data_dir=None')
    self.assertIsNone(cfg.input.data_dir)

  def testOverrideOfUnknownParamNamesIt(self):
    with self.assertRaisesRegex(ValueError, "no 'task.train.learning_rat'"):
      model_select.ModelParams(TOY, 'Train', 'task.train.learning_rat=0.5')
    with self.assertRaisesRegex(ValueError, 'is not "name=value"'):
      model_select.ModelParams(TOY, 'Train', 'task.train.learning_rate')

  def testPipelineShapeAndDevicesOverrides(self):
    cfg = model_select.ModelParams(TOY, 'Train')
    found = model_select.SetPipelineShape(cfg, num_stages=4,
                                          num_micro_batches=8)
    self.assertEqual(['task.network'], [path for path, _ in found])
    pp = cfg.task.network
    self.assertEqual((4, 8), (pp.num_stages, pp.num_micro_batches))
    self.assertEqual(4, model_select.MaxStages(cfg))
    with self.assertRaisesRegex(ValueError, '4 stages but only 2 devices'):
      model_select.SetStageDevices(cfg, ['/device:CPU:0', '/device:CPU:1'])
    model_select.SetStageDevices(cfg, ['/device:CPU:%d' % i for i in range(5)])
    self.assertEqual(['/device:CPU:%d' % i for i in range(4)],
                     pp.stage_devices)
    # Looped: four stages on two workers, stage k on worker k mod 2.
    workers = ['/job:worker/replica:0/task:%d/device:CPU:0' % i
               for i in range(2)]
    model_select.SetStageDevices(cfg, workers, loop=True)
    self.assertEqual(workers * 2, pp.stage_devices)

  def testScheduleOverridePlacesStagesForIt(self):
    workers = ['/job:worker/replica:0/task:%d/device:CPU:0' % i
               for i in range(2)]
    cfg = model_select.ModelParams(TOY, 'Train')
    model_select.SetPipelineShape(cfg, num_stages=4, schedule='zb_v')
    model_select.SetStageDevices(cfg, workers)
    # A V: stages 0 and 3 on worker 0, 1 and 2 on worker 1.
    self.assertEqual([workers[i] for i in (0, 1, 1, 0)],
                     cfg.task.network.stage_devices)
    cfg = model_select.ModelParams(TOY, 'Train')
    model_select.SetPipelineShape(cfg, num_stages=4,
                                  schedule='interleaved_1f1b')
    model_select.SetStageDevices(cfg, workers)
    self.assertEqual(workers * 2, cfg.task.network.stage_devices)
    cfg = model_select.ModelParams(TOY, 'Train')
    model_select.SetPipelineShape(cfg, num_stages=3, schedule='zb_v')
    with self.assertRaisesRegex(ValueError, "runs schedule 'zb_v'.*use an "
                                'even --num_stages of at most 4'):
      model_select.SetStageDevices(cfg, workers)
    with self.assertRaisesRegex(ValueError, "unknown schedule 'fifo'"):
      model_select.SetPipelineShape(cfg, schedule='fifo')

  def testTestInputIsAFinitePass(self):
    cfg = model_select.ModelParams(TOY, 'Test')
    self.assertFalse(cfg.input.repeat)
    self.assertEqual('test', cfg.input.split)


class InspectModelTest(test_utils.TestCase):

  def testPrintsLayersStagesAndTotalLast(self):
    lines = []
    cfg = model_select.ModelParams(TOY, 'Train')
    total = inspect_model.Inspect(cfg, echo=lines.append)
    self.assertEqual(TOY_PARAMS, total)
    self.assertEqual('total params: %d' % TOY_PARAMS, lines[-1])
    text = '\n'.join(lines)
    for i in range(4):
      self.assertRegex(text, r'layer_%03d dense%d ' % (i, i))
    self.assertIn('stage 0 (default device): 2 layers, 8,320 params', text)
    self.assertIn('stage 1 (default device): 2 layers, 4,810 params', text)

  def testCountsParamsOutsideThePipeline(self):
    # The same count as the trainable variables of the built model.
    cfg = model_select.ModelParams(TOY, 'Train')
    model_select.SetStageDevices(cfg, ['/device:CPU:0', '/device:CPU:0'])
    with tf.Graph().as_default():
      cfg.Copy().Instantiate()
      built = sum(
          v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
    self.assertEqual(built, TOY_PARAMS)


class PlacementTest(test_utils.TestCase):

  def testParseClusterSpec(self):
    self.assertEqual({'worker': ['h1:2222', 'h2:2222']},
                     placement.ParseClusterSpec('worker=h1:2222,h2:2222'))
    with self.assertRaisesRegex(ValueError, 'host:port'):
      placement.ParseClusterSpec('worker=h1')
    with self.assertRaisesRegex(ValueError, "needs a 'worker' job"):
      placement.ParseClusterSpec('ps=h1:1')

  def testClusterSpecDevicesAndTarget(self):
    # Planned, as for --mode=inspect_model: no worker is asked.
    p = placement.Placement(2, cluster_spec='worker=h1:1,h2:2',
                            devices_per_task=1, plan_only=True)
    self.assertEqual('grpc://h1:1', p.target)
    self.assertEqual('/job:worker/replica:0/task:1/device:CPU:0', p.devices[1])
    self.assertTrue(p.distributed)

  def testLocalVirtualDevices(self):
    p = placement.Placement(3, step_timeout_secs=7)
    self.assertEqual(['/device:CPU:0', '/device:CPU:1', '/device:CPU:2'],
                     p.devices)
    config = p.SessionConfig()
    self.assertEqual(3, config.device_count['CPU'])
    self.assertEqual(7000, config.operation_timeout_in_ms)
    self.assertEqual(7000, p.RunOptions().timeout_in_ms)
    # Grappler leaves the session graph alone unless asked.
    self.assertTrue(config.graph_options.rewrite_options.disable_meta_optimizer)
    config = placement.Placement(
        1, session_graph_optimizer=True).SessionConfig()
    rewrites = config.graph_options.rewrite_options
    self.assertFalse(rewrites.disable_meta_optimizer)
    self.assertEqual(rewrites.DEFAULT, rewrites.remapping)
    # With --xla, not the passes that rewrite compiled functions into ops
    # XLA lacks (gpipe.xla.SessionConfig).
    config = placement.Placement(
        1, session_graph_optimizer=True, compiled=True).SessionConfig()
    rewrites = config.graph_options.rewrite_options
    self.assertFalse(rewrites.disable_meta_optimizer)
    self.assertEqual(rewrites.OFF, rewrites.remapping)
    self.assertEqual(rewrites.NO_MEM_OPT, rewrites.memory_optimization)


class ProgressTest(test_utils.TestCase):

  def testLineHasStepLossRateAndEta(self):
    now = [100.0]
    meter = progress.Progress(10, 110, clock=lambda: now[0])
    for _ in range(10):
      meter.Count(32)
    now[0] = 105.0
    line, rate = meter.Line(20, {'loss': 1.5, 'accuracy': 0.25})
    self.assertAlmostEqual(64.0, rate)
    # 90 steps left at 2 steps/s.
    self.assertEqual(
        'step 20/110  loss 1.5000  accuracy 0.25  64.0 examples/s  ETA 45s',
        line)
    self.assertEqual('1h02m03s', progress.FormatSeconds(3723))

  def testStepLogKeepsOnlyTheResumedHistory(self):
    logdir = self.create_tempdir().full_path
    began = time.time()
    log = progress.StepLog(logdir)
    for step in range(1, 6):
      log.Append(step, {'loss': float(step)})
    log.Close()
    with open(os.path.join(logdir, progress.STEP_LOG), 'a') as f:
      f.write('{"step": 6, "lo')  # cut short by a kill
    log = progress.StepLog(logdir, resume_step=3)
    log.Append(4, {'loss': 40.0})
    log.Close()
    records = progress.ReadStepLog(os.path.join(logdir, progress.STEP_LOG))
    self.assertEqual([(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)],
                     [(r['step'], r['loss']) for r in records])
    # Each record's wall clock (to the millisecond, rounded), in the order
    # written.
    times = [r['time'] for r in records]
    self.assertEqual(sorted(times), times)
    self.assertBetween(times[0], began - 0.001, time.time() + 0.001)
    self.assertLessEqual(times[-1], time.time() + 0.001)


if __name__ == '__main__':
  tf.test.main()
