"""Workers launched the TensorFlow way, with several devices each.

Two ``python -m gpipe.worker`` tasks read TF_CONFIG, each with 2 virtual CPU
devices standing in for a host's GPUs, started by a launcher that exits (as
ssh or a batch system would). The trainer finds their devices, lays out
R x K stages on them (``device:CPU:1`` too) and trains with the losses of
the same model in one process, in two sessions on the same workers. Bad
descriptions, unreachable tasks and servers that are not the task asked for
fail at once with the address named.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import contextlib
import io
import json
import os
import shutil
import socket
import tempfile
from unittest import mock

from gpipe.runtime import local_cluster
from gpipe.runtime import worker
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import cluster_testlib
from tests import trainer_testlib
from tools.trainer import summaries

TOY = trainer_testlib.TOY  # 4 layers, batch 32.
STEPS = 4


def _Run(**flags):
  flags.setdefault('model', TOY)
  flags.setdefault('trace_every_n_steps', 0)
  flags.setdefault('eval_after_train', False)
  flags.setdefault('max_steps', STEPS)
  return trainer_testlib.RunInProcess(**flags)


def _TfConfig(workers, index, task_type='worker'):
  return json.dumps({'cluster': {'worker': workers},
                     'task': {'type': task_type, 'index': index}})


class ClusterWorkersTest(test_utils.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    ports = [local_cluster.FreePort() for _ in range(3)]
    cls.workers = ['localhost:%d' % p for p in ports[:2]]
    cls.spec = 'worker=' + ','.join(cls.workers)
    cls.ps = 'localhost:%d' % ports[2]
    started = [dict(cmd=cluster_testlib.WorkerCommand('--cpu_devices=2'),
                    env={'TF_CONFIG': _TfConfig(cls.workers, i)},
                    address=cls.workers[i],
                    log=os.path.join(cls.tmp, 'worker_%d.log' % i))
               for i in range(2)]
    # A server of another job, with the worker binary's older flags.
    started.append(dict(
        cmd=cluster_testlib.WorkerCommand(
            '--cluster', json.dumps({'ps': [cls.ps]}), '--job', 'ps',
            '--task', '0'),
        env={}, address=cls.ps, log=os.path.join(cls.tmp, 'ps.log')))
    cls.pids = cluster_testlib.StartDetached(started)
    # The reference: the same model and micro-batches in this process.
    cls.ref_dir = os.path.join(cls.tmp, 'reference')
    code, _, err = _Run(logdir=cls.ref_dir, num_stages=4,
                        num_micro_batches=8)
    assert code == 0, err

  @classmethod
  def tearDownClass(cls):
    trainer_testlib.Kill(cls.pids)
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def testWorkersPrintTheirAddressAndDevices(self):
    with open(os.path.join(self.tmp, 'worker_1.log')) as f:
      log = f.read()
    self.assertIn('gpipe worker worker:1 serving at grpc://%s (%s of 2 from '
                  'TF_CONFIG) devices: CPU:0, CPU:1' %
                  (self.workers[1], self.workers[1]), log)

  def testTrainsOnTwoTasksWithTwoDevicesEachInTwoSessions(self):
    # Session 1: TF_CONFIG in the trainer's environment, K=4 on 4 devices.
    logdir = self.create_tempdir().full_path
    with mock.patch.dict(os.environ,
                         {'TF_CONFIG': _TfConfig(self.workers, 0, 'chief')}):
      code, out, err = _Run(logdir=logdir, num_stages=4, num_micro_batches=8,
                            trace_every_n_steps=STEPS)
    self.assertEqual(0, code, err)
    self.assertIn('cluster from TF_CONFIG: 2 worker task(s) at %s; stages on '
                  '4 CPU device(s)' % ', '.join(self.workers), out)
    self.assertIn('  replica 0: stages 0-1 on task 0 (CPU:0, CPU:1), stages '
                  '2-3 on task 1 (CPU:0, CPU:1); 1 hand-over(s) between '
                  'tasks', out)
    # Each of the four devices ran a stage (the traced step's peak memory).
    tags = summaries.Read(logdir)
    for task in range(2):
      for cpu in range(2):
        self.assertIn('memory/peak_bytes/worker_%d_CPU_%d' % (task, cpu),
                      tags)
    self.assertAllClose(trainer_testlib.Losses(self.ref_dir),
                        trainer_testlib.Losses(logdir), rtol=1e-5)
    # Session 2, same workers: R=2 replicas x K=2 stages, one per task.
    logdir = self.create_tempdir().full_path
    code, out, err = _Run(logdir=logdir, cluster_spec=self.spec,
                          data_parallel=2, num_stages=2, num_micro_batches=4)
    self.assertEqual(0, code, err)
    self.assertIn('  replica 1: stages 0-1 on task 1 (CPU:0, CPU:1); 0 '
                  'hand-over(s) between tasks', out)
    self.assertAllClose(trainer_testlib.Losses(self.ref_dir),
                        trainer_testlib.Losses(logdir), rtol=1e-5)
    # The launcher is gone; the workers serve on.
    self.assertTrue(all(trainer_testlib.Alive(p) for p in self.pids))

  def testLocalWorkersWithSeveralDevicesEach(self):
    logdir = self.create_tempdir().full_path
    code, out, err = _Run(logdir=logdir, worker_processes=2,
                          devices_per_task=2, num_stages=4,
                          num_micro_batches=8, max_steps=2)
    self.assertEqual(0, code, err)
    self.assertIn('  replica 0: stages 0-1 on task 0 (CPU:0, CPU:1), stages '
                  '2-3 on task 1 (CPU:0, CPU:1)', out)
    self.assertAllClose(trainer_testlib.Losses(self.ref_dir)[:2],
                        trainer_testlib.Losses(logdir), rtol=1e-5)

  def testLayoutMustUseEveryDevice(self):
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec=self.spec, num_stages=2)
    self.assertEqual(1, code)
    self.assertIn('1 replica(s) x 2 device(s) each (2 stages, one stage per '
                  'device) = 2 devices, but 4 device(s) are there (2 task(s) '
                  'x 2 CPU)', err)
    # Fewer devices per task fit it.
    code, out, err = _Run(logdir=self.create_tempdir().full_path,
                          cluster_spec=self.spec, num_stages=2,
                          devices_per_task=1, max_steps=1)
    self.assertEqual(0, code, err)
    self.assertIn('stage 0 on task 0 (CPU:0), stage 1 on task 1 (CPU:0)', out)

  def testUnreachableTaskIsNamed(self):
    free = 'localhost:%d' % local_cluster.FreePort()
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec='worker=%s,%s' % (self.workers[0], free))
    self.assertEqual(1, code)
    self.assertIn('worker task 1 (%s) from --cluster_spec does not answer '
                  '(cannot connect: Connection refused)' % free, err)
    self.assertIn('python -m gpipe.worker --cluster_spec=worker=%s,%s '
                  '--task=1' % (self.workers[0], free), err)

  def testServersOfOtherTasksOrJobsAreNamed(self):
    swapped = 'worker=%s,%s' % (self.workers[1], self.workers[0])
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec=swapped)
    self.assertEqual(1, code)
    self.assertIn('the server at %s is not worker task 0 (%s) from '
                  '--cluster_spec: it serves /job:worker/replica:0/task:1' %
                  (self.workers[1], self.workers[1]), err)
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec='worker=%s' % self.ps)
    self.assertEqual(1, code)
    self.assertIn('it serves /job:ps/replica:0/task:0', err)
    # One task of the two: worker 0 knows a cluster of two.
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec='worker=%s' % self.workers[0])
    self.assertEqual(1, code)
    self.assertIn('serves a cluster with worker tasks [0, 1], but '
                  '--cluster_spec lists 1', err)

  def testSomethingElseListeningIsNamed(self):
    with socket.socket() as listener:
      listener.bind(('localhost', 0))
      listener.listen(4)
      address = 'localhost:%d' % listener.getsockname()[1]
      code, _, err = _Run(logdir=self.create_tempdir().full_path,
                          cluster_spec='worker=%s' % address,
                          connect_timeout_secs=2)
    self.assertEqual(1, code)
    self.assertIn('worker task 0 (%s) from --cluster_spec does not answer '
                  '(accepts connections, but no TensorFlow server answered '
                  'within 2 s: is something else listening there?)' % address,
                  err)

  def testBadDescriptionsAreRefusedByTrainerAndWorker(self):
    code, _, err = _Run(logdir=self.create_tempdir().full_path,
                        cluster_spec='worker=localhost')
    self.assertEqual(1, code)
    self.assertIn("'localhost' is not host:port", err)
    # The worker's main (python -m gpipe.worker exits with what it returns)
    # in this process: a worker process would spend seconds importing
    # TensorFlow to print one line.
    for tf_config, message in (
        (_TfConfig(self.workers, 0, 'chief'), "task type 'chief'"),
        (_TfConfig(self.workers, 2), 'task index 2 is out of range: the '
         'cluster has 2 worker task(s)'),
        ('{"cluster": ', 'TF_CONFIG is not valid JSON')):
      stderr = io.StringIO()
      with mock.patch.dict(os.environ, {'TF_CONFIG': tf_config}), \
          contextlib.redirect_stderr(stderr):
        code = worker.main([])
      self.assertEqual(2, code, stderr.getvalue())
      self.assertIn('gpipe.worker: error: ', stderr.getvalue())
      self.assertIn(message, stderr.getvalue())

  def testSlurmWorkerExitsWithItsParentOnlyWhenAsked(self):
    # Task 0 of a one-task srun step on this host.
    port = local_cluster.FreePort()
    slurm = {'SLURM_PROCID': '0', 'SLURM_STEP_NUM_TASKS': '1',
             'SLURM_STEP_NODELIST': 'localhost',
             'SLURM_STEP_TASKS_PER_NODE': '1'}
    log = os.path.join(self.tmp, 'slurm.log')
    pid, = cluster_testlib.StartDetached([dict(
        cmd=cluster_testlib.WorkerCommand('--slurm_port_base=%d' % port,
                                          '--exit_with_parent'),
        env=slurm, address='localhost:%d' % port, log=log)])
    # Its parent, the launcher, has exited: so does the worker (the TF_CONFIG
    # workers, started without --exit_with_parent, serve on).
    trainer_testlib.WaitGone(pid, 'its launcher has exited')
    with open(log) as f:
      self.assertIn('gpipe worker worker:0 serving at grpc://localhost:%d '
                    '(localhost:%d of 1 from Slurm)' % (port, port), f.read())


if __name__ == '__main__':
  tf.test.main()
