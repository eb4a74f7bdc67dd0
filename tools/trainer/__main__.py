"""``python -m tools.trainer``: trains, evaluates, decodes or inspects a model.

The modes and where the stages run: tools/trainer/cli.py; every flag's help:
--help (the trainer's flags) or --helpfull (Lingvo's and TensorFlow's too).
"""

from absl import app
from absl import flags
from tools.trainer import cli
from tools.trainer import settings

# --help lists the trainer's flags (defined from settings.Settings).
flags.adopt_module_key_flags(settings)

if __name__ == '__main__':
  app.run(cli.main)
