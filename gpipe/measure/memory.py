"""Measured memory of a traced step, per device.

Run a step with ``RunOptions(trace_level=FULL_TRACE)`` and pass its
``RunMetadata`` (or ``RunMetadata.step_stats``). Every traced op reports, per
allocator, the bytes it allocated and freed (``allocation_records``, with
timestamps) and the allocator's bytes in use when it finished
(``allocator_bytes_in_use``). From those:

  * ``PeakBytesPerDevice``: the peak of the bytes allocated and not yet
    freed by the step's own ops on the device, replayed in time order from
    the allocation records: activations, gradients and temporaries, without
    what existed before the step (variables). Separate for each device even
    when devices share an allocator.
  * ``PeakAllocatorBytesPerDevice``: the most bytes the device's allocator
    held at the end of any op of the step: variables, inputs and everything
    the step allocated (what must fit in the device's memory). Devices of one
    process that share its allocator (virtual CPUs) each see the process
    total. Only allocators that count their bytes report this: GPU and TPU
    allocators do; TensorFlow's default CPU allocator does not, unless
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` is in the environment before the
    process creates its first session.

Ops inside graph functions (pipeline stages) are traced like any other op,
so both include the memory of the stage functions.
"""

import collections


def _StepStats(run_metadata_or_step_stats):
  if hasattr(run_metadata_or_step_stats, 'step_stats'):
    return run_metadata_or_step_stats.step_stats
  return run_metadata_or_step_stats


def _CheckTraced(step_stats, what):
  for dev in step_stats.dev_stats:
    for node in dev.node_stats:
      if node.memory:
        return
  raise ValueError(
      '%s: the step has no memory records; run it with '
      'options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.'
      'FULL_TRACE) and pass the filled RunMetadata' % what)


def PeakAllocatorBytesPerDevice(run_metadata):
  """The peak bytes in use of each device's allocator during a traced step.

  Args:
    run_metadata: a ``tf.compat.v1.RunMetadata`` filled by a FULL_TRACE
      ``Session.run`` (or its ``step_stats``).

  Returns:
    {device name: peak bytes}, over the devices whose allocators report
    their bytes in use (see the module docstring); empty when none does.

  Raises:
    ValueError: if the step was not traced with memory records.
  """
  step_stats = _StepStats(run_metadata)
  _CheckTraced(step_stats, 'PeakAllocatorBytesPerDevice')
  peaks = collections.defaultdict(int)
  for dev in step_stats.dev_stats:
    for node in dev.node_stats:
      for mem in node.memory:
        # ``mem.peak_bytes`` is only this op's own high-water mark; the
        # allocator-wide figure is ``allocator_bytes_in_use`` (0 when the
        # allocator keeps no counts).
        if mem.allocator_bytes_in_use > 0:
          peaks[dev.device] = max(peaks[dev.device],
                                  mem.allocator_bytes_in_use)
  return dict(peaks)


def PeakBytesPerDevice(run_metadata):
  """The peak bytes the step's own ops held at once, per device.

  Replays every allocation (+bytes) and deallocation (-bytes) record of the
  device's ops in time order; a tensor still alive at the end of the step
  counts until then.

  Args:
    run_metadata: as for PeakAllocatorBytesPerDevice.

  Returns:
    {device name: peak bytes}.

  Raises:
    ValueError: if the step was not traced with memory records.
  """
  step_stats = _StepStats(run_metadata)
  _CheckTraced(step_stats, 'PeakBytesPerDevice')
  events = collections.defaultdict(list)
  for dev in step_stats.dev_stats:
    for node in dev.node_stats:
      for mem in node.memory:
        for rec in mem.allocation_records:
          events[dev.device].append((rec.alloc_micros, rec.alloc_bytes))
  peaks = {}
  for device, records in events.items():
    live = peak = 0
    # At equal times frees go first: a buffer freed and reused in the same
    # microsecond is not counted twice.
    for _, nbytes in sorted(records, key=lambda r: (r[0], r[1])):
      live += nbytes
      peak = max(peak, live)
    peaks[device] = peak
  return peaks


def MaxOverDevices(per_device):
  """The largest value of a {device: bytes} dict (0 if empty)."""
  return max(per_device.values()) if per_device else 0


def FormatMiB(num_bytes, missing='?', unit=' MiB'):
  """Bytes in whole MiB for tables and messages, e.g. '123 MiB'.

  Args:
    num_bytes: a byte count; None or 0 when it is not known.
    missing: the text for an unknown count.
    unit: the text after the number ('' for a column titled in MiB).
  """
  if not num_bytes:
    return missing
  return '%.0f%s' % (num_bytes / 2.0**20, unit)
