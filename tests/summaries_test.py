"""tools/trainer/summaries.py: event files written and read back."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import

import time

from lingvo import compat as tf
from lingvo.core import test_utils
from tools.trainer import summaries


class SummariesTest(test_utils.TestCase):

  def _Write(self, logdir, restart, steps):
    writer = summaries.Writer(logdir)
    if restart is not None:
      writer.Restart(restart)
    for step in steps:
      writer.Scalars(step, {'loss': float(step) + (0.5 if restart else 0.0)})
    writer.Close()
    # Event files are named by the second they were opened in.
    time.sleep(1.1)

  def testARestartDropsTheRedoneStepsOfEarlierFiles(self):
    # A run to step 5, lost; it goes on from the checkpoint of step 3 and
    # redoes 4 and 5; lost again after 6, it goes on from 6.
    logdir = self.create_tempdir().full_path
    self._Write(logdir, None, [1, 2, 3, 4, 5])
    self._Write(logdir, 3, [4, 5, 6])
    self._Write(logdir, 6, [7])
    self.assertEqual([(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5), (5, 5.5),
                      (6, 6.5), (7, 7.5)], summaries.Read(logdir)['loss'])

  def testImagesAndTextRoundTrip(self):
    logdir = self.create_tempdir().full_path
    writer = summaries.Writer(logdir)
    png = (b'\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR' + (3).to_bytes(4, 'big') +
           (2).to_bytes(4, 'big') + b'\x08\x02\x00\x00\x00')
    writer.Image(4, 'pipeline/timeline', png)
    writer.Text(4, 'note', 'hello')
    writer.Close()
    tags = summaries.Read(logdir)
    self.assertEqual([(4, png)], tags['pipeline/timeline'])
    self.assertEqual(b'hello', tags['note'][0][1].tensor.string_val[0])


if __name__ == '__main__':
  tf.test.main()
