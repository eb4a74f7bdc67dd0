"""One restore set-up for evaluation and decoding.

Both build the model's graph for their mode, open a session on the run's
placement, initialize what a checkpoint does not hold (local variables,
tables), restore the checkpoint (checked against the graph first:
``checkpoints.Checkpointer.RestoreFrom``) and read its global step.
"""

import contextlib

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from lingvo import compat as tf
from lingvo.core import py_utils
from tools.trainer import checkpoints
from tools.trainer import model_graph
from tools.trainer import sessions


@contextlib.contextmanager
def RestoredModel(run, cfg, mode, path=None):
  """A session holding a checkpoint of the run, in `mode`'s graph.

  Args:
    run: the RunConfig (placement, logdir, seed).
    cfg: the model params to build (e.g. run.test).
    mode: 'eval' or 'decode' (see model_graph.MODES).
    path: the checkpoint (default: the newest in run.logdir).

  Yields:
    NestedMap(sess, built, task, step, path): the open session, the built
    graph (model_graph.Build), its task, the restored global step and the
    checkpoint path. The session closes when the block ends.
  """
  path = checkpoints.Choose(run.logdir, path)
  built = model_graph.Build(cfg, run.placement, mode, run.seed,
                            square_norms=run.square_norms)
  with built.graph.as_default():
    saver = checkpoints.Checkpointer(run.logdir, for_eval=True)
    init = tf.group(tf.compat.v1.local_variables_initializer(),
                    tf.compat.v1.tables_initializer())
  with built.graph.as_default():
    sess = run.placement.NewSession(built.graph)
    try:
      sess.run(init)
      saver.RestoreFrom(sess, path)
      step = int(sess.run(built.global_step))
      yield py_utils.NestedMap(sess=sess, built=built, task=built.task,
                               step=step, path=path)
    except BaseException:
      if getattr(run.placement, 'elastic', False):
        # A task may be lost: closing would wait for it (--elastic goes on
        # without it), so the close runs beside the recovery.
        sessions.CloseOrAbandon(sess)
      else:
        sess.close()
      raise
    sess.close()
