#!/usr/bin/env bash
# make test: every suite. The suites that wait on clusters, pods and Airflow run side by side, each on its own
# testbed instance, while the cold builds they need run beside them; the checks go first in their own lane.
#
#   lane checks : lint typecheck check-components test-fast-rest test-dist test-images
#   lane e2e    : the object store (Go, nice 10), then e2e on a kwok testbed (after the control plane and Kueue)
#   lane reliab.: e2e-reliability on a testbed of its own (after the Go builds)
#   lane build  : control plane, Kueue, then the node components (Go) | images for the pods (in parallel)
#   lane airflow: test-fast-airflow, then e2e-airflow on the newest (after the control plane and Kueue)
#   lane floors : the floor suite on Airflow 2.11, then 3.0 (no cluster; after the Go builds)
#   lane pods   : e2e-pods (after the node components and the images)
#
# Priorities: the Go builds gate every cluster suite and the pods images gate the pods suite (the pods lane is
# the critical path on a cold machine: its suite waits on real pods more than it computes, so it must start
# early to overlap the others), so they run at normal priority, and the suites that need no cluster (lint ...
# test-images, test-fast-airflow) at nice 5. The cluster and Airflow deployment suites, whose tests wait on real
# processes, run at normal priority.
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
# Disk, not only time, bounds a CI machine: every line says what is free where the repository and the caches are.
free_gib() { df -Pk "$HOME" . 2>/dev/null | awk 'NR>1 { f = $4 / 1048576; if (m == "" || f < m) m = f } END { printf "%.1f", m }'; }
say() { echo "[make test +$(( $(date +%s) - t0 ))s, $(free_gib) GiB free] $*"; }
watch_disk() { # the least free space seen, sampled every 10 s, for the summary
  local least="" f
  while :; do
    f=$(free_gib)
    if [ -z "$least" ] || awk -v a="$f" -v b="$least" 'BEGIN { exit !(a < b) }'; then
      least=$f; echo "$f GiB at +$(( $(date +%s) - t0 ))s" >"$LOGS/.disk-least"
    fi
    sleep 10
  done
}

# TRAINFLOW_TEST_ALL_STUB=<file> runs the run graph with every step replaced by a sleep ("<step> <seconds>
# [fail]" lines; unnamed steps take 0 s and pass; "<step> real" runs that step itself):
# tests/unit/test_run_graph.py checks the order of steps. Issue 39's scenario with the real builds and prune:
#   printf '%s real\n' build-control-plane build-kueue build-node build-objstore prune-go-cache >/tmp/stub
#   rm -rf ~/.cache/trainflow-testbed/objstore && TRAINFLOW_TEST_ALL_STUB=/tmp/stub bash scripts/test_all.sh
STUB="${TRAINFLOW_TEST_ALL_STUB:-}"
POLL="${TRAINFLOW_TEST_ALL_POLL:-5}"
stubbed() { # name: the stub's command for that step
  awk -v n="$1" '$1 == n { printf "%s", ($2 == "real" ? "real" : "sleep " $2 ($3 == "fail" ? " && false" : "")); f = 1 }
    END { if (!f) printf "true" }' "$STUB"
}
# Each step's CPU time, whatever its processes detach to (testbed daemons, Airflow, builds): a cgroup of its own
# (cgroup v1's cpuacct, or v2's cpu.stat) when this user may make one; the pods' containers are in the testbed
# node's cgroups, not in the step's. On a CPU-bound machine the work, not the order, sets the time.
CPU_CGROUPS=""
for d in /sys/fs/cgroup/cpuacct /sys/fs/cgroup; do
  if [ -f "$d/cgroup.procs" ] && mkdir -p "$d/trainflow-test-$$" 2>/dev/null; then CPU_CGROUPS="$d/trainflow-test-$$"; break; fi
