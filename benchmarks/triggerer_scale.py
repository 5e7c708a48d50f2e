"""N deferred tasks held by one real ``airflow triggerer`` process: TrainJobTrigger vs cncf.kubernetes'
KubernetesJobTrigger (what ``KubernetesJobOperator(deferrable=True)`` defers to), same run, same API server.

Deployment: Postgres + api-server + one triggerer (tests/airflow_deploy/airflow_stack.py), no scheduler, so fired
tasks are not resumed and only the triggerer works. Per implementation, N objects the controllers leave alone
(``spec.managedBy: kueue.x-k8s.io/multikueue``: TrainJobs, resp. batch/v1 Jobs) get a "running" status written
by the benchmark; a DAG of N tasks is triggered and its task instances are put in the deferred state with their
trigger rows, exactly as the Execution API does when a worker defers (``Trigger(classpath, kwargs)``,
``state=deferred``, ``trigger_id``, ``next_method``). Then the triggerer starts and picks them up.

Measured once all N triggers run, over a steady window: API requests per minute (``apiserver_request_total``
delta on the resources the triggers touch, minus an idle baseline of the same namespace; WATCH left out since
the API server counts a watch when it ends), CPU and PSS of the triggerer's processes, its connections to the
API server. Then ``Complete`` is written to a random sample, one job every 50 ms: detection = the moment the
task instance left ``deferred`` in the metadata DB (polled every 50 ms) minus the moment the write was sent.
Then the rest complete at once and the triggerer must drain them.

The deployment's inputs (objects, statuses, deferred task instances) are in triggerer_harness.py, what is read
off the triggerer in triggerer_probes.py; this file runs the measurement and reports it.

Run with the Airflow venv (``tests/airflow_deploy/venv.sh 3.3``) and a testbed (``TRAINFLOW_TESTBED_DIR``):
    python benchmarks/triggerer_scale.py --n 1000 --window 60 --sample 200 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "airflow_deploy"))
import _bench as B
import airflow_stack
from triggerer_harness import DAGS, POLL_INTERVAL, defer, deployment_env, inject, write_status
from triggerer_pods import MARKER, RankLog, delete_node, end_pod, ensure_node
from triggerer_probes import Deferred, LogLines, group_cpu, loop_stalls, pss_mib, runner_pid, threads

HERE = Path(__file__).resolve().parent

RESOURCES = frozenset({"trainjobs", "jobs", "pods", "events", "trainingruntimes", "clustertrainingruntimes"})


def measure(impl: str, scenario: str, args: argparse.Namespace, root: Path, api: Any) -> dict[str, Any]:
    state = airflow_stack.load(root)
    n, dag_id = args.n, DAGS[impl]
    rank_log = RankLog(impl) if scenario == "logs" else None
    t_setup = time.time()
    namespace, names, run_id = defer(state, impl, n, api, rank_log)
    progress(
        f"{n} jobs{' and pods' if rank_log else ''} running, tasks deferred in {time.time() - t_setup:.0f} s"
    )
    before = B.request_counts(api)  # idle baseline: the objects exist, nothing waits on them
    time.sleep(args.baseline)
    base = B.delta(B.request_counts(api), before)
    t_start = time.time()
    log_file = root / "logs" / "triggerer.log"
    log_offset = log_file.stat().st_size if log_file.exists() else 0
    airflow_stack.start_component(root, "triggerer")
    logs = Path(state["env"]["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    lines = LogLines(logs, n, MARKER) if rank_log is not None and impl == "trainflow" else None

    def started() -> int:
        return len(list(logs.glob("task_id=wait/map_index=*/attempt=1.log.trigger.*.log")))

    deadline = time.time() + args.start_timeout
    while started() < n:
        assert time.time() < deadline, f"only {started()} of {n} triggers started"
        assert airflow_stack.component_pids(root, "triggerer"), airflow_stack.tail(root, "triggerer")
        time.sleep(0.5)
    startup = time.time() - t_start
    progress(f"{n} triggers started in {startup:.0f} s")
    time.sleep(max(args.warmup, POLL_INTERVAL + 2))
    pids = airflow_stack.component_pids(root, "triggerer")
    runner = runner_pid(pids)
    port = B.server_port(api)
    profiles = profile(args, f"{impl}-{scenario}", runner) if args.profile else []
    c0, r0, w0 = group_cpu(pids), B.request_counts(api), time.time()
    conns, thread_counts, seq = [], [], 0
    while time.time() < w0 + args.window:  # rank 0 prints a marker line every log_every seconds
        if rank_log is not None:
            seq += 1
            rank_log.append(seq)
        time.sleep(min(args.log_every, max(0.0, w0 + args.window - time.time())))
        conns.append(B.connections_to(runner, port))
        thread_counts.append(threads([runner]))
    c1, r1, w1 = group_cpu(pids), B.request_counts(api), time.time()
    for proc in profiles:
        proc.wait()
    total_threads = threads(pids)
    minutes = (w1 - w0) / 60
    d = B.delta(r1, r0)
    reqs = sum(v for (verb, res, _), v in d.items() if res in RESOURCES and verb != "WATCH")
    idle = sum(v for (verb, res, _), v in base.items() if res in RESOURCES and verb != "WATCH")
    per_min = reqs / minutes - idle / (args.baseline / 60)
    pss = sum(pss_mib(p) for p in pids)
    rss_runner = B.status_kib(runner, "VmRSS") / 1024
    log_lines = {}
    if lines is not None and rank_log is not None:
        time.sleep(poll_interval(n) * 1.2 + 5)  # the last marker reaches the polled logs too
        lines.close()
        log_lines = line_latency(lines.seen, rank_log.sent, n)

    progress("steady window measured")
    deferred = Deferred(state["ports"]["postgres"], dag_id, run_id)
    sample = random.Random(7).sample(range(n), min(args.sample, n))
    sent: dict[int, float] = {}

    def complete(i: int) -> float:
        if rank_log is not None:  # the container exits first, then the job controllers complete the job
            end_pod(api, impl, namespace, names[i])
        t = time.time()
        write_status(api, impl, namespace, names[i], "complete")
        return t

    for i in sample:
        sent[i] = complete(i)
        time.sleep(0.05)
    end = time.time() + 120
    while time.time() < end and not all(t in deferred.left for t in sent):
        time.sleep(0.1)
    latencies = [deferred.left[t] - s for t, s in sent.items() if t in deferred.left]
    chosen = set(sample)
    B.parallel(complete, [i for i in range(n) if i not in chosen])
    last_write = time.time()
    end = time.time() + 300
    while time.time() < end and len(deferred.left) < n:
        time.sleep(0.1)
    drained = len(deferred.left)
    drain = (max(deferred.left.values()) - last_write) if drained == n else float("nan")
    deferred.close()
    progress(f"detection sampled, the rest drained ({drained}/{n})")
    hwm = B.status_kib(runner, "VmHWM") / 1024
    stalls = loop_stalls(log_file, log_offset)
    airflow_stack.stop_component(root, "triggerer")
    B.delete_namespace(api, namespace)
    if rank_log is not None:
        rank_log.remove()
    return {
        "impl": impl,
        "scenario": scenario,
        "n": n,
        "startup_s": round(startup, 1),
        "requests_per_min": round(per_min, 1),
        "requests": {
            f"{verb} {res}{'/' + sub if sub else ''}": int(v)
            for (verb, res, sub), v in sorted(d.items(), key=lambda kv: -kv[1])
            if res in RESOURCES
        },
        "cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 1),
        "pss_mib": round(pss, 1),
        "runner_rss_mib": round(rss_runner, 1),
        "runner_peak_rss_mib": round(hwm, 1),
        "connections": max(conns),
        "runner_threads": max(thread_counts),
        "threads": total_threads,
        "detected": f"{len(latencies)}/{len(sent)}",
        "p50_s": round(B.percentile(latencies, 0.5), 2),
        "p99_s": round(B.percentile(latencies, 0.99), 2),
        "burst_drain_s": round(drain, 1),
        "drained": f"{drained}/{n}",
        **log_lines,
        **stalls,
    }


def poll_interval(n: int) -> float:
    """How often trainflow reads each log it does not stream, with n followed in one event loop."""
    from trainflow.core.kube import follow_pace

    return follow_pace.poll_interval(max(0, n - follow_pace.FOLLOW_STREAMS))


def profile(args: argparse.Namespace, name: str, runner: int) -> list[subprocess.Popen[bytes]]:
    """py-spy (on PATH) samples the runner and the supervisor over the window: collapsed stacks, one file each."""
    spy = shutil.which("py-spy")
    assert spy, "--profile needs py-spy on PATH (pip install py-spy)"
    args.profile.mkdir(parents=True, exist_ok=True)
    procs = []
    for role, pid in (("runner", runner), ("supervisor", os.getpgid(runner))):
        out = args.profile / f"{name}-{role}.txt"
        argv = [spy, "record", "--pid", str(pid), "--duration", str(int(args.window)), "--rate", "50",
                "--nonblocking", "--format", "raw", "--output", str(out)]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def line_latency(seen: dict[tuple[int, int], float], sent: dict[int, float], n: int) -> dict[str, Any]:
    """Marker line appended to rank 0's log -> the line in that task's log file, over every task and marker."""
    latencies = [t - sent[seq] for (_, seq), t in seen.items() if seq in sent]
    return {
        "log_lines": f"{len(latencies)}/{n * len(sent)}",
        "log_p50_s": round(B.percentile(latencies, 0.5), 2),
        "log_p99_s": round(B.percentile(latencies, 0.99), 2),
        "log_max_s": round(max(latencies, default=float("nan")), 2),
        "log_under_1s": round(sum(1 for x in latencies if x < 1.0) / max(len(latencies), 1), 3),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "inject":
        inject(*sys.argv[2:7])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--window", type=float, default=60)
    p.add_argument("--warmup", type=float, default=15)
    p.add_argument("--baseline", type=float, default=15)
    p.add_argument("--sample", type=int, default=200)
    p.add_argument("--log-every", type=float, default=5.0, help="seconds between rank 0's marker lines")
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("TRAINFLOW_BENCH_AIRFLOW_DIR", "/tmp/trainflow-bench-airflow")),
    )
    p.add_argument(
        "--port-base", type=int, default=int(os.environ.get("TRAINFLOW_BENCH_AIRFLOW_PORT_BASE", "27470"))
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--profile", type=Path, help="directory for py-spy profiles of the steady window")
    p.add_argument("--report", type=Path, help="print the report of an earlier run's --json and exit")
    args = p.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        args.n = saved["results"][0]["n"]
        report(saved["results"], args, saved["machine"])
        return 0
    args.kubeconfig = B.kubeconfig_path()
    root = args.dir.resolve()
    extra = deployment_env(args.n, args.kubeconfig)
    api = B.api_client(args.kubeconfig)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the deployment on the way out
    results, machine = [], B.machine()
    scenarios = args.scenarios.split(",")
    try:
        if "logs" in scenarios:
            ensure_node(api)
        state = airflow_stack.up(
            root, Path(sys.prefix), HERE / "dags", args.port_base, extra, components=("api-server",)
        )
        out = airflow_stack.airflow_cli(state, "dags", "reserialize", timeout=900)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        for scenario in scenarios:
            for impl in args.impls.split(","):
                progress(f"--- {impl}, {scenario}: {args.n} deferred tasks")
                results.append(measure(impl, scenario, args, root, api))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        airflow_stack.down(root)
        for ns in B.namespaces(api, "bench-trig-"):  # those a failed measurement left
            B.delete_namespace(api, ns)
        if "logs" in scenarios:
            delete_node(api)
    report(results, args, machine)
    return 0


IMPLS = {
    "trainflow": "TrainJobTrigger (stream_logs=True)",
    "trainflow-nologs": "TrainJobTrigger (stream_logs=False)",
    "cncf": "KubernetesJobTrigger (get_logs=True)",
}
SCENARIOS = {
    "logs": "each job's rank-0 pod runs and prints a line every {every:g} s",
    "no-pods": "jobs whose pods do not exist yet (as when they wait for quota)",
}
FIGURES = [
    ("requests_per_min", "API requests / min (WATCH excluded)"),
    ("cpu_pct", "triggerer CPU, % of one core"),
    ("pss_mib", "triggerer PSS, MiB"),
    ("runner_peak_rss_mib", "trigger runner peak RSS, MiB"),
    ("connections", "open connections to the API server"),
    ("runner_threads", "trigger runner threads"),
    ("p50_s", "detection p50, s"),
    ("p99_s", "detection p99, s"),
    ("burst_drain_s", "burst drained in, s"),
    ("loop_blocked_max_s", "event loop blocked, max s"),
    ("log_p50_s", "log line latency p50, s"),
    ("log_p99_s", "log line latency p99, s"),
    ("startup_s", "triggers started in, s"),
]


def report(results: list[dict[str, Any]], args: argparse.Namespace, machine: dict[str, str]) -> None:
    """One table per scenario (ratios: KubernetesJobTrigger / trainflow, trainflow / trainflow without logs),
    then the issue's targets for log streaming, checked."""
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        by = {r["impl"]: r for r in results if r["scenario"] == scenario}
        ours, plain, peer = by.get("trainflow", {}), by.get("trainflow-nologs", {}), by.get("cncf", {})
        rows = []
        for key, label in FIGURES:
            a, b, c = ours.get(key), plain.get(key), peer.get(key)
            if a is None and b is None and c is None:
                continue
            rows.append([label, a, b, c, B.ratio(c, a), B.ratio(a, b)])
        what = SCENARIOS[scenario].format(every=args.log_every)
        print(f"\nTriggerer, N = {args.n} deferred tasks in one triggerer, {what} ({machine['date']}, "
              f"load {machine['load_avg']})")  # fmt: skip
        heads = ["", *IMPLS.values(), "cncf / trainflow", "trainflow / no logs"]
        print(B.table(heads, rows))
        for r in by.values():
            extra = f", log lines {r['log_lines']}" if "log_lines" in r else ""
            print(
                f"{r['impl']}: detected {r['detected']}, drained {r['drained']}{extra}; requests {r['requests']}"
            )
        if ours and plain and peer:
            for line in targets(ours, plain, peer, args.n):
                print(line)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "results": results}, indent=1))


