"""Wait cost and detection latency: N TrainJobs waited on concurrently by one process, trainflow vs the peers.

Per N (one namespace, N TrainJobs the Trainer controller skips, status "running" written by the benchmark):

* trainflow  — ``KubernetesBackend.wait_async`` for every job in one event loop (the Airflow triggerer path;
  the waiters share one watch per namespace).
* poll       — what Airflow's ``KubernetesJobTrigger`` does, for TrainJobs: one GET per job every 10 s in one
  event loop (``--poll-fresh-client`` also opens a new ApiClient per poll, as the provider's hook does).
* sdk        — Kubeflow SDK 0.5.0 ``TrainerClient.wait_for_job_status`` (polling_interval 2 s), one thread per
  job sharing one TrainerClient (the SDK is sync only); only for N <= ``--sdk-max``.

Each waiter runs in its own subprocess. Measured while every job is still running (a steady window):
API requests per job-minute (kube-apiserver ``apiserver_request_total`` delta on the resources waiters
touch, minus the idle baseline), open connections to the API server, CPU of the waiter; then detection
latency: ``Complete`` is written to a random sample of jobs one at a time, latency = waiter returned -
moment the status write was sent; then the rest complete at once (burst) and the waiter must drain.
Peak RSS is the waiter's VmHWM at exit. ``--reports K`` writes K trainerStatus reports to every job while
it is waited on (before the window), so each waiter's metrics history holds K + 1 points at the end.

The waiters themselves are in waiters.py; this file orchestrates and reports.

Usage: python benchmarks/wait_cost.py --n 1 --n 100 [--impls trainflow,poll,sdk] [--window 30] [--json f]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B
from waiters import waiter_main


def _read_ready(proc: subprocess.Popen[str], timeout: float) -> None:
    box: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("READY"):
                box.append(line)
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        proc.kill()
        raise RuntimeError(f"waiter did not get ready within {timeout:.0f}s (rc={proc.poll()})")


def measure(
    api: Any,
    kubeconfig: str,
    namespace: str,
    names: list[str],
    impl: str,
    cfg: argparse.Namespace,
    baseline_rate: float,
    workdir: Path,
) -> dict[str, Any]:
    n = len(names)
    port = B.server_port(api)
    names_file = workdir / "names.txt"
    names_file.write_text("\n".join(names))
    out_file = workdir / f"out-{impl}-{n}.json"
    err_file = workdir / f"err-{impl}-{n}.log"
    argv = [
        sys.executable, __file__, "--role", "waiter", "--impl", impl, "--kubeconfig", kubeconfig,
        "--namespace", namespace, "--names-file", str(names_file), "--out", str(out_file),
    ]  # fmt: skip
    started = time.time()
    with open(err_file, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=B.ROOT)
    try:
        try:
            _read_ready(proc, 120 + n / 20)
        except RuntimeError as exc:
            raise RuntimeError(f"{impl}: {exc}\n{err_file.read_text()[-3000:]}") from exc
        ready_s = time.time() - started
        for k in range(cfg.reports):  # each job reports while the waiter watches: its history grows
            B.set_statuses(
                api, namespace, names, lambda k=k: _report_status(k, cfg.reports), workers=cfg.workers
            )
        time.sleep(cfg.warmup)

        # steady window: every job running, nobody completes
        c0, cpu0, t0 = B.request_counts(api), B.cpu_seconds(proc.pid), time.time()
        conns: list[int] = []
        rss: list[int] = []
        steps = 4
        for _ in range(steps):
            time.sleep(cfg.window / steps)
            conns.append(B.connections_to(proc.pid, port))
            rss.append(B.status_kib(proc.pid, "VmRSS"))
        c1, cpu1, t1 = B.request_counts(api), B.cpu_seconds(proc.pid), time.time()
        window = t1 - t0
        d = B.delta(c1, c0)
        raw = B.waiter_requests(d, watches=False)
        polls = max(0.0, raw - baseline_rate * window)

        # detection latency: a random sample completes one at a time, then the rest at once
        sample = random.sample(names, min(n, cfg.sample))
        sent: dict[str, float] = {}
        for name in sample:
            body = B.complete_status()
            sent[name] = time.time()
            B.patch_status(api, namespace, name, body)
            time.sleep(cfg.spacing)
        rest = [x for x in names if x not in sent]
        burst_sent = B.set_statuses(api, namespace, rest, B.complete_status, workers=16) if rest else {}
        burst_written = time.time()
        try:
            proc.wait(timeout=cfg.drain_timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{impl} waiter did not finish within {cfg.drain_timeout}s") from exc
        c2 = B.request_counts(api)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(
            f"{impl} waiter failed (rc={proc.returncode}); see {err_file}:\n{err_file.read_text()[-2000:]}"
        )
    res = json.loads(out_file.read_text())
    returned: dict[str, float] = res["returned"]
    lat = [(returned[x] - sent[x]) * 1000 for x in sent if x in returned]
    burst_lat = [(returned[x] - burst_sent[x]) * 1000 for x in burst_sent if x in returned]
    drain = (max(returned[x] for x in burst_sent) - burst_written) if burst_sent else 0.0
    total_window = time.time() - t1
    completion = max(
        0.0, B.waiter_requests(B.delta(c2, c1), watches=False) - n - baseline_rate * total_window
    )
    # a watch is counted by the API server when it ends (every 5 min): take the waiter's own count of
    # watch requests over its life (initial one included) as its rate
    lifetime = res["t_end"] - res["t_start"]
    watch_rate = float(res.get("stats", {}).get("watches", 0)) / lifetime
    reqs = polls + watch_rate * window
    seen = res.get("seen") or {}
    seen_lat = [(seen[x] - sent[x]) * 1000 for x in sent if x in seen]
    return {
        "impl": impl,
        "n": n,
        "ready_s": round(ready_s, 2),
        "window_s": round(window, 1),
        "requests": round(reqs, 1),
        "requests_raw": raw,
        "req_per_job_min": reqs / (n * window / 60),
        "req_per_s": reqs / window,
        "breakdown": B.breakdown(d),
        "connections_max": max(conns),
        "connections": conns,
        "cpu_s_window": round(cpu1 - cpu0, 3),
        "cpu_pct_core": 100 * (cpu1 - cpu0) / window,
        "rss_mib_steady": max(rss) / 1024,
        "peak_rss_mib": res["self"]["vmhwm_mib"],
        "cpu_s_total": round(res["self"]["cpu_user_s"] + res["self"]["cpu_sys_s"], 2),
        "watch_requests_per_min": watch_rate * 60,
        "event_latency_ms_p50": B.percentile(seen_lat, 0.5),
        "event_latency_ms_p99": B.percentile(seen_lat, 0.99),
        "latency_ms_p50": B.percentile(lat, 0.5),
        "latency_ms_p99": B.percentile(lat, 0.99),
        "latency_ms_max": max(lat) if lat else float("nan"),
        "latency_samples": len(lat),
        "burst_jobs": len(burst_sent),
        "burst_latency_ms_p50": B.percentile(burst_lat, 0.5),
        "burst_latency_ms_p99": B.percentile(burst_lat, 0.99),
        "burst_drain_s": round(drain, 2),
        "completion_requests_per_job": completion / n,
        "missing": n - len(returned),
        "errors": res.get("errors", []),
        "stats": res.get("stats", {}),
    }


def _report_status(k: int, of: int) -> dict[str, Any]:
    """A running job's status after its training code's k-th report (as the Trainer's status server writes)."""
    trainer = {
        "progressPercentage": (k + 1) * 90 // of,
        "estimatedRemainingSeconds": 60 * (of - k),
        "metrics": [{"name": "loss", "value": repr(1.0 / (k + 1))}, {"name": "lr", "value": "0.001"}],
        "lastUpdatedTime": B.now_rfc3339(),
    }
    return {**B.RUNNING_STATUS, "trainerStatus": trainer}


def run_n(api: Any, kubeconfig: str, n: int, cfg: argparse.Namespace) -> list[dict[str, Any]]:
    namespace = f"bench-wait-{n}-{int(time.time()) % 100000}"
    names = [f"w{i:05d}" for i in range(n)]
    B.create_namespace(api, namespace)
    rows: list[dict[str, Any]] = []
    try:
        created_s = B.create_trainjobs(api, namespace, names, workers=cfg.workers)
        print(
            f"[wait N={n}] created {n} TrainJobs in {created_s:.1f}s ({n / created_s:.0f}/s)", file=sys.stderr
        )
        # idle baseline: what the rest of the control plane does on these resources without a waiter
        B.set_statuses(api, namespace, names, lambda: B.RUNNING_STATUS, workers=cfg.workers)
        time.sleep(2)
        b0, tb0 = B.request_counts(api), time.time()
        time.sleep(cfg.baseline)
        b1, tb1 = B.request_counts(api), time.time()
        baseline_rate = B.waiter_requests(B.delta(b1, b0), watches=False) / (tb1 - tb0)
        with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as tmp:
            for i, impl in enumerate(cfg.impls):
                if impl == "sdk" and n > cfg.sdk_max:
                    print(f"[wait N={n}] sdk skipped (N > --sdk-max {cfg.sdk_max})", file=sys.stderr)
                    continue
                if impl == "poll-fresh" and n > cfg.fresh_max:
                    print(
                        f"[wait N={n}] poll-fresh skipped (N > --fresh-max {cfg.fresh_max})", file=sys.stderr
                    )
                    continue
                if i > 0:
                    B.set_statuses(api, namespace, names, lambda: B.RUNNING_STATUS, workers=cfg.workers)
                    time.sleep(2)
                row = measure(api, kubeconfig, namespace, names, impl, cfg, baseline_rate, Path(tmp))
                row["baseline_req_per_s"] = baseline_rate
                rows.append(row)
                print(f"[wait N={n}] {summary(row)}", file=sys.stderr)
    finally:
        B.delete_namespace(api, namespace, wait=cfg.cleanup_wait)
    return rows


def summary(r: dict[str, Any]) -> str:
    return (
        f"{r['impl']:>10}: {r['req_per_job_min']:8.3f} req/job-min  conns {r['connections_max']:3d}  "
        f"cpu {r['cpu_pct_core']:6.2f}%  rss {r['peak_rss_mib']:6.1f} MiB  "
        f"latency p50 {r['latency_ms_p50']:8.1f} ms p99 {r['latency_ms_p99']:8.1f} ms  "
        f"(event p99 {r.get('event_latency_ms_p99', float('nan')):.1f} ms)  "
        f"burst drain {r['burst_drain_s']:.2f}s  missing {r['missing']}"
    )


def report(rows: list[dict[str, Any]]) -> str:
    """One table: each peer's figures and the ratio peer / trainflow in the same run."""
    ours = {r["n"]: r for r in rows if r["impl"] == "trainflow"}
    headers = [
        "N", "waiter", "req/job-min", "conns", "CPU % core", "peak RSS MiB",
        "latency p50 ms", "latency p99 ms", "burst drain s",
    ]  # fmt: skip
    out = []
    for r in rows:
        t = ours.get(r["n"])
        is_peer = t is not None and r is not t

        def cell(
            key: str, fmt: str, r: dict[str, Any] = r, t: dict[str, Any] | None = t, peer: bool = is_peer
        ) -> str:
            text = format(r[key], fmt)
            return f"{text} ({B.ratio(r[key], t[key])})" if peer and t is not None else text

        out.append([
            r["n"], r["impl"], cell("req_per_job_min", ".3f"), cell("connections_max", "d"),
            cell("cpu_pct_core", ".2f"), cell("peak_rss_mib", ".0f"), cell("latency_ms_p50", ".1f"),
            cell("latency_ms_p99", ".1f"), f"{r['burst_drain_s']:.2f}",
        ])  # fmt: skip
    return B.table(headers, out)


def growth(rows: list[dict[str, Any]]) -> str:
    """Per-job cost from the smallest N >= 100 to the largest N, per waiter."""
    lines = []
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = sorted((r for r in rows if r["impl"] == impl and r["n"] >= 100), key=lambda r: r["n"])
        if len(mine) < 2:
            continue
        a, b = mine[0], mine[-1]
        k = b["n"] / a["n"]
        lines.append([
            impl, f"{a['n']} -> {b['n']}",
            f"{a['req_per_job_min']:.3f} -> {b['req_per_job_min']:.3f}",
            f"{a['cpu_pct_core'] / a['n'] * 1000:.2f} -> {b['cpu_pct_core'] / b['n'] * 1000:.2f}",
            f"{a['peak_rss_mib']:.0f} -> {b['peak_rss_mib']:.0f} (x{b['peak_rss_mib'] / a['peak_rss_mib']:.1f} for x{k:.0f} jobs)",
            f"{a['latency_ms_p99']:.1f} -> {b['latency_ms_p99']:.1f}",
        ])  # fmt: skip
    headers = ["waiter", "N", "req/job-min", "CPU % per 1000 jobs", "peak RSS MiB", "latency p99 ms"]
    return B.table(headers, lines) if lines else "(growth needs two N >= 100)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", default="orchestrator", choices=["orchestrator", "waiter"])
    p.add_argument("--impl", help="waiter role: trainflow | poll | poll-fresh | sdk")
    p.add_argument("--kubeconfig")
    p.add_argument("--namespace")
    p.add_argument("--names-file")
    p.add_argument("--out")
    p.add_argument("--n", type=int, action="append", help="number of TrainJobs (repeat)")
    p.add_argument("--impls", default="trainflow,poll,sdk")
    p.add_argument("--window", type=float, default=30.0, help="steady window seconds")
    p.add_argument("--warmup", type=float, default=12.0, help="seconds after the waiter is ready")
    p.add_argument("--baseline", type=float, default=10.0, help="idle baseline seconds")
    p.add_argument("--sample", type=int, default=100, help="jobs completed one at a time (latency sample)")
    p.add_argument("--spacing", type=float, default=0.05, help="seconds between sampled completions")
    p.add_argument("--sdk-max", type=int, default=1000, help="largest N the SDK peer runs at (threads)")
    p.add_argument("--fresh-max", type=int, default=1000, help="largest N for the poll-fresh peer")
    p.add_argument("--workers", type=int, default=16, help="concurrent creates/status writes")
    p.add_argument(
        "--reports",
        type=int,
        default=0,
        help="trainerStatus reports written to every job while it is waited on",
    )
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument("--cleanup-wait", type=float, default=300.0)
    p.add_argument("--json", help="write all figures here")
    args = p.parse_args()
    if args.role == "waiter":
        waiter_main(args)
        return
    args.impls = [x for x in args.impls.split(",") if x]
    kubeconfig = B.kubeconfig_path()
    api = B.api_client(kubeconfig, pool=max(32, args.workers * 2))
    rows: list[dict[str, Any]] = []
    for n in args.n or [1, 100]:
        rows += run_n(api, kubeconfig, n, args)
    print(report(rows))
    print()
    print(growth(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": B.machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
