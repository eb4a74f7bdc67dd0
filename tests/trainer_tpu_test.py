"""--device_type=tpu stops at once, saying what is missing (docs/TPU.md).

Stages on TPU cores are not built, so every --device_type=tpu run stops
before it starts workers or builds a graph: with exit status 1, one line
without a traceback that says what TPUs it found (none in this process, none
at a cluster's worker, or N cores), that running stages on them is not
built, and what runs instead.
"""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import os
import shutil
import tempfile
import time

from absl.testing import absltest
from gpipe.runtime import cluster_spec as cluster_spec_lib
from gpipe.runtime import devices
from gpipe.runtime import local_cluster
from lingvo import compat as tf
from tests import trainer_testlib

# What every refusal says after what it found.
NOT_BUILT = ('running stages on TPU cores is not built yet: the library '
             'neither initializes a TPU system (tpu.initialize_system) nor '
             'compiles the training step into a TPU computation')
INSTEAD = 'What runs today: --device_type=gpu on hosts with GPUs'


class TrainerTpuTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.logdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.logdir, ignore_errors=True)

  def _Run(self, **flags):
    start = time.time()
    code, out, err = trainer_testlib.RunInProcess(
        model=trainer_testlib.TOY, logdir=self.logdir, device_type='tpu',
        **flags)
    return code, out, err, time.time() - start

  def testTheBinaryStopsWithOneLineAndStatusOne(self):
    proc = trainer_testlib.Run(
        ['--model=%s' % trainer_testlib.TOY, '--logdir=%s' % self.logdir,
         '--device_type=tpu'], timeout=120)
    self.assertEqual(1, proc.returncode, proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)
    errors = [l for l in proc.stderr.splitlines()
              if l.startswith('trainer: error:')]
    self.assertLen(errors, 1, proc.stderr)
    self.assertIn(
        "trainer: error: --device_type=tpu: no TPU system found: this "
        "process lists no TPU device (tf.config.list_physical_devices('TPU') "
        'is empty), and no --cluster_spec or TF_CONFIG names the worker of a '
        'TPU host; and even with TPU cores, ' + NOT_BUILT, errors[0])
    self.assertIn('docs/TPU.md', errors[0])
    self.assertIn(INSTEAD, errors[0])
    # Nothing ran: no step, no checkpoint.
    self.assertEqual('', proc.stdout)
    self.assertEqual([], os.listdir(self.logdir))

  def testLocalWorkerProcessesAreNotStarted(self):
    code, out, err, secs = self._Run(worker_processes=2)
    self.assertEqual(1, code)
    self.assertEqual('', out)
    self.assertIn('--device_type=tpu: --worker_processes=2 starts local '
                  'worker processes, whose devices are CPUs; and even with '
                  'TPU cores, ' + NOT_BUILT, err)
    self.assertFalse(os.path.exists(os.path.join(self.logdir, 'workers')))
    self.assertLess(secs, 30)

  def testInspectModelWithoutAClusterIsRefusedToo(self):
    # inspect_model plans no placement without workers or a cluster: it
    # must not print a CPU layout for a TPU run.
    code, out, err, _ = self._Run(mode='inspect_model')
    self.assertEqual(1, code, out + err)
    self.assertIn('--device_type=tpu: no TPU system found', err)
    self.assertNotIn('Traceback', err)

  def testAClusterWithoutTpusIsNamed(self):
    # A worker server of this process: it lists only its CPU.
    address = 'localhost:%d' % local_cluster.FreePort()
    tf.distribute.Server(
        tf.train.ClusterSpec({cluster_spec_lib.JOB: [address]}),
        job_name=cluster_spec_lib.JOB, task_index=0, start=True)
    code, out, err, secs = self._Run(cluster_spec='worker=' + address)
    self.assertEqual(1, code)
    self.assertEqual('', out)
    self.assertIn(
        '--device_type=tpu: no TPU system found: worker task(s) [0] of '
        '--cluster_spec list no TPU device (worker task 0 (%s) lists CPU:0); '
        'and even with TPU cores, %s' % (address, NOT_BUILT), err)
    self.assertNotIn('Traceback', err)
    self.assertLess(secs, 30)
    # Planning for it without contacting it says so too.
    code, _, err, _ = self._Run(cluster_spec='worker=' + address,
                                devices_per_task=8, mode='inspect_model')
    self.assertEqual(1, code)
    self.assertIn('--device_type=tpu: planning for worker=%s (not '
                  'contacted: --devices_per_task); and even with TPU cores, '
                  % address, err)

  def testTpuCoresFoundAreStillRefused(self):
    # What a cluster of TPU hosts would be told (no TPU here to list them).
    task_devices = [
        [cluster_spec_lib.DeviceName(t, 'CPU', 0)] +
        [cluster_spec_lib.DeviceName(t, 'TPU', i) for i in range(4)]
        for t in range(2)]
    found, has_tpus = devices.TpuFound(task_devices)
    self.assertTrue(has_tpus)
    error = devices.TpuNotBuilt(found, has_tpus)
    self.assertIsInstance(error, ValueError)
    self.assertEqual(
        '--device_type=tpu: the cluster lists 8 TPU core(s) (2 task(s) x 4 '
        'TPU), but ' + NOT_BUILT, str(error)[:len(
            '--device_type=tpu: the cluster lists 8 TPU core(s) (2 task(s) x '
            '4 TPU), but ' + NOT_BUILT)])
    # One task without: that task is named.
    found, has_tpus = devices.TpuFound([task_devices[0], task_devices[1][:1]])
    self.assertFalse(has_tpus)
    self.assertEqual('no TPU system found: worker task(s) [1] list no TPU '
                     'device (worker task 1 lists CPU:0)', found)


if __name__ == '__main__':
  absltest.main()
