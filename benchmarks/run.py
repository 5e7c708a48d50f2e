"""Run every benchmark and print one table of figures with their ratios to the peers measured in the same run.

    python benchmarks/run.py --quick   # CI: N = 1, 100, 1000, short windows, SDK peer up to N = 100, and
                                       # 100 deferred tasks with rank-0 logs flowing in a real Airflow triggerer
    python benchmarks/run.py --full    # N up to 5,000, 60 s windows, SDK peer up to N = 1,000, and the
                                       # triggerer benchmark at 1,000 deferred tasks (logs flowing; no pods yet)

Needs a running testbed (``TRAINFLOW_TESTBED_DIR``, see testbed/up.sh; ``--objstore`` for the artifact benchmark). The cluster benchmarks run in
their own environment (``~/.cache/trainflow-bench/venv``: the locked core + ``bench`` extra, i.e.
kubeflow 0.5.0 beside kubernetes 30.1), synced here with ``uv sync --frozen --extra bench``, so that a
``uv sync`` of the shared .venv without the extra cannot remove the SDK mid-run. The local-engine and
DAG-parse benchmarks need torch and Airflow and run with this interpreter (the project's .venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

HERE = Path(__file__).resolve().parent
BENCH_ENV = Path(os.environ.get("TRAINFLOW_BENCH_VENV", Path.home() / ".cache" / "trainflow-bench" / "venv"))

MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "wait": ["--n", "1", "--n", "100", "--n", "1000", "--window", "15", "--warmup", "10",
                 "--baseline", "5", "--sample", "30", "--sdk-max", "100", "--impls", "trainflow,poll,sdk"],
        "submit": ["--jobs", "20", "--threads", "8"],
        "queued": ["--n", "1000", "--window", "15", "--warmup", "5"],
        "local": ["--trivial-runs", "3", "--torch-runs", "1"],
        "parse": ["--runs", "3"],
        "artifacts": ["--big-mib", "1024", "--files", "1000", "--file-kib", "64"],
        # a real Airflow deployment (Postgres + one triggerer): 100 deferred tasks whose rank-0 logs flow
        "triggerer": ["--n", "100", "--window", "20", "--warmup", "12", "--baseline", "5", "--sample", "30",
                      "--scenarios", "logs"],
    },
    "full": {
        "wait": ["--n", "1", "--n", "100", "--n", "1000", "--n", "5000", "--window", "60", "--warmup", "15",
                 "--baseline", "15", "--sample", "200", "--sdk-max", "1000", "--fresh-max", "100",
                 "--workers", "24", "--impls", "trainflow,poll,poll-fresh,sdk"],
        "submit": ["--jobs", "60", "--threads", "8"],
        "queued": ["--n", "1000", "--window", "60", "--warmup", "15", "--baseline", "15"],
        "local": ["--trivial-runs", "10", "--torch-runs", "3"],
        "parse": ["--runs", "9"],
        "artifacts": ["--big-mib", "1024", "--files", "1000", "--file-kib", "64"],
        # 1,000 deferred tasks, rank-0 logs flowing and jobs without pods yet (~40 min)
        "triggerer": ["--n", "1000", "--window", "60", "--sample", "200"],
    },
}  # fmt: skip


def bench_python() -> str:
    """The benchmark environment's python (created/synced from uv.lock with the bench extra)."""
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(BENCH_ENV)}
    subprocess.run(
        [uv, "sync", "--frozen", "--extra", "bench", "-p", "3.11", "--quiet"], cwd=B.ROOT, env=env, check=True
    )
    return str(BENCH_ENV / "bin" / "python")


BOTO3 = (
    "boto3==1.44.18"  # the peer of s3:// publish and download, in a venv of its own (it pins python-dateutil)
)


def boto3_python() -> str:
    """A venv with boto3 alone, for the artifact benchmark's peer."""
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    venv = BENCH_ENV.parent / "boto3-venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([uv, "venv", "-p", "3.11", "--quiet", str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "-p", str(venv / "bin" / "python"), BOTO3], check=True)
    return str(venv / "bin" / "python")


