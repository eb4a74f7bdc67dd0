"""``python -m tools.trainer``: see tools/trainer/cli.py for the flags."""

from absl import app
from tools.trainer import cli

if __name__ == '__main__':
  app.run(cli.main)
