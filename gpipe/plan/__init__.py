"""The planner: measure a model once, simulate every configuration, pick.

* ``profile``: a model's measured profile (per-layer task times and bytes,
  call, hand-over and update costs), saved as JSON and reused;
* ``simulator``: a configuration (R, K, cut, M, schedule, remat, batched W,
  dtype) -> predicted step time, idle and peak memory per device;
* ``search``: every configuration for D devices under a memory cap, the
  best first, with why the others were dropped; the chosen plan as JSON;
* ``profiling``: measuring a profile with TensorFlow (per layer, in a
  process pinned to one core); ``measure`` is its former, deprecated path
  (``gpipe.measure`` is the traced step's timeline and memory);
* ``calibrate``: a profile calibrated against the executor's own stage calls
  (a layer timed on its own is not the same work as inside a stage);
* ``choice``: the chosen plan (one configuration with its prediction) as
  JSON, and applying it to a model's params;
* ``traced``: a traced step's stage tasks (times, hand-over delays), read
  from its timeline;
* ``trainer_fit``: the profile's absolute times fitted to the trainer's
  own traced and untraced reference steps (``tools/plan/trainer_step.py``).

``profile``, ``simulator``, ``search``, ``choice``, ``traced`` and
``trainer_fit`` are pure Python: they import no TensorFlow
(``tests/pure_imports_test.py``).

``python -m tools.plan`` is the command line; the trainer takes
``--plan=auto`` or ``--plan=FILE``.
"""
