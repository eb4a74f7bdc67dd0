#!/usr/bin/env bash
# Sets up the machine (tools/setup/setup.sh) and runs every test with Bazel, offline.
# Extra arguments go to `bazel test` (e.g. ./test.sh //tests:pipeline_test).
# Ends with the five slowest test targets (Bazel's time of each, the slowest
# shard's for a sharded target), the machine's speed (a pinned one-core matmul,
# tests/machine_speed.py: tells a slow machine from a slow change) and a last
# line "N passed, N failed" counting Bazel test targets.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
tools/setup/setup.sh || exit 1
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(//...)
log="$(mktemp)"
SECONDS=0
bazel test --color=no --curses=no "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
elapsed=$SECONDS
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
# Bazel's summary lines: "//tests:x_test   (cached) PASSED in 17.8s".
slowest=$(sed -nE 's#^(//[^ ]+) +(.*) in ([0-9.]+)s$#\3 \1 \2#p' "$log" |
          sort -rn | head -5)
rm -f "$log"
if [[ -n $slowest ]]; then
  echo "Slowest test targets:"
  while read -r secs target status; do
    printf '  %7.1f s  %-45s %s\n' "$secs" "$target" "$status"
  done <<< "$slowest"
fi
speed=$(PYTHONPATH="$PWD" .venv/bin/python tests/machine_speed.py 2>/dev/null)
echo "Machine speed: ${speed:-unknown} (a pinned one-core float32 1024^3 matmul)"
printf 'Tests took %d min %02d s\n' $((elapsed / 60)) $((elapsed % 60))
if [[ $rc -ne 0 && $failed -eq 0 ]]; then
  failed=1  # the build itself failed before any test could report
fi
echo "${passed} passed, ${failed} failed"
exit $rc
