"""Cluster descriptions: worker=h:p, JSON, TF_CONFIG and Slurm, and errors."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import json
import os

from absl.testing import absltest
from gpipe.runtime import cluster_spec
from tools.trainer import placement

WORKERS = ['10.0.0.1:2222', '10.0.0.2:2222']


def _TfConfig(task_type='worker', index=1, workers=WORKERS, **cluster):
  cluster = dict(cluster, worker=workers)
  return json.dumps({'cluster': cluster,
                     'task': {'type': task_type, 'index': index}})


class ParseTest(absltest.TestCase):

  def testEveryFormGivesTheSameWorkers(self):
    for text in ('worker=10.0.0.1:2222,10.0.0.2:2222',
                 ' worker = 10.0.0.1:2222 , 10.0.0.2:2222 ',
                 json.dumps({'worker': WORKERS}),
                 _TfConfig(index=1)):
      description = cluster_spec.Parse(text)
      self.assertEqual(tuple(WORKERS), description.workers, text)
      self.assertEqual('worker=10.0.0.1:2222,10.0.0.2:2222',
                       description.Spec())
      self.assertEqual('grpc://10.0.0.1:2222', description.Target())
    self.assertEqual(1, cluster_spec.Parse(_TfConfig(index=1)).task)
    self.assertIsNone(cluster_spec.Parse('worker=h:1').task)

  def testAFileHoldsAnyFormAndIsReadAgain(self):
    path = os.path.join(self.create_tempdir().full_path, 'cluster.json')
    for text in (json.dumps({'worker': WORKERS}), _TfConfig(index=0),
                 'worker=10.0.0.1:2222,10.0.0.2:2222\n'):
      with open(path, 'w') as f:
        f.write(text)
      self.assertEqual(tuple(WORKERS),
                       cluster_spec.Parse('@' + path).workers)
    self.assertEqual(path, cluster_spec.SpecFile(' @' + path))
    self.assertIsNone(cluster_spec.SpecFile('worker=a:1'))
    with open(path, 'w') as f:
      f.write('{"worker": ["a:1", "b"]}')
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                r"--cluster_spec=@%s \(job 'worker'\): 'b' "
                                r'is not host:port' % path):
      cluster_spec.Parse('@' + path)
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                r'--cluster_spec=@/no/such: cannot read the '
                                r'file \(No such file or directory\)'):
      cluster_spec.Parse('@/no/such')

  def testOtherJobsAreKeptApartFromTheWorkers(self):
    description = cluster_spec.Parse('worker=a:1,b:1@ps=c:1')
    self.assertEqual(('a:1', 'b:1'), description.workers)
    self.assertEqual({'worker': ['a:1', 'b:1']}, description.Dict())
    self.assertEqual((('ps', ('c:1',)),), description.other_jobs)
    # A chief task's TF_CONFIG: the cluster's workers, no worker index.
    chief = cluster_spec.Parse(_TfConfig('chief', 0, chief=['c:1']))
    self.assertEqual(tuple(WORKERS), chief.workers)
    self.assertIsNone(chief.task)

  def testIPv6AndTaskDictAddresses(self):
    self.assertEqual(('[::1]:2222',),
                     cluster_spec.Parse('worker=[::1]:2222').workers)
    self.assertEqual(('b:1', 'a:1'), cluster_spec.Parse(
        json.dumps({'worker': {'1': 'a:1', '0': 'b:1'}})).workers)

  def testBadDescriptionsSayWhatAndShowAnExample(self):
    cases = {
        'worker=h1': "'h1' is not host:port",
        'worker=h1:port': "'h1:port' is not host:port",
        'worker=h1:70000': "'h1:70000' is not host:port",
        'worker=': "job 'worker' lists no host:port",
        'ps=h1:1': "needs a 'worker' job",
        'h1:1,h2:2': 'expected job=host:port',
        '{"worker": ["h1:1",': 'is not valid JSON',
        '{"ps": ["h1:1"]}': "needs a 'worker' job",
        '{"worker": []}': "job 'worker' needs a non-empty list",
        '{"worker": "h1:1"}': "job 'worker' needs a non-empty list",
        'worker=h1:1,h1:1': 'worker tasks 0 and 1 have the same address '
                            'h1:1',
        '': 'is empty',
    }
    for text, message in cases.items():
      with self.assertRaises(cluster_spec.ClusterSpecError) as ctx:
        cluster_spec.Parse(text)
      self.assertIn(message, str(ctx.exception), text)
      if text:
        self.assertIn("e.g. 'worker=10.0.0.1:2222,10.0.0.2:2222'",
                      str(ctx.exception), text)

  def testTrainerSyntaxIsTheSame(self):
    self.assertEqual({'worker': ['h1:2222', 'h2:2222']},
                     placement.ParseClusterSpec('worker=h1:2222,h2:2222'))
    with self.assertRaisesRegex(ValueError, 'host:port'):
      placement.ParseClusterSpec('worker=h1')

  def testDeviceNames(self):
    self.assertEqual('/job:worker/replica:0/task:1/device:GPU:3',
                     cluster_spec.DeviceName(1, 'gpu', 3))
    self.assertEqual('/job:worker/replica:0/task:0/device:CPU:0',
                     cluster_spec.DeviceName(0))


class ResolveTest(absltest.TestCase):

  def testFlagThenTfConfigThenSlurmThenNothing(self):
    env = {'TF_CONFIG': _TfConfig(index=0)}
    self.assertEqual(('h:1',), cluster_spec.Resolve('worker=h:1', 0,
                                                    environ=env).workers)
    from_env = cluster_spec.Resolve('', environ=env, require_worker=True)
    self.assertEqual((tuple(WORKERS), 0, 'TF_CONFIG'),
                     (from_env.workers, from_env.task, from_env.source))
    # --task overrides TF_CONFIG's index.
    self.assertEqual(1, cluster_spec.Resolve('', 1, environ=env).task)
    self.assertIsNone(cluster_spec.Resolve('', environ={}))

  def testAWorkerMustKnowWhichTaskItIs(self):
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                r'does not say which worker.*--task=i '
                                r'\(0\.\.1\)'):
      cluster_spec.Resolve('worker=a:1,b:1', environ={}, require_worker=True)
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                "task type 'ps'.*not gpipe workers"):
      cluster_spec.Resolve('', environ={'TF_CONFIG': _TfConfig('ps', 0)},
                           require_worker=True)
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                'task index 2 is out of range: the cluster '
                                r'has 2 worker task\(s\), indices 0..1'):
      cluster_spec.Resolve('', environ={'TF_CONFIG': _TfConfig(index=2)},
                           require_worker=True)
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                'task index 5 is out of range'):
      cluster_spec.Resolve('worker=a:1', 5, environ={})
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                'cluster dict without a "task"'):
      cluster_spec.Resolve('{"worker": ["a:1"]}', environ={},
                           require_worker=True)

  def testSlurmStepThroughTensorFlowsResolver(self):
    # What srun sets for task 3 of 4 on two nodes, two tasks per node.
    slurm = {
        'SLURM_PROCID': '3',
        'SLURM_STEP_NUM_TASKS': '4',
        'SLURM_STEP_NODELIST': 'node[07-08]',
        'SLURM_STEP_TASKS_PER_NODE': '2(x2)',
    }
    self.assertFalse(cluster_spec.InSlurmStep({}))
    self.assertTrue(cluster_spec.InSlurmStep(slurm))
    before = dict(os.environ)
    description = cluster_spec.Resolve('', environ=slurm, port_base=9000,
                                        require_worker=True)
    self.assertEqual(before, dict(os.environ))
    self.assertEqual(('node07:9000', 'node07:9001', 'node08:9000',
                      'node08:9001'), description.workers)
    self.assertEqual((3, 'Slurm'), (description.task, description.source))
    # Not used unless asked (the trainer is not a task of the step).
    self.assertIsNone(cluster_spec.Resolve('', environ=slurm, slurm=False))
    with self.assertRaisesRegex(cluster_spec.ClusterSpecError,
                                'no Slurm job step'):
      cluster_spec.FromSlurm(environ={})

  def testSlurmTaskIsItsOwnNodeWhenNamesSortOtherwise(self):
    # Slurm ranks follow the node list (node9, then node10); TensorFlow's
    # resolver sorts the hosts by name (node10 first). Each worker must be
    # the task at its own node's address.
    for rank, node in ((0, 'node9'), (1, 'node10')):
      slurm = {
          'SLURM_PROCID': str(rank), 'SLURM_STEP_NUM_TASKS': '2',
          'SLURM_STEP_NODELIST': 'node[9-10]',
          'SLURM_STEP_TASKS_PER_NODE': '1(x2)', 'SLURMD_NODENAME': node,
          'SLURM_LOCALID': '0',
      }
      description = cluster_spec.Resolve('', environ=slurm, port_base=9000,
                                          require_worker=True)
      self.assertEqual(description.workers[description.task],
                       '%s:9000' % node)

  def testTfConfigWithoutAWorkerJobIsNotACluster(self):
    chief_only = json.dumps({'cluster': {'chief': ['h:1']},
                             'task': {'type': 'chief', 'index': 0}})
    self.assertIsNone(cluster_spec.Resolve('', environ={'TF_CONFIG':
                                                        chief_only}))


if __name__ == '__main__':
  absltest.main()
