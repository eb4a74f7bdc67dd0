"""``python -m tools.trainer``: trains, evaluates, decodes or inspects a model.

The modes and where the stages run: tools/trainer/cli.py; every flag's help:
--help (the trainer's flags) or --helpfull (Lingvo's and TensorFlow's too).
"""

from absl import app
from absl import flags
from tools.trainer import cli
from tools.trainer import settings
from tools.trainer import train_loop

# --help lists the trainer's flags (defined from settings.Settings).
flags.adopt_module_key_flags(settings)


def _Main(argv):
  # This process ends with the run: the session on local workers is left
  # open, not closed (seconds of RPCs to workers about to be stopped).
  train_loop.LEAVE_LOCAL_SESSIONS_OPEN = True
  return cli.main(argv)


if __name__ == '__main__':
  app.run(_Main)
