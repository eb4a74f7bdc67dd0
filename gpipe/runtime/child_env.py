"""The environment of a Python child process that imports this repository.

Workers, fork servers, trainer runs of the benchmarks and the lab's
processes start as ``python -m ...`` in the repository: each gets the
launcher's environment with the repository first on ``PYTHONPATH`` and
TensorFlow's C++ log level at warnings and above unless one is set.
"""

import os

# The repository's root (the directory holding gpipe/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def Environment(base=None):
  """`base` (default: this process's environment) for a child process.

  Args:
    base: a dict of environment variables (not changed).

  Returns:
    A new dict: `base` with ROOT first on PYTHONPATH and
    TF_CPP_MIN_LOG_LEVEL=2 unless `base` sets it.
  """
  env = dict(os.environ if base is None else base)
  env['PYTHONPATH'] = os.pathsep.join(
      [ROOT] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep)
                if p and p != ROOT])
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  return env