done
cpu_seconds() { # cgroup: CPU seconds its processes used
  if [ -f "$1/cpuacct.usage" ]; then awk '{ printf "%d", $1 / 1e9 }' "$1/cpuacct.usage"
  else awk '$1 == "usage_usec" { printf "%d", $2 / 1e6 }' "$1/cpu.stat"; fi
}
in_cgroup() { # cgroup command... : runs the command inside the cgroup (its children stay there)
  local g="$1"; shift
  if [ -n "$g" ]; then (echo "$BASHPID" >"$g/cgroup.procs" 2>/dev/null; exec "$@"); else "$@"; fi
}
step() { # name command... : runs one step, logs it, records its time, CPU time and result
  local name="$1" s rc g="" cpu=""; shift
  s=$(date +%s); say "start $name"
  if [ -n "$STUB" ] && [ "$(stubbed "$name")" != real ]; then set -- bash -c "$(stubbed "$name")"; fi
  if [ -n "$CPU_CGROUPS" ] && mkdir -p "$CPU_CGROUPS/$name" 2>/dev/null; then g="$CPU_CGROUPS/$name"; fi
  in_cgroup "$g" "$@" >"$LOGS/$name.log" 2>&1; rc=$?
  local took=$(( $(date +%s) - s ))
  if [ -n "$g" ]; then cpu=", cpu $(cpu_seconds "$g")s"; rmdir "$g" 2>/dev/null; fi
  if [ $rc -eq 0 ]; then
    echo "$name passed ${took}s${cpu}" >>"$LOGS/summary"; say "passed $name in ${took}s${cpu}"
  else
    echo "$name FAILED ${took}s${cpu} (exit $rc)" >>"$LOGS/summary"; say "FAILED $name after ${took}s${cpu} (exit $rc): last lines of $name.log"
    # the summary (printed last, so it survives a truncated CI log) names the failing tests too
    # and when no test failed (a testbed that did not come up, a build), the log's last lines say why
    { grep -E '^(FAILED|ERROR) ' "$LOGS/$name.log" || tail -n 12 "$LOGS/$name.log"; } | head -n 20 | cut -c1-300 \
      | sed 's/^/    /' >>"$LOGS/summary"
    tail -n 150 "$LOGS/$name.log" | sed "s/^/  $name| /"
  fi
  return $rc
}
mark() { touch "$LOGS/.$1"; }
await() { # marker: waits for a build marker; fails when the build failed
  while :; do
    [ -e "$LOGS/.$1" ] && return 0
    [ -e "$LOGS/.$1-failed" ] && { say "not running: $1 failed"; echo "(needs $1) NOT RUN" >>"$LOGS/summary"; return 1; }
    sleep "$POLL"
  done
}
ended() { # marker: waits until that build has ended, passed or failed
  while [ ! -e "$LOGS/.$1" ] && [ ! -e "$LOGS/.$1-failed" ]; do sleep "$POLL"; done
}

lane_checks() { # every step runs even after a failure, so one CI run reports every broken suite
  local rc=0 t
  for t in lint typecheck check-components test-fast-rest test-dist test-images; do
    step "$t" nice -n 5 "${MK[@]}" "$t" || rc=1
  done
  return $rc
}
lane_e2e() { # its tests wait on the testbed's controllers, so it need not wait for the checks lane (it did:
  # on a cold machine that put its 15 minutes last, at +2,738 s instead of +1,493 s). First the object store
  # its testbed and the pods' run (a 2-minute Go build, cached by version key), while the control plane builds.
  { step build-objstore bash testbed/objstore/build.sh && mark objstore; } || { mark objstore-failed; return 1; }
  await control-plane && await kueue || return 1
  step e2e "${MK[@]}" e2e
}
build_go_chain() {
  export TESTBED_BUILD_NICE=0
  { step build-control-plane bash testbed/build.sh && mark control-plane; } || { mark control-plane-failed; return 1; }
  # the e2e and Airflow testbeds run Kueue (up.sh --kueue); the node build does not need it
  { step build-kueue bash testbed/kueue/build.sh && mark kueue; } || mark kueue-failed
  { step build-node bash testbed/node/build.sh && mark node; } || { mark node-failed; return 1; }
}
lane_build_go() { # marks go-done however the chain ends: the lanes that only wait for CPU wait for it
  build_go_chain; local rc=$?
  mark go-done
  # The binaries are cached by version key; Go's build cache (several GB) serves only the next cold build. It
  # is pruned only once no Go build of this run can read it: the object store compiles from it in the e2e
  # lane, and a cached chain ends long before that build does (go clean -cache under it failed the build).
  ended objstore
  step prune-go-cache bash -c '. testbed/lib.sh && go clean -cache' || rc=1
  return $rc
}
after_go_builds() { # on a cold machine the Go builds are the critical path: start only once they are done
  while [ ! -e "$LOGS/.go-done" ]; do sleep "$POLL"; done
}
lane_build_images() {
  { step pods-images "${MK[@]}" pods-images && mark images; } || { mark images-failed; return 1; }
}
lane_floors() { # no cluster: the local engine in each floor line's deployment
  local rc=0 line
  after_go_builds  # they need no cluster, but beside the cold builds they would slow the critical path
  for line in 2.11 3.0; do
    # a deployment of its own beside e2e-airflow's: its own state dir and ports
    TRAINFLOW_AIRFLOW_DIR=/tmp/trainflow-airflow-floor TRAINFLOW_AIRFLOW_PORT_BASE=29570 \
      step "test-airflow-floor-$line" "${MK[@]}" test-airflow-floor "AIRFLOW_FLOORS=$line" || rc=1
  done
  return $rc
}
lane_airflow() {
  local rc=0
  step test-fast-airflow nice -n 5 "${MK[@]}" test-fast-airflow || rc=1
  await control-plane && await kueue || return 1
  # its own kwok testbed instance, so it never shares (or stops) the e2e lane's
  TRAINFLOW_TESTBED_DIR=/tmp/trainflow-airflow-testbed TRAINFLOW_TESTBED_PORT_BASE=24380 \
    step e2e-airflow "${MK[@]}" e2e-airflow || rc=1
  return $rc
}
lane_reliability() {
  await control-plane || return 1
  after_go_builds  # its testbed needs the control plane only; beside Kueue's and the node's builds it slowed them
  # its own testbed instance (Makefile: RELIABILITY_TESTBED); the local engine's stress run there has the other
  # lanes beside it for load, so it starts no CPU hogs of its own
  TRAINFLOW_LIVENESS_HOGS=0 step e2e-reliability "${MK[@]}" e2e-reliability
}
lane_pods() {
  await node && await kueue && await images && await objstore || return 1
  TRAINFLOW_TESTBED_IMAGES=dist/images/pods step e2e-pods "${MK[@]}" e2e-pods
}

