"""The trainer's --plan: auto (measure, search, train the best) and FILE."""

import contextlib
import json
import os
import re
import statistics
import subprocess
import tempfile
from unittest import mock

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe.plan import choice
from lingvo import compat as tf
from tests import trainer_testlib
from tools.trainer import planned
from tools.trainer import summaries
from tools.trainer import train_loop

TOY = trainer_testlib.TOY


def _Pipeline(text):
  """(K, M, schedule, remat) the trainer printed for its pipeline."""
  m = re.search(r'pipeline \S+: (\d+) stages, (\d+) micro-batches, schedule '
                r'(\w+), remat=(\w+)', text)
  assert m, text[-3000:]
  return int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)


# The planner's measuring, made quick: one micro-batch size, one timed run
# each, calibrated on the first layer, the trainer's own step not timed.
QUICK_MEASURING = ['--rows=8', '--repeats=1', '--calibrate_layers=1',
                   '--no-trainer_step']


@contextlib.contextmanager
def _QuickMeasuring():
  """Runs of the planner (``python -m tools.plan``) measure quickly.

  Yields:
    The list of the planner command lines run (as the trainer built them).
  """
  run = subprocess.run
  planners = []

  def Run(args, *a, **kw):
    if list(args[1:3]) == ['-m', 'tools.plan']:
      planners.append(list(args))
      if any(x.startswith('--profile_out=') for x in args):
        args = list(args) + QUICK_MEASURING
    return run(args, *a, **kw)

  with mock.patch.object(planned.subprocess, 'run', Run):
    yield planners


