#!/usr/bin/env bash
# make test-under-load: make targets run one after the other with CPU hogs beside them, one per core at normal
# priority, so that a test whose bound follows the wall clock instead of the operation it waits for fails here
# before CI (which may share its machine) finds it. The hogs stop with the run, and by themselves after
# TRAINFLOW_LOAD_SECONDS (default 7200).
#
#   usage: scripts/under_load.sh TARGET...
set -uo pipefail
cd "$(dirname "$0")/.."
limit="${TRAINFLOW_LOAD_SECONDS:-7200}"
hogs=()
for _ in $(seq "$(nproc)"); do
  timeout "$limit" sh -c 'while :; do :; done' & hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null; wait "${hogs[@]}" 2>/dev/null' EXIT
echo "under load: ${#hogs[@]} CPU hogs (pids ${hogs[*]}), bounded at ${limit}s"
rc=0
for target in "$@"; do
  s=$(date +%s)
  if make --no-print-directory "$target"; then
    echo "under load: $target passed in $(( $(date +%s) - s ))s (load $(cut -d' ' -f1-3 /proc/loadavg))"
  else
    echo "under load: $target FAILED after $(( $(date +%s) - s ))s (load $(cut -d' ' -f1-3 /proc/loadavg))"
    rc=1
  fi
done
exit $rc
