"""Helpers for the trainer tests: run tools.trainer in-process or as binary."""

import contextlib
import io
import os
import subprocess
import sys

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from absl import flags
from absl.testing import flagsaver
from tools.trainer import cli

if not flags.FLAGS.is_parsed():
  # Under pytest nobody parses the flags: use their defaults (tf.test.main
  # parses them again when the file runs as a test binary).
  flags.FLAGS.mark_as_parsed()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = 'toy.PipelinedDigitsMlp'


def RunInProcess(**flag_values):
  """Runs the trainer in-process; returns (exit code, stdout, stderr)."""
  out, err = io.StringIO(), io.StringIO()
  with flagsaver.flagsaver(**flag_values), contextlib.redirect_stdout(
      out), contextlib.redirect_stderr(err):
    code = cli.main(['trainer'])
  return code, out.getvalue(), err.getvalue()


def TrainerCommand(*args):
  """The command line of the trainer binary with `args`."""
  return [sys.executable, '-m', 'tools.trainer'] + list(args)


def Environment():
  """The environment for a trainer subprocess (repository on the path)."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [ROOT] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  # The tests read the log while the trainer runs.
  env['PYTHONUNBUFFERED'] = '1'
  return env


def Popen(args, log_path):
  """Starts the trainer with `args`, stdout and stderr into log_path."""
  with open(log_path, 'w') as log:  # The child keeps its own descriptor.
    return subprocess.Popen(
        TrainerCommand(*args), cwd=ROOT, env=Environment(), stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def Run(args, timeout=300):
  """Runs the trainer to completion; returns the CompletedProcess."""
  return subprocess.run(
      TrainerCommand(*args), cwd=ROOT, env=Environment(), capture_output=True,
      text=True, timeout=timeout, stdin=subprocess.DEVNULL)
