"""TensorFlow's CUDA plugin registration noise is dropped, other lines kept."""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
from gpipe.compat import quiet_import
from tests import polling

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# As TensorFlow 2.15 prints them on a CPU-only machine.
_NOISE = (
    '2026-11-23 19:18:35.337196: E external/local_xla/xla/stream_executor/'
    'cuda/cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to '
    'register factory for plugin cuDNN when one has already been registered\n'
    '2026-11-23 19:18:35.337301: E external/local_xla/xla/stream_executor/'
    'cuda/cuda_fft.cc:607] Unable to register cuFFT factory: Attempting to '
    'register factory for plugin cuFFT when one has already been registered\n'
    '2026-11-23 19:18:35.358739: E external/local_xla/xla/stream_executor/'
    'cuda/cuda_blas.cc:1515] Unable to register cuBLAS factory: Attempting to '
    'register factory for plugin cuBLAS when one has already been registered\n'
    '2026-11-23 19:18:37.059279: W tensorflow/compiler/tf2tensorrt/utils/'
    'py_utils.cc:38] TF-TRT Warning: Could not find TensorRT\n')
_REAL = (
    '2026-11-23 19:18:35.434285: W tensorflow/core/framework/'
    'op_kernel.cc:1827] Unable to register cuDNN kernel: out of memory\n'
    'To enable the following instructions: AVX2 FMA, in other operations.\n')


class FilterNoiseTest(absltest.TestCase):

  def testDropsTheRegistrationLinesOnly(self):
    self.assertEqual(quiet_import.FilterNoise(_NOISE), '')
    self.assertEqual(quiet_import.FilterNoise(_NOISE + _REAL), _REAL)
    mixed = _REAL.splitlines(keepends=True)
    self.assertEqual(
        quiet_import.FilterNoise(mixed[0] + _NOISE + mixed[1]), _REAL)

  def testKeepsLinesThatOnlyMentionAPlugin(self):
    # A different message about the same plugin, and the message quoted
    # inside another line, are not the noise.
    kept = ('E cuda_dnn.cc:9261] Unable to register cuDNN factory: '
            'plugin cuDNN failed to load\n'
            'user log: Unable to register cuBLAS factory: Attempting to '
            'register factory for plugin cuBLAS when one has already been '
            'registered\n')
    self.assertEqual(quiet_import.FilterNoise(kept), kept)
    self.assertEqual(quiet_import.FilterNoise('no newline at the end'),
                     'no newline at the end')


def _Fd2Output(fn):
  """(what fn() returns or raises, what it wrote to fd 2)."""
  with tempfile.TemporaryFile() as out:
    saved = os.dup(2)
    os.dup2(out.fileno(), 2)
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except
      result = e
    finally:
      os.dup2(saved, 2)
      os.close(saved)
    out.seek(0)
    return result, out.read().decode()


def _Print(text, then=None):
  """Writes `text` to fd 2 as C++ code would, then returns or raises `then`."""
  os.write(2, text.encode())
  if isinstance(then, Exception):
    raise then
  return then


class CallWithFilteredStderrTest(absltest.TestCase):

  def testCapturesFileDescriptor2AndWritesBackTheRest(self):
    result, written = _Fd2Output(lambda: quiet_import.CallWithFilteredStderr(
        lambda: _Print(_NOISE + _REAL, then='done')))
    self.assertEqual(result, 'done')
    self.assertEqual(written, _REAL)

  def testWritesBackBeforeAnErrorPropagates(self):
    error = RuntimeError('boom')
    result, written = _Fd2Output(lambda: quiet_import.CallWithFilteredStderr(
        lambda: _Print(_NOISE + 'before boom\n', then=error)))
    self.assertIs(result, error)
    self.assertEqual(written, 'before boom\n')


class ImportTest(absltest.TestCase):

  def testImportingTheLibraryPrintsNoRegistrationNoise(self):
    env = dict(os.environ)
    env.pop(quiet_import.UNFILTERED_ENV, None)
    proc = subprocess.run(
        [sys.executable, '-c', 'import gpipe.compat.lingvo_import'], cwd=_ROOT,
        env=env, capture_output=True, text=True,
        timeout=polling.TimeLimit(300)[0], check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertNotIn('Unable to register', proc.stderr)
    self.assertNotIn('Could not find TensorRT', proc.stderr)


if __name__ == '__main__':
  absltest.main()
