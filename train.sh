#!/usr/bin/env bash
# Sets up the machine (tools/setup/setup.sh) and trains the default model: a small
# AmoebaNet-D on scikit-learn's digits, pipelined over 2 stages with 4
# micro-batches, then prints its test accuracy. Extra flags go to the trainer
# (e.g. ./train.sh --max_steps=100 or --worker_processes=2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
tools/setup/setup.sh
exec .venv/bin/python -m tools.trainer \
  --model=image.AmoebaNetD_Digits \
  --logdir="${LOGDIR:-logs/amoebanet_d_digits}" \
  --mode=train "$@"
