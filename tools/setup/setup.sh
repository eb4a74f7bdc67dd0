#!/usr/bin/env bash
# One set-up path for every command of this project (train, test, CI).
#
# Creates .venv/ from the pinned lists in third_party/ and installs Debian's
# bazel-bootstrap when `bazel` is missing. Idempotent: a stamp file records the
# hash of the requirement lists (written only after a successful install and
# import check), so a second run on a ready machine only compares it and
# changes nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.venv"
REQ="$ROOT/third_party/requirements.txt"
REQ_NODEPS="$ROOT/third_party/requirements-nodeps.txt"
STAMP="$VENV/.gpipe-setup-stamp"
PYTHON="${GPIPE_PYTHON:-python3}"

log() { echo "[setup] $*" >&2; }

want_hash="$(cat "$REQ" "$REQ_NODEPS" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_hash" ]] \
   && [[ -x "$VENV/bin/python" ]] \
   && compgen -G "$VENV/lib/python3*/site-packages/lingvo/core/ops/x_ops.so" >/dev/null; then
  log "python environment ready ($VENV)"
else
  "$PYTHON" - <<'PY' || { log "Python 3.11 is required (found $("$PYTHON" --version 2>&1)); set GPIPE_PYTHON to a python3.11 binary."; exit 1; }
import sys
sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)
PY
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  log "installing pinned packages (a few minutes on a fresh machine)"
  # pip's own status decides (grep only drops a harmless index warning): a
  # failed install must not leave a stamp that says the environment is ready.
  pip_quiet() {
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
    return "${PIPESTATUS[0]}"
  }
  pip_quiet -r "$REQ" \
    || { log "pip could not install $REQ (errors above)"; exit 1; }
  # These packages declare requirements that pull the newest TensorFlow and many
  # unneeded packages; their real needs are already pinned in requirements.txt.
  pip_quiet --no-deps -r "$REQ_NODEPS" \
    || { log "pip could not install $REQ_NODEPS (errors above)"; exit 1; }
  (cd "$ROOT" && TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import gpipe.compat.lingvo_import; from lingvo.core import base_layer') \
    || { log "the environment does not import lingvo; see the errors above"; exit 1; }
  echo "$want_hash" > "$STAMP"
  log "python environment ready ($VENV)"
fi

if ! command -v bazel >/dev/null 2>&1; then
  log "installing Debian's bazel-bootstrap"
  SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bazel-bootstrap >/dev/null
fi
