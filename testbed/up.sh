#!/usr/bin/env bash
# Build (if needed) and start the trainflow e2e testbed; waits until ready.
# Writes $TRAINFLOW_TESTBED_DIR/kubeconfig, env (shell exports), state.json.
# Exit non-zero, with the tail of every component log, if anything fails.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

t0=$(date +%s)
BIN="$("$TESTBED_SRC/build.sh")"
UPSTREAM="$(trainer_upstream_dir)"
PY="$(testbed_python)"
"$PY" "$TESTBED_SRC/testbed.py" up --dir "$TESTBED_DIR" --bin "$BIN" --trainer-upstream "$UPSTREAM"
log "testbed-up total $(( $(date +%s) - t0 ))s; use: . $TESTBED_DIR/env"
