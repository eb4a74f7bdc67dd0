"""--plan's devices: those the trainer's placement lays the stages on.

The count --plan=auto gives the planner and the check of a saved plan
(--plan=FILE, or a logdir's plan.json on resume), for each way of giving
devices: --worker_processes, a JSON --cluster_spec, TF_CONFIG in the
environment, a running cluster asked for its devices. No measurement runs
(the planner's takes minutes): the planner is stubbed where it would start,
and a plan for another count is refused before any worker starts. Also: a
missing plan file and a cap below the weights, as a new user meets them.
"""

import json
import os
import tempfile
from unittest import mock

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl.testing import absltest
from gpipe.plan import choice
from gpipe.plan import simulator
from gpipe.runtime import devices as devices_lib
from tests import trainer_testlib
from tools.trainer import planned

TOY = trainer_testlib.TOY


def _TfConfig(num_tasks):
  """TF_CONFIG JSON of `num_tasks` workers (nothing listens there)."""
  return json.dumps({
      'cluster': {'worker': ['localhost:%d' % (2220 + t)
                             for t in range(num_tasks)]},
      'task': {'type': 'worker', 'index': 0}})


def _SavePlan(replicas=1, num_stages=2):
  """A toy plan for R x K devices (one stage per device); its path."""
  sizes = {1: (4,), 2: (1, 3), 4: (1, 1, 1, 1)}[num_stages]
  plan = choice.Plan(
      model=TOY, config=simulator.Configuration(
          replicas=replicas, num_stages=num_stages, stage_sizes=sizes,
          micro_batches=4, schedule='gpipe', remat='never'),
      task_costs=None, num_devices=replicas * num_stages,
      memory_per_device=None,
      predicted=dict(step_seconds=0.01, examples_per_second=3200.0,
                     bubble=0.1, peak_bytes=[1.0] * num_stages))
  path = os.path.join(tempfile.mkdtemp(), 'toy_plan.json')
  choice.Save(plan, path)
  return path


class RunDevicesTest(absltest.TestCase):

  def testTheDevicesThePlacementLaysOut(self):
    got = planned.RunDevices(worker_processes=2)
    self.assertEqual(got, (2, '2 task(s) x 1 CPU', True))
    # Each local worker's virtual CPUs.
    self.assertEqual(planned.RunDevices(worker_processes=2,
                                        devices_per_task=2).count, 4)
    # TF_CONFIG's JSON given as the flag: its tasks, not its commas.
    self.assertEqual(planned.RunDevices(cluster_spec=_TfConfig(2),
                                        devices_per_task=1).count, 2)
    self.assertEqual(planned.RunDevices(
        cluster_spec='{"worker": ["a:1", "b:1", "c:1"]}',
        devices_per_task=2).count, 6)
    self.assertEqual(planned.RunDevices(
        cluster_spec='worker=a:1,b:1', devices_per_task=4).count, 8)
    # TF_CONFIG in the environment: its tasks, not this machine's cores.
    got = planned.RunDevices(environ={'TF_CONFIG': _TfConfig(3)},
                             devices_per_task=1)
    self.assertEqual(got, (3, '3 task(s) x 1 CPU', True))
    # Nothing described: virtual CPUs of the trainer, made to fit a plan.
    got = planned.RunDevices(environ={})
    self.assertEqual((got.count, got.laid_out), (os.cpu_count(), False))

  def testARunningClusterIsAskedForEachTasksDevices(self):
    def Found(task):
      return ['/job:worker/replica:0/task:%d/device:%s' % (task, d)
              for d in ('CPU:0', 'GPU:0', 'GPU:1')]
    with mock.patch.object(devices_lib, 'Discover',
                           return_value=[Found(0), Found(1)]) as discover:
      got = planned.RunDevices(cluster_spec='worker=a:1,b:1')
      self.assertEqual(got, (4, '2 task(s) x 2 GPU', True))
      self.assertEqual(planned.RunDevices(
          cluster_spec='worker=a:1,b:1', device_type='cpu').count, 2)
    self.assertEqual(discover.call_count, 2)


