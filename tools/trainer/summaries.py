"""TensorBoard event files: scalars and images, written with a FileWriter.

Tags used by the trainer (all at the global step):

* every metric the task returns (``loss``, ``accuracy``, ``top5_accuracy``,
  ``learning_rate/...``, BLEU in decode), and ``learning_rate``;
* ``examples_per_sec``, ``examples_per_sec_per_replica`` with data-parallel
  replicas, and with ``--plan`` the plan's predicted ``examples_per_sec`` in
  the run ``planned`` (the subdirectory ``<logdir>/planned``: one chart);
* ``trainer/worker_restarts`` after a restart; ``trainer/devices``,
  ``trainer/replans``, ``trainer/recovery_secs`` and ``trainer/steps_redone``
  of an elastic run;
* ``pipeline/stage_<k>/compute_sec``, ``pipeline/stage_<k>/bubble_fraction``,
  ``pipeline/bubble_fraction`` (mean over stages), from a traced step;
* ``memory/peak_bytes/<device>`` and ``memory/allocator_peak_bytes/<device>``,
  from the same traced step (see tools.step_trace);
* the image ``pipeline/timeline`` (stages x time; forward, recompute and
  backward coloured).
"""

import glob
import os
import struct

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf


class Writer:
  """Writes scalar and image summaries into one event-file directory."""

  def __init__(self, logdir):
    # The v1 FileWriter refuses eager mode; in a graph context it is a plain
    # event-file writer.
    with tf.Graph().as_default():
      self._writer = tf.compat.v1.summary.FileWriter(logdir)

  def Scalars(self, step, values):
    """Writes {tag: number} at `step`."""
    summary = tf.compat.v1.Summary(value=[
        tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in sorted(values.items())
    ])
    self._writer.add_summary(summary, step)

  def Image(self, step, tag, png):
    """Writes one PNG (bytes) as image `tag` at `step`."""
    # A PNG's IHDR chunk holds the width and height as big-endian uint32s.
    width, height = struct.unpack('>II', png[16:24])
    image = tf.compat.v1.Summary.Image(
        encoded_image_string=png, width=width, height=height, colorspace=4)
    self._writer.add_summary(
        tf.compat.v1.Summary(
            value=[tf.compat.v1.Summary.Value(tag=tag, image=image)]), step)

  def Text(self, step, tag, text):
    """Writes a text summary (shown in TensorBoard's Text tab)."""
    tensor = tf.compat.v1.make_tensor_proto(text)
    metadata = tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(
            plugin_name='text'))
    self._writer.add_summary(
        tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, tensor=tensor,
                                       metadata=metadata)
        ]), step)

  def Restart(self, step):
    """Marks that the run goes on after `step` (a resume, restart or move).

    TensorBoard then drops what earlier event files hold past `step` (its
    "orphaned" data: the steps a restart redoes), so each step shows once:
    a SessionLog START at step + 1 (TensorBoard drops the steps at or past
    a START's). ``Read`` does the same.
    """
    self._writer.add_session_log(
        tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START),
        step + 1)
  def Flush(self):
    self._writer.flush()

  def Close(self):
    self._writer.close()


def Read(logdir):
  """{tag: [(step, value or image bytes)]} of every event file in `logdir`.

  Args:
    logdir: a directory of event files.

  Returns:
    A dict of lists; scalar summaries give floats, images their PNG bytes.
    As TensorBoard shows them: a SessionLog START at step s (what
    ``Writer.Restart(s - 1)`` writes) drops what came before it at steps
    s and past.
  """
  out = {}
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      if (event.HasField('session_log') and
          event.session_log.status == tf.compat.v1.SessionLog.START):
        for tag, items in out.items():
          out[tag] = [(s, v) for s, v in items if s < event.step]
      for value in event.summary.value:
        kind = value.WhichOneof('value')
        if kind == 'simple_value':
          item = value.simple_value
        elif kind == 'image':
          item = value.image.encoded_image_string
        else:
          item = value
        out.setdefault(value.tag, []).append((event.step, item))
  return out