def targets(ours: dict[str, Any], plain: dict[str, Any], peer: dict[str, Any], n: int) -> list[str]:
    """Issue 19's targets for streaming waits against the same run without streaming and the peer."""
    extra = ours["runner_threads"] - plain["runner_threads"]
    checks = [
        (f"runner threads {ours['runner_threads']} ({extra:+d} over the run without logs: {extra / n:.3f} per "
         "task; a thread per task would be +{n})".replace("{n}", str(n)), extra <= 10),
        (f"peak RSS {ours['runner_peak_rss_mib'] / plain['runner_peak_rss_mib']:.2f}x the run without logs "
         "(target <= 1.25x)", ours["runner_peak_rss_mib"] <= 1.25 * plain["runner_peak_rss_mib"]),
        (f"detection p99 {ours['p99_s'] / plain['p99_s']:.2f}x the run without logs (target <= 1.10x)",
         ours["p99_s"] <= 1.10 * plain["p99_s"]),
    ]  # fmt: skip
    for key, name in (("connections", "connections"), ("cpu_pct", "CPU"), ("runner_peak_rss_mib", "peak RSS"),
                      ("pss_mib", "PSS"), ("p50_s", "detection p50"), ("p99_s", "detection p99")):  # fmt: skip
        checks.append((f"{name} {ours[key]} vs KubernetesJobTrigger {peer[key]}", ours[key] < peer[key]))
    lines = [f"  [{'ok' if good else 'MISSED'}] {text}" for text, good in checks]
    if "log_p99_s" in ours:
        lines.append(f"  log line latency p50 / p99 / max: {ours['log_p50_s']} / {ours['log_p99_s']} / "
                     f"{ours['log_max_s']} s ({ours['log_lines']} lines; {ours['log_under_1s']:.0%} under 1 s)")  # fmt: skip
    return lines


if __name__ == "__main__":
    sys.exit(main())
