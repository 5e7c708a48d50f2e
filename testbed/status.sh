#!/usr/bin/env bash
# Show testbed process status (or, with --logs, the tail of every component log).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PY="$(testbed_python)"
if [ "${1:-}" = "--logs" ]; then
  exec "$PY" "$TESTBED_SRC/testbed.py" logs --dir "$TESTBED_DIR" --lines "${2:-60}"
fi
exec "$PY" "$TESTBED_SRC/testbed.py" status --dir "$TESTBED_DIR"