class TrainerPlanDevicesTest(absltest.TestCase):

  def _Auto(self, environ=None, **flags):
    """The device count --plan=auto gives the planner (stubbed)."""
    counts = []

    def Planner(model, override, devices, memory, logdir, echo):
      del model, override, memory, logdir, echo
      counts.append(devices)
      raise planned.PlanError('the test stops here')

    with mock.patch.object(planned, '_RunPlanner', Planner), \
        mock.patch.dict(os.environ, environ or {}):
      code, _, err = trainer_testlib.RunInProcess(
          model=TOY, logdir=tempfile.mkdtemp(), plan='auto', **flags)
    self.assertEqual(code, 1)
    self.assertIn('the test stops here', err)
    return counts[0]

  def testAutoPlansForTheDevicesOfTheRun(self):
    self.assertEqual(self._Auto(worker_processes=2, devices_per_task=2), 4)
    self.assertEqual(self._Auto(cluster_spec=_TfConfig(2),
                                devices_per_task=1), 2)
    self.assertEqual(self._Auto(environ={'TF_CONFIG': _TfConfig(3)},
                                devices_per_task=1), 3)
    with mock.patch.object(devices_lib, 'Discover', return_value=[
        ['/job:worker/replica:0/task:%d/device:CPU:%d' % (t, i)
         for i in range(3)] for t in range(2)]):
      self.assertEqual(self._Auto(cluster_spec='worker=a:1,b:1'), 6)

  def _Refused(self, plan, environ=None, logdir=None, **flags):
    """The trainer's error for `plan` with `flags`; nothing may start."""
    logdir = logdir or tempfile.mkdtemp()
    with mock.patch.dict(os.environ, environ or {}):
      code, out, err = trainer_testlib.RunInProcess(
          model=TOY, logdir=logdir, plan=plan, max_steps=1, **flags)
    self.assertEqual(code, 1, out + err)
    self.assertNotIn('started', out)
    return err

  def testASavedPlanForAnotherDeviceCountIsRefused(self):
    path = _SavePlan(num_stages=2)
    logdir = tempfile.mkdtemp()
    err = self._Refused(path, logdir=logdir, worker_processes=3)
    self.assertIn(
        'trainer: error: the plan %s runs on 2 device(s) (R=1 replica(s) x '
        'D=2), but this run lays its stages on 3 (3 task(s) x 1 CPU) and '
        'uses every one: plan for 3 (python -m tools.plan --model=%s '
        '--devices=3 --plan_out=FILE, or --plan=auto), or run on 2 '
        'device(s)' % (path, TOY), err)
    # Not copied: a later --plan=auto must not resume with it.
    self.assertFalse(os.path.exists(os.path.join(logdir, 'plan.json')))
    err = self._Refused(path, cluster_spec=_TfConfig(2), devices_per_task=2)
    self.assertIn('runs on 2 device(s) (R=1 replica(s) x D=2), but this run '
                  'lays its stages on 4 (2 task(s) x 2 CPU)', err)
    err = self._Refused(_SavePlan(replicas=2, num_stages=2),
                        environ={'TF_CONFIG': _TfConfig(3)},
                        devices_per_task=1)
    self.assertIn('runs on 4 device(s) (R=2 replica(s) x D=2), but this run '
                  'lays its stages on 3 (3 task(s) x 1 CPU)', err)

  def testAResumedPlanForAnotherDeviceCountIsRefused(self):
    logdir = tempfile.mkdtemp()
    with open(_SavePlan(num_stages=2)) as f, open(
        os.path.join(logdir, 'plan.json'), 'w') as g:
      g.write(f.read())
    err = self._Refused('auto', logdir=logdir, worker_processes=4)
    self.assertIn(
        "the plan %s (this logdir's, from an earlier run) runs on 2 "
        'device(s) (R=1 replica(s) x D=2), but this run lays its stages on '
        '4 (4 task(s) x 1 CPU) and uses every one: resume on 2 device(s), '
        'as that run had, or give a new --logdir to plan for 4' %
        os.path.join(logdir, 'plan.json'), err)

  def testAMissingPlanFileIsOneLineSayingHowToWriteOne(self):
    run = trainer_testlib.Run(['--model=image.AmoebaNetD_Digits',
                               '--plan=/no/such/plan.json',
                               '--logdir=%s' % tempfile.mkdtemp()])
    self.assertEqual(run.returncode, 1, run.stderr)
    self.assertNotIn('Traceback', run.stderr)
    self.assertEqual(run.stderr.strip().splitlines(), [
        'trainer: error: --plan=/no/such/plan.json: there is no such plan '
        'file. Write one with python -m tools.plan '
        '--model=image.AmoebaNetD_Digits --devices=%d '
        '--plan_out=/no/such/plan.json (add --memory_per_device=SIZE for a '
        'cap), or plan in the run with --plan=auto' % os.cpu_count()])

  def testAutoRefusesACapBelowTheWeightsBeforeMeasuring(self):
    # The real planner, in its process: it stops after counting the
    # weights (seconds), where measuring would take a minute.
    logdir = tempfile.mkdtemp()
    code, out, err = trainer_testlib.RunInProcess(
        model=TOY, logdir=logdir, plan='auto', memory_per_device='1KiB',
        worker_processes=2)
    self.assertEqual(code, 1, out + err)
    self.assertNotIn('measuring the hand-over', out)
    self.assertIn(
        'trainer: error: --plan=auto: the planner stopped: '
        '--memory_per_device=1.0 KiB (972 B after the 5% headroom) cannot '
        'hold the weights and optimizer slots alone: they need at least '
        '76.9 KiB (78780 bytes) on a device', err)
    self.assertFalse(os.path.exists(os.path.join(logdir, 'plan.json')))


if __name__ == '__main__':
  absltest.main()
