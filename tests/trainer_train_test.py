"""The trainer in one process: summaries, eval/decode, and its errors."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import glob
import json
import os
import re
import subprocess

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import summaries
from tools.trainer import train_loop

TOY = trainer_testlib.TOY
RunInProcess = trainer_testlib.RunInProcess


def _Files(logdir):
  """{relative path: bytes} of every file under logdir."""
  out = {}
  for path in glob.glob(os.path.join(logdir, '**'), recursive=True):
    if os.path.isfile(path):
      with open(path, 'rb') as f:
        out[os.path.relpath(path, logdir)] = f.read()
  return out


class TrainerTrainTest(test_utils.TestCase):

  def testTrainEvalDecodeAndSummaries(self):
    logdir = self.create_tempdir().full_path
    code, out, err = RunInProcess(
        model=TOY, logdir=logdir, max_steps=6, checkpoint_every_n_steps=3,
        log_every_n_steps=2, trace_every_n_steps=3)
    self.assertEqual(0, code, err)
    # Console: one progress line per interval, checkpoints, final accuracy.
    lines = re.findall(
        r'^step (\d+)/6  loss ([\d.]+)  accuracy [\d.]+  lr [\d.e-]+  '
        r'([\d.]+) examples/s  ETA \w+$', out, re.M)
    self.assertEqual(['2', '4', '6'], [step for step, _, _ in lines])
    self.assertIn('saved %s/ckpt-3' % logdir, out)
    self.assertIn('saved %s/ckpt-6' % logdir, out)
    accuracy = float(
        re.search(r'final test accuracy: ([\d.]+) \(step 6, 360 test examples',
                  out).group(1))
    self.assertBetween(accuracy, 0.0, 1.0)
    self.assertIn('TensorBoard: .venv/bin/tensorboard --logdir %s' % logdir,
                  out)
    # Every step's metrics in the step log.
    records = trainer_testlib.StepLog(logdir)
    self.assertEqual(list(range(1, 7)), [r['step'] for r in records])
    self.assertTrue(all(np.isfinite(r['loss']) for r in records))

    # TensorBoard event files, read back.
    tags = summaries.Read(logdir)
    self.assertEqual([2, 4, 6], [s for s, _ in tags['loss']])
    for step, loss in tags['loss']:
      self.assertNear(records[step - 1]['loss'], loss, 1e-6)
    self.assertTrue(all(0 <= v <= 1 for _, v in tags['accuracy']))
    self.assertTrue(all(0 < v <= 0.01 for _, v in tags['learning_rate']))
    self.assertTrue(all(v > 0 for _, v in tags['examples_per_sec']))
    # Traced steps: the 2nd step of the run and every 3rd.
    self.assertEqual([2, 3, 6],
                     [s for s, _ in tags['pipeline/bubble_fraction']])
    for k in range(2):
      for _, v in tags['pipeline/stage_%d/compute_sec' % k]:
        self.assertGreater(v, 0)
      for _, v in tags['pipeline/stage_%d/bubble_fraction' % k]:
        # Measured on a shared machine: any fraction of the span.
        self.assertTrue(0.0 <= v < 1.0, v)
    memory = [t for t in tags if t.startswith('memory/peak_bytes/')]
    self.assertLen(memory, 2)  # One per stage device.
    for tag in memory:
      self.assertTrue(all(v > 1000 for _, v in tags[tag]))
    for _, png in tags['pipeline/timeline']:
      self.assertEqual(b'\x89PNG', png[:4])
    # The same timelines as trace files (Perfetto, chrome://tracing): one
    # complete event per stage task, 2 stages x 4 micro-batches x (F, B).
    for step in (2, 3, 6):
      with open(train_loop.TracePath(logdir, step)) as f:
        trace = json.load(f)
      tasks = [e for e in trace['traceEvents']
               if e['ph'] == 'X' and e['name'] != 'recompute']
      self.assertLen(tasks, 16)
      self.assertEqual({'F', 'B'}, {e['args']['phase'] for e in tasks})
    eval_tags = summaries.Read(os.path.join(logdir, 'eval_test'))
    self.assertEqual([(6, accuracy)],
                     [(s, round(v, 4)) for s, v in eval_tags['accuracy']])

    # Eval and decode modes on the newest checkpoint agree on accuracy.
    code, out, err = RunInProcess(model=TOY, logdir=logdir, mode='eval')
    self.assertEqual(0, code, err)
    self.assertIn('eval Test at step 6 (ckpt-6, 360 examples)', out)
    code, out, err = RunInProcess(model=TOY, logdir=logdir, mode='decode')
    self.assertEqual(0, code, err)
    decoded = float(re.search(r'decode Test at step 6 \(9 batches\): '
                              r'accuracy ([\d.]+)', out).group(1))
    self.assertNear(accuracy, decoded, 1e-4)
    outputs = glob.glob(os.path.join(logdir, 'decode_test', 'decode_out_6.txt'))
    with open(outputs[0]) as f:
      self.assertLen(f.readlines(), 360)

    # train_and_eval resumes and evaluates after each checkpoint.
    code, out, err = RunInProcess(
        model=TOY, logdir=logdir, mode='train_and_eval', max_steps=8,
        checkpoint_every_n_steps=4, trace_every_n_steps=0)
    self.assertEqual(0, code, err)
    self.assertIn('resumed from %s/ckpt-6 at step 6' % logdir, out)
    self.assertIn('eval Test at step 8 (ckpt-8, 360 examples)', out)

  def testScheduleFlagRunsTheSameTrainingWithWTasks(self):
    losses = {}
    for schedule in ('gpipe', 'zb_h1'):
      logdir = self.create_tempdir().full_path
      code, out, err = RunInProcess(
          model=TOY, logdir=logdir, max_steps=3, schedule=schedule,
          log_every_n_steps=1, trace_every_n_steps=3, eval_after_train=False)
      self.assertEqual(0, code, err)
      self.assertIn('schedule %s' % schedule, out)
      losses[schedule] = [
          loss for _, loss in trainer_testlib.Losses(logdir)]
      with open(train_loop.TracePath(logdir, 3)) as f:
        phases = {e['args']['phase'] for e in json.load(f)['traceEvents']
                  if e['ph'] == 'X' and e['name'] != 'recompute'}
      self.assertEqual(phases, {'F', 'B', 'W'} if schedule == 'zb_h1' else
                       {'F', 'B'})
      tags = summaries.Read(logdir)
      self.assertIn('pipeline/bubble_fraction', tags)
    # The same updates: only the order of the tasks differs.
    self.assertAllClose(losses['gpipe'], losses['zb_h1'], rtol=1e-5)

  def testNonFiniteLossStopsAndKeepsLastGoodCheckpoint(self):
    for check_numerics in (True, False):
      logdir = self.create_tempdir().full_path
      code, out, err = RunInProcess(
          model=TOY, logdir=logdir, max_steps=10, checkpoint_every_n_steps=1,
          log_every_n_steps=1, trace_every_n_steps=0,
          model_params_override='task.train.learning_rate=1e15',
          enable_check_numerics=check_numerics)
      self.assertEqual(1, code, out)
      # Lingvo's gradient check or the trainer's loss check stops step 2.
      self.assertRegex(
          err, r'trainer: error: (the loss is (nan|inf)|a NaN or Inf appeared)'
          r' at step 2')
      self.assertIn('the last good checkpoint is %s/ckpt-1' % logdir, err)
      self.assertEqual(os.path.join(logdir, 'ckpt-1'),
                       tf.train.latest_checkpoint(logdir))
      self.assertEmpty(glob.glob(os.path.join(logdir, 'ckpt-2*')))

  def testCheckpointOfAnotherModelIsReportedAndLeftUntouched(self):
    logdir = self.create_tempdir().full_path
    with tf.Graph().as_default():
      tf.compat.v1.train.get_or_create_global_step()
      tf.compat.v1.get_variable('toy/network/dense0/w/var', [3, 3])
      tf.compat.v1.get_variable('other/w', [2])
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, os.path.join(logdir, 'ckpt'),
                                        global_step=5)
    before = _Files(logdir)
    code, _, err = RunInProcess(model=TOY, logdir=logdir, max_steps=7)
    self.assertEqual(1, code)
    self.assertIn('was written by a different model', err)
    self.assertIn('not in the checkpoint: toy/network/dense0/b/var', err)
    self.assertIn('not in this model: other/w', err)
    self.assertIn(
        'other shapes: toy/network/dense0/w/var: checkpoint [3, 3] vs model '
        '[64, 64]', err)
    self.assertIn('It was left untouched', err)
    # Nothing written, nothing changed.
    self.assertEqual(before, _Files(logdir))

  def testCorruptCheckpointIsReportedWithTheOlderOnesAndLeftUntouched(self):
    logdir = self.create_tempdir().full_path
    code, out, err = RunInProcess(
        model=TOY, logdir=logdir, max_steps=3, checkpoint_every_n_steps=1,
        log_every_n_steps=1, trace_every_n_steps=0)
    self.assertEqual(0, code, err)
    data = glob.glob(os.path.join(logdir, 'ckpt-3.data-*'))
    self.assertLen(data, 1)
    with open(data[0], 'r+b') as f:
      f.truncate(100)
    index = os.path.join(logdir, 'ckpt-3.index')
    with open(index, 'rb') as f:
      good_index = f.read()
    for damage in ('truncated data', 'garbage index'):
      if damage == 'garbage index':
        with open(index, 'wb') as f:
          f.write(b'not a checkpoint index')
      before = _Files(logdir)
      for mode in ('train', 'eval'):
        code, _, err = RunInProcess(model=TOY, logdir=logdir, max_steps=5,
                                    mode=mode, trace_every_n_steps=0)
        self.assertEqual(1, code, (damage, mode))
        self.assertIn('the checkpoint %s/ckpt-3 cannot be read' % logdir, err)
        self.assertIn('Its files were left untouched', err)
        self.assertIn('move ckpt-3.* out of the logdir', err)
        self.assertIn('model_checkpoint_path: "ckpt-2" (older ones: ckpt-1)',
                      err)
        self.assertNotIn('Traceback', err)
        self.assertEqual(before, _Files(logdir), (damage, mode))
    with open(index, 'wb') as f:
      f.write(good_index)
    # Following the advice resumes from the previous checkpoint.
    for path in glob.glob(os.path.join(logdir, 'ckpt-3.*')):
      os.rename(path, path + '.bad')
    state = os.path.join(logdir, 'checkpoint')
    with open(state) as f:
      lines = f.read().splitlines()
    lines[0] = 'model_checkpoint_path: "ckpt-2"'
    with open(state, 'w') as f:
      f.write('\n'.join(lines) + '\n')
    code, out, err = RunInProcess(
        model=TOY, logdir=logdir, max_steps=4, checkpoint_every_n_steps=1,
        log_every_n_steps=1, trace_every_n_steps=0)
    self.assertEqual(0, code, err)
    self.assertIn('resumed from %s/ckpt-2 at step 2' % logdir, out)
    self.assertEqual(os.path.join(logdir, 'ckpt-4'),
                     tf.train.latest_checkpoint(logdir))

  def testStartupCountsFromTheTrainersStartNotTheProcesss(self):
    # train.sh execs the trainer after the machine's set-up: the process
    # (and /proc's start time) began before the set-up, the trainer after.
    logdir = self.create_tempdir().full_path
    stamp = os.path.join(logdir, 'exec_time')
    command = ['bash', '-c', 'sleep 3; date +%s.%N > "$0"; exec "$@"',
               stamp] + trainer_testlib.TrainerCommand(
                   '--model=' + TOY, '--logdir=' + logdir, '--max_steps=2',
                   '--eval_after_train=false')
    done = subprocess.run(command, cwd=trainer_testlib.ROOT,
                          env=trainer_testlib.Environment(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=300, check=False)
    self.assertEqual(0, done.returncode, done.stdout[-3000:])
    with open(stamp) as f:
      exec_time = float(f.read())
    total = float(re.search(r"start-up: ([\d.]+) s from the trainer's start",
                            done.stdout).group(1))
    # startup.json is written when the line's total is taken.
    path = os.path.join(logdir, 'startup.json')
    self.assertLess(total, os.path.getmtime(path) - exec_time + 0.5)
    with open(path) as f:
      result = json.load(f)
    self.assertGreaterEqual(result['started'], exec_time)
    # The stage functions' tracing (gpipe.stage.OnTrace), inside the forward.
    phases = {row['phase']: row for row in result['phases']}
    self.assertEqual('forward', phases['stage tracing']['parent'])
    self.assertEqual(2, phases['stage tracing']['calls'])

  def testLogdirNotWritable(self):
    blocker = os.path.join(self.create_tempdir().full_path, 'a_file')
    with open(blocker, 'w') as f:
      f.write('x')
    code, _, err = RunInProcess(model=TOY, logdir=os.path.join(blocker, 'run'))
    self.assertEqual(1, code)
    self.assertIn('--logdir=%s/run is not writable' % blocker, err)
    self.assertIn('choose a directory you can create and write to', err)

  def testUnknownModelSuggestsNames(self):
    code, _, err = RunInProcess(
        model='toy.PipelinedDigitMlp',
        logdir=self.create_tempdir().full_path)
    self.assertEqual(1, code)
    self.assertIn("unknown model 'toy.PipelinedDigitMlp'. Did you mean: "
                  'toy.PipelinedDigitsMlp', err)

  def testEvalWithoutCheckpoint(self):
    logdir = self.create_tempdir().full_path
    code, _, err = RunInProcess(model=TOY, logdir=logdir, mode='eval')
    self.assertEqual(1, code)
    self.assertIn('no checkpoint in --logdir=%s: train first' % logdir, err)

  def testInspectModelEndsWithTotal(self):
    code, out, err = RunInProcess(model=TOY, mode='inspect_model',
                                  num_stages=4)
    self.assertEqual(0, code, err)
    lines = out.strip().splitlines()
    self.assertEqual('total params: 13130', lines[-1])
    self.assertLen([l for l in lines if re.match(r'  stage \d ', l)], 4)


if __name__ == '__main__':
  tf.test.main()