def airflow_python() -> str:
    """The Airflow venv of tests/airflow_deploy (newest Airflow + cncf.kubernetes, the triggerer benchmark's peer)."""
    subprocess.run(
        ["bash", str(B.ROOT / "tests" / "airflow_deploy" / "system_deps.sh"), "--no-browser"], check=True
    )
    out = subprocess.run(
        ["bash", str(B.ROOT / "tests" / "airflow_deploy" / "venv.sh"), "3.3"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1] + "/bin/python"


def step(title: str, argv: list[str], timeout: float, log: Path) -> tuple[int, str]:
    """Run one benchmark; its stdout is returned and echoed, its stderr (progress) goes to ``log``."""
    print(f"\n=== {title}: {' '.join(argv[1:])}  (progress: {log})", flush=True)
    start = time.time()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with open(log, "w") as err:
        try:
            proc = subprocess.run(
                argv, cwd=B.ROOT, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired as exc:
            print(f"--- {title}: timed out after {timeout:.0f}s", flush=True)
            return 124, str(exc.stdout or "")
    out = proc.stdout
    print(out.rstrip())
    if proc.returncode != 0:
        free = ", ".join(
            f"{d} {shutil.disk_usage(d).free / (1 << 30):.1f} GiB"
            for d in (tempfile.gettempdir(), Path.home())
        )
        print(
            f"--- {title} failed (rc={proc.returncode}; free: {free}):\n{log.read_text()[-3000:]}", flush=True
        )
    print(f"--- {title}: {time.time() - start:.0f}s", flush=True)
    return proc.returncode, out


def local_figures(text: str) -> dict[str, float]:
    found = {}
    for label, h, e in re.findall(r"^\s*(\S+): by hand\s+([\d.]+)s\s+engine\s+([\d.]+)s", text, re.M):
        found[label] = (float(h), float(e))
    return {f"{k}_{w}": v[i] for k, v in found.items() for i, w in enumerate(("hand_s", "engine_s"))}


def parse_figures(text: str) -> dict[str, float]:
    base = re.search(r"without trainflow:\s+([\d.]+) ms", text)
    with_tf = re.search(r"with trainflow:\s+([\d.]+) ms", text)
    return {"base_ms": float(base[1]), "with_ms": float(with_tf[1])} if base and with_tf else {}


def summary_table(res: dict[str, Any]) -> str:
    """One table: figure, trainflow, peer, ratio (peer / trainflow unless noted)."""
    rows: list[list[Any]] = []
    wait = res.get("wait", {}).get("rows", [])
    by = {(r["impl"], r["n"]): r for r in wait}
    for n in sorted({r["n"] for r in wait}):
        t = by.get(("trainflow", n))
        if t is None:
            continue
        for impl, label in (("poll", "10 s poll (Airflow-style)"), ("poll-fresh", "10 s poll, new client per poll"),
                            ("sdk", "Kubeflow SDK wait_for_job_status")):  # fmt: skip
            peer = by.get((impl, n))
            if peer is None:
                continue
            for key, name, fmt in (
                ("req_per_job_min", "API requests / job-minute", ".4f"),
                ("connections_max", "open connections", "d"),
                ("cpu_pct_core", "waiter CPU, % of one core", ".2f"),
                ("peak_rss_mib", "waiter peak RSS, MiB", ".0f"),
                ("latency_ms_p50", "detection latency p50, ms", ".1f"),
                ("latency_ms_p99", "detection latency p99, ms", ".1f"),
            ):
                rows.append(
                    [
                        f"N={n}",
                        name,
                        format(t[key], fmt),
                        label,
                        format(peer[key], fmt),
                        B.ratio(peer[key], t[key]),
                    ]
                )
    sub = res.get("submit")
    if sub:
        for mode, key in (
            ("sequential", "sequential_per_s"),
            (f"{sub['threads']} threads", "threaded_per_s"),
        ):
            t, s = sub["trainflow"][key], sub["sdk"][key]
            rows.append(["submit", f"TrainJobs created / s, {mode}", f"{t:.1f}", "SDK train()", f"{s:.1f}",
                         f"{B.ratio(t, s)} (trainflow / SDK)"])  # fmt: skip
            if "create" in sub:  # the floor: the POST alone
                c = sub["create"][key]
                rows.append(["submit", f"TrainJobs created / s, {mode}", f"{t:.1f}", "bare POST", f"{c:.1f}",
                             f"{B.ratio(t, c)} (trainflow / bare POST)"])  # fmt: skip
    queued = {r["scenario"]: r for r in (res.get("queued") or {}).get("rows", [])}
    if "queued" in queued and "running" in queued:
        q, r = queued["queued"], queued["running"]
        for key, name in (("requests_life", "API requests, whole wait"), ("open_conns", "open connections"),
                          ("peak_rss_mib", "waiter peak RSS, MiB")):  # fmt: skip
            rows.append([f"Kueue N={q['n']}", f"{name}: queued waiters", q[key], "running waiters", r[key],
                         f"{B.ratio(q[key], r[key])} (queued / running)"])  # fmt: skip
    loc = res.get("local") or {}
    if "torch-2x2_hand_s" in loc:
        h, e = loc["torch-2x2_hand_s"], loc["torch-2x2_engine_s"]
        rows.append(["local", "2x2 torch job, s (added vs by hand)", f"{e:.2f} ({e - h:+.2f})", "torchrun by hand",
                     f"{h:.2f}", f"{e / h:.2f} (engine / by hand)"])  # fmt: skip
    sdk_local = res.get("sdk_local")
    if sdk_local:
        rows.append(["local", "SDK LocalProcessBackend, same torch job", "-", "SDK local (1 node max)",
                     f"{sdk_local.get('status')} after {sdk_local.get('seconds')} s", "n/a (cannot run offline)"])  # fmt: skip
    rows += triggerer_rows((res.get("triggerer") or {}).get("results", []))
    art = res.get("artifacts") or {}
    for case, what in (("big", f"{art.get('big_mib')} MiB file"), ("many", f"{art.get('files')} files")):
        if case in art:
            c = art[case]
            for op in ("upload", "download"):
                commit = f" (manifest {c['trainflow']['commit_s'] * 1000:.0f} ms)" if op == "upload" else ""
                rows.append(["artifacts", f"s3:// {op}, {what}, s{commit}", f"{c['trainflow'][op + '_s']:.2f}",
                             f"boto3 {op}_file", f"{c['boto3'][op + '_s']:.2f}",
                             f"{c[op + '_ratio']:.2f} (trainflow / boto3)"])  # fmt: skip
    parse = res.get("parse") or {}
    if parse:
        rows.append(["parse", "DAG parse with trainflow, ms (added)", f"{parse['with_ms']:.1f} "
                     f"({parse['with_ms'] - parse['base_ms']:+.1f})", "same DAG without trainflow",
                     f"{parse['base_ms']:.1f}", f"{parse['with_ms'] / parse['base_ms']:.2f} (with / without)"])  # fmt: skip
    return B.table(["scope", "figure", "trainflow", "peer", "peer figure", "ratio"], rows)


def triggerer_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """Per scenario: TrainJobTrigger (log streaming on, the default) against KubernetesJobTrigger, and against
    itself with streaming off where the issue sets a bound (peak RSS, detection p99)."""
    rows: list[list[Any]] = []
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        by = {r["impl"]: r for r in results if r["scenario"] == scenario}
        t, plain, c = by.get("trainflow"), by.get("trainflow-nologs"), by.get("cncf")
        if t is None:
            continue
        scope = f"triggerer N={t['n']} ({scenario})"
        for key, name in (("requests_per_min", "API requests / min"), ("cpu_pct", "triggerer CPU, % of one core"),
                          ("pss_mib", "triggerer PSS, MiB"), ("runner_peak_rss_mib", "runner peak RSS, MiB"),
                          ("connections", "open connections"), ("runner_threads", "runner threads"),
                          ("p50_s", "detection p50, s"), ("p99_s", "detection p99, s"),
                          ("burst_drain_s", "burst drain, s")):  # fmt: skip
            if c is not None:
                rows.append(
                    [
                        scope,
                        name,
                        t[key],
                        "KubernetesJobTrigger(get_logs=True)",
                        c[key],
                        B.ratio(c[key], t[key]),
                    ]
                )
            if plain is not None and key in ("runner_peak_rss_mib", "p99_s", "runner_threads"):
                rows.append([scope, name, t[key], "TrainJobTrigger(stream_logs=False)", plain[key],
                             f"{B.ratio(t[key], plain[key])} (streaming / not)"])  # fmt: skip
        if "log_p99_s" in t:
            rows.append([scope, "log line latency p50 / p99, s", f"{t['log_p50_s']} / {t['log_p99_s']}",
                         "KubernetesJobTrigger: logs read once the job ended", "-", "n/a"])  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--full", action="store_true")
    p.add_argument(
        "--only",
        default="wait,submit,queued,local,sdk_local,parse,artifacts,triggerer",
        help="comma list of benchmarks",
    )
    p.add_argument("--out", default="/tmp/trainflow-bench-results", help="directory for JSON and logs")
    args = p.parse_args()
    mode = "full" if args.full else "quick"
    cfg = MODES[mode]
    only = set(args.only.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    B.kubeconfig_path()  # fail early without a testbed
    bpy = bench_python()
    res: dict[str, Any] = {"mode": mode, "machine": B.machine()}
    failed: list[str] = []

    def json_step(key: str, title: str, python: str, script: str, timeout: float) -> None:
        """One benchmark that writes its figures as JSON (``--json``) into ``res[key]``."""
        argv = [python, str(HERE / script), *cfg[key], "--json", str(out / f"{key}.json")]
        rc, _ = step(title, argv, timeout, out / f"{key}.log")
        if rc == 0:
            res[key] = json.loads((out / f"{key}.json").read_text())
        else:
            failed.append(key)

    if "wait" in only:
        json_step("wait", "wait cost + detection latency", bpy, "wait_cost.py", 7200)
    if "submit" in only:
        json_step("submit", "submit throughput", bpy, "submit_throughput.py", 1800)
    if "queued" in only:
        json_step("queued", "Kueue: queued vs running waiters", bpy, "queued_wait_cost.py", 1800)
    if "local" in only:
        rc, text = step(
            "local engine overhead",
            [sys.executable, str(HERE / "local_engine_overhead.py"), *cfg["local"]],
            1800,
            out / "local.log",
        )
        res["local"] = local_figures(text)
        if rc != 0:
            failed.append("local")
    if "sdk_local" in only:
        rc, text = step(
            "SDK LocalProcessBackend (offline)",
            [bpy, str(HERE / "sdk_local_process.py"), "--timeout", "120"],
            600,
            out / "sdk_local.log",
        )
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        res["sdk_local"] = json.loads(lines[-1]) if lines else {"status": f"rc={rc}", "seconds": None}
    if "parse" in only and (HERE / "dag_parse_overhead.py").exists():
        rc, text = step(
            "DAG-parse overhead",
            [sys.executable, str(HERE / "dag_parse_overhead.py"), *cfg["parse"]],
            900,
            out / "parse.log",
        )
        res["parse"] = parse_figures(text)
        if rc != 0:
            failed.append("parse")
    if "artifacts" in only:
        argv = [sys.executable, str(HERE / "artifact_overhead.py"), *cfg["artifacts"], "--peer-python",
                boto3_python(), "--json", str(out / "artifacts.json")]  # fmt: skip
        rc, _ = step("s3:// publish and download vs boto3", argv, 3600, out / "artifacts.log")
        if rc == 0:
            res["artifacts"] = json.loads((out / "artifacts.json").read_text())
        else:
            failed.append("artifacts")
    if "triggerer" in only and "triggerer" in cfg:
        title = "triggerer: N deferred tasks in one real triggerer"
        json_step("triggerer", title, airflow_python(), "triggerer_scale.py", 7200)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    print(f"\n=== trainflow benchmarks ({mode}) — {res['machine']['date']}, {res['machine']['nproc']} cores, "
          f"load {res['machine']['load_avg']}; ratio = peer / trainflow unless noted")  # fmt: skip
    print(summary_table(res))
    print(f"\nJSON: {out / 'results.json'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
