"""Runs several test files in one process: the main of a grouped target.

Each test process pays for TensorFlow's and Lingvo's import and Bazel's
set-up, about 5 s of a core, before its first test; three dozen test files
whose own tests take a few seconds spent more on that than on testing. The
``gpipe_py_test_group`` macro (tests/defs.bzl) runs such files in one target
with this main: every file's tests, their ids unchanged
(``tests.dense_test.DenseLayerTest.testX``), their module fixtures kept.
Each file also keeps a target of its own, tagged manual, for
``./test.sh //tests:dense_test``.

Files share a group only where their process-wide settings agree (Grappler
on or off, virtual CPU devices, eager mode), so a group runs each file's
tests as its own target would. A sharded group shards by file (file i in
shard i mod N; order the files so that the shards take about as long).

Flags (given by the macro, removed before the tests' flags are parsed):
  --test_group=a_test,b_test: the files, tests/<name>.py.
  --test_group_main=tf|lingvo|absl: whose main runs them (tf.test.main,
    Lingvo's test_utils.main, which turns eager execution off, or absltest's).
"""

import importlib
import os
import sys
import unittest


def _TakeFlag(name, default=None):
  """The value of --name=value in sys.argv, which loses it."""
  prefix = '--%s=' % name
  value = default
  for arg in list(sys.argv[1:]):
    if arg.startswith(prefix):
      value = arg[len(prefix):]
      sys.argv.remove(arg)
  return value


def _ThisShardsFiles(names):
  """The files of this Bazel shard: whole files, in turn (file i to i % N).

  Bazel's sharding by test method would run every file's class set-up in
  every shard; sharded by file, each file runs once, in one shard. The
  environment's sharding variables are then taken away, so the tests of
  this shard's files all run.
  """
  total = int(os.environ.pop('TEST_TOTAL_SHARDS', '1') or 1)
  index = int(os.environ.pop('TEST_SHARD_INDEX', '0') or 0)
  status = os.environ.pop('TEST_SHARD_STATUS_FILE', None)
  if status:
    with open(status, 'w'):
      pass  # Tells Bazel that this test shards.
  return [n for i, n in enumerate(names) if i % total == index]


def main():
  names = [n for n in (_TakeFlag('test_group') or '').split(',') if n]
  kind = _TakeFlag('test_group_main', 'tf')
  if not names:
    sys.exit('tests/test_group.py: give --test_group=a_test,b_test')
  names = _ThisShardsFiles(names)
  modules = [importlib.import_module('tests.' + n) for n in names]

  def load_tests(loader, unused_tests, unused_pattern):
    suite = unittest.TestSuite()
    for module in modules:
      suite.addTests(loader.loadTestsFromModule(module))
    return suite

  sys.modules['__main__'].load_tests = load_tests
  if kind == 'lingvo':
    from lingvo.core import test_utils  # pylint: disable=g-import-not-at-top
    test_utils.main()
  elif kind == 'tf':
    from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
    tf.test.main()
  elif kind == 'absl':
    from absl.testing import absltest  # pylint: disable=g-import-not-at-top
    absltest.main()
  else:
    sys.exit('tests/test_group.py: --test_group_main is tf, lingvo or absl, '
             'not %r' % kind)


if __name__ == '__main__':
  main()
