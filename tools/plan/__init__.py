r"""The planner: measure a model once, simulate every configuration, pick.

Usage (from the repository root; or ``bazel run //tools/plan -- ...``)::

  .venv/bin/python -m tools.plan --model=image.AmoebaNetD_Digits \
      --devices=2 --memory_per_device=1GiB --profile_out=/tmp/digits.json \
      --plan_out=/tmp/digits_plan.json
  .venv/bin/python -m tools.plan --profile=/tmp/digits.json --devices=4
  .venv/bin/python -m tools.trainer --model=image.AmoebaNetD_Digits \
      --logdir=/tmp/d --worker_processes=2 --plan=/tmp/digits_plan.json

It measures the registered model's pipeline layers on one pinned core
(their F, B and W times at a few micro-batch sizes, the bytes they hold and
hand over) and the hand-over between two worker processes, saves that
profile, then simulates every configuration (data-parallel replicas R,
stages K and their cut, micro-batches M, schedule, remat, batched weight
gradients, compute dtype) for the devices and memory given, and prints the
best ones with their predicted examples/s, step time, bubble and peak
memory per device, and why the others were dropped. The library is
``gpipe.plan``.

A model too large to run here whole (``mt.T64_16384_32``: 6B parameters)
is planned from one measurement of each distinct layer (equal layers are
measured once) at small micro-batch sizes, extrapolated in the rows, and a
calibration on its first few layers::

  .venv/bin/python -m tools.plan --model=mt.T64_16384_32 --rows=1,2 \
      --calibrate_layers=2 --profile_out=/tmp/t64.json --devices=16 \
      --memory_per_device=16GiB

Modules here: ``cli`` (flags, the run), ``model_profile``
(a registered model's pipeline inputs and optimizer).
"""
