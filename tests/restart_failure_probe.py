"""The trainer binary whose local workers start once but never again.

``python -m tests.restart_failure_probe <trainer flags>`` runs
``tools.trainer`` with ``gpipe.runtime.local_cluster.LocalCluster`` failing from its
second construction on, the way a machine out of memory or processes fails to
start fresh workers: tests/trainer_recovery_test.py kills a worker and checks
the trainer's error.
"""

from gpipe import lingvo_import  # pylint: disable=unused-import
from absl import app
from gpipe.runtime import local_cluster
from tools.trainer import cli

_REAL = local_cluster.LocalCluster
_STARTED = []


class _StartsOnce(_REAL):

  def __init__(self, num_workers, **kwargs):
    if _STARTED:
      raise RuntimeError('worker 0 exited with code 1 while starting '
                         '(simulated by tests/restart_failure_probe.py)')
    _STARTED.append(1)
    super().__init__(num_workers, **kwargs)


local_cluster.LocalCluster = _StartsOnce

if __name__ == '__main__':
  app.run(cli.main)
