"""Shared by the planner's tests: profiles of equal layers."""

from gpipe.plan import profile as profile_lib


def UniformProfile(num_layers, batch=64, forward=1.0, backward=1.0,
                   weight=1.0, activation=10.0, boundary=1.0, weight_bytes=3.0,
                   temporary=0.0, param_bytes=0.0, **fields):
  """A profile of equal layers whose figures do not depend on the rows."""
  # A single measurement would scale with the rows: the same figures at two
  # sizes keep them flat.
  ms = [profile_lib.Measurement(
      rows=rows, dtype='float32', forward=forward, backward=backward,
      weight=weight, input_bytes=boundary, output_bytes=boundary,
      activation_bytes=activation, weight_bytes=weight_bytes,
      temporary_bytes=temporary) for rows in (1, batch + 1)]
  values = dict(
      model='uniform', batch=batch,
      layers=[profile_lib.Layer('layer%d' % i, param_bytes, ms)
              for i in range(num_layers)],
      handover=profile_lib.Handover(0.0, 1e30), call_seconds=0.0,
      memory_bandwidth=1e30, step_seconds=0.0, loss_in_pipeline=True,
      batched_weights=True, optimizer_slots=0, update_traffic=0.0,
      machine={}, notes='')
  values.update(fields)
  return profile_lib.Profile(**values)


def AssertRefusesOtherFormats(test, load, path, message):
  """`load(path)` of a file of another format raises naming its own."""
  with open(path, 'w') as f:
    f.write('{"format": "other-1"}')
  with test.assertRaisesRegex(ValueError, message):
    load(path)
