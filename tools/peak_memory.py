"""Peak memory per device of one traced step, from its allocation records.

A step run with ``RunOptions(trace_level=FULL_TRACE)`` records, for every op,
each allocation and deallocation it made (``allocation_records``: time and
+/- bytes) on its device's allocator. Replaying a device's records in time
order gives the bytes its ops held at every moment; the maximum is that
device's peak memory during the step (activations, gradients, temporaries;
tensors still alive at the end of the step count until then). Variables,
allocated before the step, are not included: add their sizes for a total.

Virtual CPU devices of one process share one allocator, whose own counters
(``allocator_bytes_in_use``) are process-wide; the replayed records are per
device.
"""


def PeakBytesPerDevice(step_stats):
  """{device name: peak bytes held by its ops during the step}.

  Args:
    step_stats: a ``RunMetadata().step_stats`` of a FULL_TRACE run.

  Returns:
    A dict from device name to the peak of the running sum of its
    allocation records (0 for a device without records).
  """
  peaks = {}
  for dev in step_stats.dev_stats:
    records = []
    for node in dev.node_stats:
      for mem in node.memory:
        for rec in mem.allocation_records:
          records.append((rec.alloc_micros, rec.alloc_bytes))
    # At equal times, count frees first: a peak is never a same-instant
    # artefact of ordering.
    records.sort(key=lambda r: (r[0], r[1]))
    held, peak = 0, 0
    for _, delta in records:
      held += delta
      peak = max(peak, held)
    name = dev.device
    peaks[name] = max(peaks.get(name, 0), peak)
  return peaks

