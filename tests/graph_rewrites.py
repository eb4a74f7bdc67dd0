"""Tests run the graphs as this library builds them: Grappler stays off.

The tests check values, orders and placements of the graphs this library
builds. Grappler's meta-optimizer rewrites each new graph and function body
before its first run, and on these small graphs that rewrite costs more
than the runs themselves: the Evolved Transformer case of
``lingvo_gpipe_test`` takes 155 s with it and 26 s without; the pipelined
decode tests 78 s and 47 s. The values are the same either way, so the
suite turns it off where a test builds graphs in its own process. It stays
as users have it in the trainer and benchmark binaries the tests start as
subprocesses (the trainer optimizes the stage functions on their workers,
not its session graph: ``--session_graph_optimizer``), and in
``distributed_test`` (the schedule's order of the stage calls on the
workers, run with Grappler on) and ``memory_test`` (peak memory per
schedule).

``Off()`` at a test module's top covers function calls (their
``config_proto``, which worker processes read when they run a stage) and
sessions opened without a config; ``SessionConfig`` is for sessions that
need one, ``CpuConfig`` for the usual one: N virtual CPU devices.
``VirtualCpus`` splits the CPU of a process that runs eagerly or through
``tf.function`` (no session config) into N devices the same way.
"""

import os

import tensorflow as tf


def Off():
  """Turns Grappler off for the graphs and functions this process builds."""
  tf.config.optimizer.set_experimental_options(
      {'disable_meta_optimizer': True})


def XlaWithoutLlvmOptimizations():
  """XLA compiles this process's functions without LLVM's optimizations.

  A test of XLA-compiled stages spends most of its time compiling them, much
  of it in LLVM optimizing the generated code (``--xla_backend_optimization_
  level=0`` about halves a compiled AmoebaNet case). What such a test proves
  does not depend on it: XLA's own passes (fusion, layout) run as usual and
  the arithmetic is IEEE either way (XLA's CPU backend has fast math off);
  only the machine code is less optimized. Call it at a test module's top:
  XLA reads the flag (appended to any XLA_FLAGS) at its first compilation.
  """
  os.environ['XLA_FLAGS'] = ' '.join(
      [os.environ.get('XLA_FLAGS', ''), '--xla_backend_optimization_level=0'])


def SessionConfig(**kwargs):
  """A session ConfigProto(**kwargs) with Grappler's rewrites off."""
  config = tf.compat.v1.ConfigProto(**kwargs)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


def CpuDevices(num_cpus):
  """'/device:CPU:0', ...: the devices of CpuConfig(num_cpus)."""
  return ['/device:CPU:%d' % i for i in range(num_cpus)]


def CpuConfig(num_cpus, grappler=False):
  """A session config with `num_cpus` virtual CPUs ('/device:CPU:0', ...).

  Args:
    num_cpus: CPU devices of the session's process (they share its threads).
    grappler: leave Grappler's rewrites on, as users run (tests of memory
      and of the runtime's timeline measure that); off by default.

  Returns:
    A tf.compat.v1.ConfigProto.
  """
  if grappler:
    return tf.compat.v1.ConfigProto(device_count={'CPU': num_cpus})
  return SessionConfig(device_count={'CPU': num_cpus})


def VirtualCpus(num_cpus):
  """Splits this process's CPU into `num_cpus` logical devices.

  For processes that open no session (eager code, tf.function), where
  CpuConfig does not apply. Call it at a test module's top, before
  TensorFlow's runtime starts.

  Args:
    num_cpus: CPU devices of the process (they share its threads).

  Returns:
    Their full names, '/job:localhost/replica:0/task:0/device:CPU:0', ...
  """
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * num_cpus)
  return _LocalCpuNames(num_cpus)


def LocalCpus():
  """The full names of this process's CPU devices (starts its runtime)."""
  return _LocalCpuNames(len(tf.config.list_logical_devices('CPU')))


def _LocalCpuNames(num_cpus):
  return ['/job:localhost/replica:0/task:0/device:CPU:%d' % i
          for i in range(num_cpus)]
