#!/usr/bin/env bash
# Stop every process of the trainflow testbed in $TRAINFLOW_TESTBED_DIR (no orphans).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PY="$(testbed_python)"
exec "$PY" "$TESTBED_SRC/testbed.py" down --dir "$TESTBED_DIR"
