#!/usr/bin/env bash
# make test: every suite. The suites that wait on clusters, pods and Airflow run side by side, each on its own
# testbed instance, while the cold builds they need run at low priority; the checks go first in their own lane.
#
#   lane checks : lint typecheck check-components test-fast-rest test-k8s37 test-dist test-images, then e2e
#   lane build  : control plane, then the node components (Go, nice 10)   | images for the pods (in parallel)
#   lane airflow: test-fast-airflow, then e2e-airflow and test-airflow-floor (after the control plane is built)
#   lane pods   : e2e-pods (after the node components and the images)
#
# Each step's output goes to $TRAINFLOW_TEST_LOGS/<step>.log (default build/test-logs); a failing step's log
# tail is printed. Exit status: 0 when every step passed. Run one suite alone with its own make target.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${TRAINFLOW_TEST_LOGS:-build/test-logs}"
rm -rf "$LOGS"; mkdir -p "$LOGS"
LOGS="$(cd "$LOGS" && pwd)"
# Prerequisites are made once below; steps must not remake them concurrently (dist is rm + build).
# Every pytest run lists its slowest tests, so the log shows where the time goes.
MK=(make --no-print-directory -o setup -o dist -o image-tools "PYTEST_FLAGS=-q --durations=12")
t0=$(date +%s)
say() { echo "[make test +$(( $(date +%s) - t0 ))s] $*"; }

step() { # name command... : runs one step, logs it, records its time and result
  local name="$1" s rc; shift
  s=$(date +%s); say "start $name"
  "$@" >"$LOGS/$name.log" 2>&1; rc=$?
  local took=$(( $(date +%s) - s ))
  if [ $rc -eq 0 ]; then
    echo "$name passed ${took}s" >>"$LOGS/summary"; say "passed $name in ${took}s"
  else
    echo "$name FAILED ${took}s (exit $rc)" >>"$LOGS/summary"; say "FAILED $name after ${took}s (exit $rc): last lines of $name.log"
    # the summary (printed last, so it survives a truncated CI log) names the failing tests too
    grep -E '^(FAILED|ERROR) ' "$LOGS/$name.log" | head -n 20 | cut -c1-300 | sed 's/^/    /' >>"$LOGS/summary"
    tail -n 150 "$LOGS/$name.log" | sed "s/^/  $name| /"
  fi
  return $rc
}
mark() { touch "$LOGS/.$1"; }
await() { # marker: waits for a build marker; fails when the build failed
  while :; do
    [ -e "$LOGS/.$1" ] && return 0
    [ -e "$LOGS/.$1-failed" ] && { say "not running: $1 failed"; echo "(needs $1) NOT RUN" >>"$LOGS/summary"; return 1; }
    sleep 5
  done
}

lane_checks() { # every step runs even after a failure, so one CI run reports every broken suite
  local rc=0 t
  for t in lint typecheck check-components test-fast-rest test-k8s37 test-dist test-images; do
    step "$t" "${MK[@]}" "$t" || rc=1
  done
  await control-plane && step e2e "${MK[@]}" e2e || rc=1
  return $rc
}
lane_build_go() {
  { step build-control-plane bash testbed/build.sh && mark control-plane; } || { mark control-plane-failed; return 1; }
  { step build-node bash testbed/node/build.sh && mark node; } || { mark node-failed; return 1; }
}
lane_build_images() {
  { step pods-images "${MK[@]}" pods-images && mark images; } || { mark images-failed; return 1; }
}
lane_airflow() {
  local rc=0
  step test-fast-airflow "${MK[@]}" test-fast-airflow || rc=1
  await control-plane || return 1
  # its own kwok testbed instance, so it never shares (or stops) the e2e lane's
  TRAINFLOW_TESTBED_DIR=/tmp/trainflow-airflow-testbed TRAINFLOW_TESTBED_PORT_BASE=24380 \
    step e2e-airflow "${MK[@]}" e2e-airflow || rc=1
  step test-airflow-floor "${MK[@]}" test-airflow-floor || rc=1
  return $rc
}
lane_pods() {
  await node && await images || return 1
  TRAINFLOW_TESTBED_IMAGES=dist/images/pods step e2e-pods "${MK[@]}" e2e-pods
}

# Sequential: the locked environment, the wheel, and every Debian package (apt takes one installer at a time).
step setup make --no-print-directory setup || exit 1
step prerequisites bash -c 'make --no-print-directory -o setup dist image-tools && bash testbed/node/build.sh --deps \
  && bash tests/airflow_deploy/system_deps.sh' || exit 1

pids=()
tree() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; tree "$c"; done; }
stop_lanes() { # every process under the lanes at once: make's recipes run their own cleanup (testbed down) on TERM
  local p all=()
  for p in "${pids[@]}"; do all+=("$p" $(tree "$p")); done
  kill -TERM "${all[@]}" 2>/dev/null; wait
}
trap 'say "interrupted: stopping the lanes"; stop_lanes; exit 130' INT TERM
lane_checks & pids+=($!)
lane_build_go & pids+=($!)
lane_build_images & pids+=($!)
lane_airflow & pids+=($!)
lane_pods & pids+=($!)
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done

say "summary (logs in $LOGS):"
sed 's/^/  /' "$LOGS/summary"
[ $failed -eq 0 ] && say "all suites passed" || say "some suites FAILED"
exit $failed