def _AssertPlanLine(test, out, logdir, steps, every):
  """The plan's 3200 examples/s beside the run's, on the console and chart.

  The console's line gives the median of the logged intervals after the
  first (the total over replicas, as the progress lines give it); the
  TensorBoard run ``planned`` the prediction at every logged step, under
  the measured one's tag.
  """
  rates = [float(r) for r in re.findall(
      r'(?m)^step \d+/%d .*?([\d.]+) examples/s' % steps, out)]
  test.assertLen(rates, steps // every, out)
  found = re.search(r'the plan predicted 3200.0 examples/s; this run from '
                    r'step 0: ([\d.]+) \(the median of %d logged intervals? '
                    r'after the first\), (?:(\d+)%% (slower|faster) than '
                    r'planned|as fast as planned)' % (len(rates) - 1), out)
  test.assertIsNotNone(found, out[-3000:])
  measured = float(found.group(1))
  test.assertAlmostEqual(measured, statistics.median(rates[1:]), delta=0.051)
  if found.group(2) is not None:
    test.assertEqual(found.group(3), 'slower' if measured < 3200 else
                     'faster')
    test.assertAlmostEqual(int(found.group(2)),
                           100 * abs(measured / 3200 - 1), delta=1)
  tags = summaries.Read(os.path.join(logdir, train_loop.PLAN_RUN))
  predicted = dict(tags['examples_per_sec'])
  test.assertEqual(sorted(predicted), list(range(every, steps + 1, every)))
  test.assertAllClose(list(predicted.values()), [3200.0] * len(predicted))
  measured_chart = dict(summaries.Read(logdir)['examples_per_sec'])
  test.assertEqual(sorted(measured_chart), sorted(predicted))


class TrainerPlanTest(tf.test.TestCase):

  def testAutoMeasuresPlansTrainsAndResumesWithTheSamePlan(self):
    # The trainer in-process; its planner in its own process as always, but
    # measuring at one size, once, calibrated on the first layer and
    # without timing the trainer's step (``_QuickMeasuring``): what the
    # planner's full measuring gives is plan_cli_test's and
    # plan_measure_test's to prove, this test proves what --plan=auto does
    # with it.
    logdir = tempfile.mkdtemp()
    flags = dict(model=TOY, logdir=logdir, plan='auto',
                 memory_per_device='64MiB', max_steps=2,
                 eval_after_train=False, trace_every_n_steps=0)
    with _QuickMeasuring() as planners:
      code, out, err = trainer_testlib.RunInProcess(**flags)
    out += err
    self.assertEqual(code, 0, out[-4000:])
    self.assertLen(planners, 1)
    self.assertIn('--profile_out=%s' % os.path.join(logdir, 'profile.json'),
                  planners[0])
    self.assertIn('configurations fit', out)
    self.assertIn('measuring the model for the planner', out)
    plan = choice.Load(os.path.join(logdir, 'plan.json'))
    self.assertTrue(os.path.exists(os.path.join(logdir, 'profile.json')))
    self.assertIn('plan: %s' % plan.Describe(), out)
    c = plan.config
    self.assertEqual(_Pipeline(out), (c.num_stages, c.micro_batches,
                                      c.schedule, c.remat))
    with open(os.path.join(logdir, 'train_steps.jsonl')) as f:
      steps = [json.loads(line)['step'] for line in f]
    self.assertEqual(steps[-1], 2)
    # A resumed run keeps its plan (no new measurement, no planner).
    flags.update(memory_per_device='64MiB', max_steps=3)
    with _QuickMeasuring() as planners:
      code, out, err = trainer_testlib.RunInProcess(**flags)
    out += err
    self.assertEqual(code, 0, out[-4000:])
    self.assertEmpty(planners)
    self.assertIn('resuming with the plan in', out)
    self.assertNotIn('measuring the model', out)
    # The plan's prediction in TensorBoard: each logged step once, the
    # resumed run's after the first's.
    predicted = summaries.Read(os.path.join(logdir, train_loop.PLAN_RUN))
    self.assertEqual([s for s, _ in predicted['examples_per_sec']], [2, 3])
    self.assertEqual(_Pipeline(out), (c.num_stages, c.micro_batches,
                                      c.schedule, c.remat))

  def testPlanFileSetsThePipelineAndRefusesHandSetShapes(self):
    logdir = tempfile.mkdtemp()
    plan = choice.Plan(
        model=TOY, config=choice.simulator.Configuration(
            replicas=1, num_stages=2, stage_sizes=(1, 3), micro_batches=4,
            schedule='zb_auto', remat='never'),
        task_costs={'F': [1.0, 3.0], 'B': [1.0, 3.0], 'W': [1.0, 3.0],
                    'handover': [0.1], 'max_in_flight': [3, 2],
                    'max_awaiting_weight': [3, 2]},
        num_devices=2, memory_per_device=None,
        predicted=dict(step_seconds=0.01, examples_per_second=3200.0,
                       bubble=0.1, peak_bytes=[1.0, 1.0]))
    path = os.path.join(tempfile.mkdtemp(), 'toy_plan.json')
    choice.Save(plan, path)
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, plan=path, num_stages=2)
    self.assertEqual(code, 1)
    self.assertIn('--plan sets', err)
    self.assertIn('drop --num_stages', err)
    code, out, err = trainer_testlib.RunInProcess(
        model='image.AmoebaNetD_Digits', logdir=tempfile.mkdtemp(),
        plan=path)
    self.assertEqual(code, 1)
    self.assertIn('is for %s, not image.AmoebaNetD_Digits' % TOY, err)
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=tempfile.mkdtemp(), memory_per_device='1GiB')
    self.assertEqual(code, 1)
    self.assertIn('--memory_per_device is for --plan=auto', err)
    # The plan's times are of uncompiled stages: not with --xla.
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=tempfile.mkdtemp(), plan=path, xla=True)
    self.assertEqual(code, 1)
    self.assertIn("--plan chooses from uncompiled stages' measured times, "
                  'which --xla changes', err)
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, plan=path, max_steps=8, log_every_n_steps=2,
        eval_after_train=False, trace_every_n_steps=0)
    self.assertEqual(code, 0, err[-3000:])
    self.assertEqual(_Pipeline(out), (2, 4, 'zb_auto', 'never'))
    _AssertPlanLine(self, out, logdir, 8, 2)
    # The plan's cut: one layer in stage 0, three in stage 1.
    self.assertRegex(out, r'(?m)^\s+0 \|\s+1 \| dense0 \.\. dense0 \|')
    self.assertRegex(out, r'(?m)^\s+1 \|\s+3 \| dense1 \.\. dense3 \|')
    self.assertTrue(os.path.exists(os.path.join(logdir, 'plan.json')))

  def testPlanFileOnLocalWorkersWithTwoDevicesEach(self):
    # A plan for the 4 devices of 2 worker processes x 2 CPUs: 2 replicas of
    # interleaved 1F1B, 4 stages round-robin over 2 devices each.
    plan = choice.Plan(
        model=TOY, config=choice.simulator.Configuration(
            replicas=2, num_stages=4, stage_sizes=(1, 1, 1, 1),
            micro_batches=2, schedule='interleaved_1f1b', remat='never',
            stages_per_device=2),
        task_costs=None, num_devices=4, memory_per_device=None,
        predicted=dict(step_seconds=0.01, examples_per_second=3200.0,
                       bubble=0.1, peak_bytes=[1.0] * 4))
    path = os.path.join(tempfile.mkdtemp(), 'toy_plan.json')
    choice.Save(plan, path)
    logdir = tempfile.mkdtemp()
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, plan=path, worker_processes=2,
        devices_per_task=2, max_steps=4, log_every_n_steps=1,
        eval_after_train=False, trace_every_n_steps=0)
    self.assertEqual(code, 0, (out + err)[-3000:])
    # Two replicas: the prediction and the line are of the total examples/s.
    self.assertRegex(out, r'step 2/4 .* examples/s \([\d.]+ per replica x 2\)')
    _AssertPlanLine(self, out, logdir, 4, 1)
    self.assertEqual(_Pipeline(out), (4, 2, 'interleaved_1f1b', 'never'))
    self.assertIn('layout: 2 replica(s) x 4 stages on 4 devices (2 task(s) '
                  'x 2 CPU)', out)
    self.assertIn('replica 1: stages 0-3 on task 1 (CPU:0, CPU:1, CPU:0, '
                  'CPU:1)', out)


if __name__ == '__main__':
  tf.test.main()
