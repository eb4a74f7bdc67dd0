"""Imports TensorFlow without its CUDA plugin registration noise on stderr.

Why: the TensorFlow 2.15 wheel registers its cuDNN, cuFFT and cuBLAS plugins
twice, and each second registration logs an error line, e.g.::

  E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to
  register cuDNN factory: Attempting to register factory for plugin cuDNN when
  one has already been registered

on every import, even on a CPU-only machine. They are logged as errors, so
TF_CPP_MIN_LOG_LEVEL=2 keeps them (3 would hide real errors too). They mean
nothing here, but they come before every trainer and benchmark message and
look like failures.

The lines are printed by C++ code straight to file descriptor 2, so replacing
``sys.stderr`` does not catch them: `ImportTensorFlowQuietly` points fd 2 at a
temporary file during the import, then writes back every captured line except
those (`FilterNoise`). Real warnings and errors still show, only later.

A crash inside the import would lose what was captured; set
``GPIPE_UNFILTERED_TF_IMPORT=1`` to import TensorFlow with stderr untouched.
"""

import importlib
import os
import re
import sys
import tempfile

# The whole message after TensorFlow's "<file>.cc:<line>] " log prefix, so a
# different error that merely mentions a plugin is kept.
_NOISE = re.compile(
    r'\.cc:\d+\] (?:'
    r'Unable to register (cuDNN|cuFFT|cuBLAS) factory: Attempting to register '
    r'factory for plugin \1 when one has already been registered'
    r'|TF-TRT Warning: Could not find TensorRT'
    r')$')

UNFILTERED_ENV = 'GPIPE_UNFILTERED_TF_IMPORT'


def FilterNoise(text):
  """`text` without the known CUDA plugin registration lines.

  Args:
    text: captured stderr output, possibly many lines.

  Returns:
    The other lines, unchanged and in order (line endings kept).
  """
  return ''.join(line for line in text.splitlines(keepends=True)
                 if not _NOISE.search(line.rstrip('\r\n')))


def _WriteFd(fd, data):
  while data:
    data = data[os.write(fd, data):]


def CallWithFilteredStderr(fn):
  """Calls `fn()` with fd 2 captured; re-writes the non-noise lines after.

  Args:
    fn: a function of no arguments.

  Returns:
    What `fn()` returns. If it raises, the captured output is written back
    (filtered) before the exception propagates.
  """
  try:
    saved = os.dup(2)
  except OSError:  # no stderr at all: nothing to filter
    return fn()
  try:
    with tempfile.TemporaryFile() as captured:
      # Python's own buffered stderr writes must land on the right side of
      # the switch.
      if sys.stderr:
        sys.stderr.flush()
      os.dup2(captured.fileno(), 2)
      try:
        return fn()
      finally:
        if sys.stderr:
          sys.stderr.flush()
        os.dup2(saved, 2)
        captured.seek(0)
        # surrogateescape round-trips any bytes that are not UTF-8.
        text = captured.read().decode('utf-8', 'surrogateescape')
        _WriteFd(2, FilterNoise(text).encode('utf-8', 'surrogateescape'))
  finally:
    os.close(saved)


def ImportTensorFlowQuietly():
  """Imports and returns the `tensorflow` module, dropping `FilterNoise` lines.

  Idempotent: once TensorFlow is imported this only returns it. With the
  environment variable GPIPE_UNFILTERED_TF_IMPORT=1, imports it unfiltered.
  """
  if 'tensorflow' in sys.modules or os.environ.get(UNFILTERED_ENV) == '1':
    return importlib.import_module('tensorflow')
  return CallWithFilteredStderr(lambda: importlib.import_module('tensorflow'))
