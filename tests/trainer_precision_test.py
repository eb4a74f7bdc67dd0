"""The trainer's --fprop_dtype: float32 state, exact resume, bad values."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import


from lingvo import compat as tf
from lingvo.core import test_utils
from tests import trainer_testlib
from tools.trainer import checkpoints

TOY = trainer_testlib.TOY
FLAGS = dict(model=TOY, checkpoint_every_n_steps=10, log_every_n_steps=1000,
             trace_every_n_steps=0, eval_after_train=False,
             fprop_dtype='bfloat16')


class TrainerPrecisionTest(test_utils.TestCase):

  def testBfloat16KeepsFloat32StateAndResumesExactly(self):
    logdir = self.create_tempdir().full_path
    code, _, err = trainer_testlib.RunInProcess(logdir=logdir, max_steps=10,
                                                **FLAGS)
    self.assertEqual(0, code, err)
    # Master weights and the optimizer's slots are float32 in the
    # checkpoint (only the compute is bfloat16).
    path = checkpoints.Newest(logdir)
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    floats = {n: d for n, d in dtypes.items() if d.is_floating}
    self.assertTrue(any('/w/' in n or n.endswith('/w') for n in floats))
    self.assertTrue(any('Adam' in n or 'Momentum' in n for n in floats),
                    sorted(floats))
    self.assertEqual({tf.float32}, set(floats.values()))

    # Resume to step 20: the same losses as 20 steps without a restart.
    code, out, err = trainer_testlib.RunInProcess(logdir=logdir, max_steps=20,
                                                  **FLAGS)
    self.assertEqual(0, code, err)
    self.assertIn('resumed from %s at step 10' % path, out)
    reference_dir = self.create_tempdir().full_path
    code, _, err = trainer_testlib.RunInProcess(logdir=reference_dir,
                                                max_steps=20, **FLAGS)
    self.assertEqual(0, code, err)
    reference = trainer_testlib.Losses(reference_dir, 'accuracy')
    self.assertLen(reference, 20)
    self.assertEqual(reference, trainer_testlib.Losses(logdir, 'accuracy'))

  def testBadFPropDtypes(self):
    logdir = self.create_tempdir().full_path
    for value, message in (
        ('float16', 'float16 is not supported: float16 gradients underflow '
         'to zero without loss scaling.*use bfloat16'),
        ('int8', 'int8 is unknown; use one of float32, bfloat16')):
      flags = dict(FLAGS, fprop_dtype=value)
      code, _, err = trainer_testlib.RunInProcess(logdir=logdir, max_steps=1,
                                                  **flags)
      self.assertEqual(1, code)
      self.assertRegex(err, 'trainer: error: --fprop_dtype=' + message)
      self.assertNotIn('Traceback', err)


if __name__ == '__main__':
  tf.test.main()