# Sequential: the locked environment, the wheel, and every Debian package (apt takes one installer at a time).
# The locked environment with the bench extra too: the reliability lane's differential suite needs it, and its
# own sync (make e2e-reliability) must not change the venv under the lanes already running from it.
step setup make --no-print-directory setup-bench || exit 1
step prerequisites bash -c 'make --no-print-directory -o setup dist image-tools && bash testbed/node/build.sh --deps \
  && bash tests/airflow_deploy/system_deps.sh' || exit 1

busy_since() { # /proc/stat's cpu line at the start: CPU seconds busy and idle since then, on how many cores
  awk -v start="$1" -v cores="$(nproc)" 'NR == 1 { split(start, a, " "); busy = 0
    for (i = 2; i <= NF; i++) { d = $i - a[i]; if (i == 5 || i == 6) idle += d; else if (i <= 9) busy += d }
    printf "%d CPU-seconds busy, %d idle, on %d cores", busy / 100, idle / 100, cores }' /proc/stat
}
stat0=$(head -n 1 /proc/stat)
watch_disk >/dev/null 2>&1 & disk_watcher=$!
pids=()
tree() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; tree "$c"; done; }
stop_lanes() { # every process under the lanes at once: make's recipes run their own cleanup (testbed down) on TERM
  local p all=()
  for p in "${pids[@]}"; do all+=("$p" $(tree "$p")); done
  # and every process of every step's cgroup: a lane signalled before this shell (a kill of the whole process
  # group) is gone, and its steps' processes with the daemons they started are no longer below it
  if [ -n "$CPU_CGROUPS" ]; then all+=($(cat "$CPU_CGROUPS"/*/cgroup.procs 2>/dev/null)); fi
  kill -TERM "${all[@]}" 2>/dev/null; wait
}
trap 'say "interrupted: stopping the lanes"; kill "$disk_watcher" 2>/dev/null; stop_lanes; exit 130' INT TERM
lane_checks & pids+=($!)
lane_e2e & pids+=($!)
lane_build_go & pids+=($!)
lane_build_images & pids+=($!)
lane_airflow & pids+=($!)
lane_floors & pids+=($!)
lane_reliability & pids+=($!)
lane_pods & pids+=($!)
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done

kill "$disk_watcher" 2>/dev/null
[ -n "$CPU_CGROUPS" ] && rmdir "$CPU_CGROUPS"/* "$CPU_CGROUPS" 2>/dev/null
say "summary (logs in $LOGS):"
sed 's/^/  /' "$LOGS/summary"
echo "  CPU over the run: $(busy_since "$stat0")"
echo "  least disk free during the run: $(cat "$LOGS/.disk-least" 2>/dev/null || echo unknown)"
# where each Airflow line the provider supports is tested (docs/airflow.md): the steps above that cover it
echo "  Airflow lines: 2.11.2 test-airflow-floor-2.11 + test-dist; 3.0.6 test-airflow-floor-3.0 + test-dist;" \
  "3.1.8 and 3.2.2 test-dist (the wheel installed under each release's constraints); 3.3.2 test-fast-airflow +" \
  "e2e-airflow + test-dist"
[ $failed -eq 0 ] && say "all suites passed" || say "some suites FAILED"
exit $failed
