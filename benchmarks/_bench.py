"""Shared helpers of the benchmarks: the testbed's API server, its request metrics, TrainJob fixtures, process stats.

The benchmarks isolate the waiting machinery: their TrainJobs carry ``spec.managedBy: kueue.x-k8s.io/multikueue``
(the Trainer controller leaves them alone) and their status is written here through the ``status``
subresource, at moments the benchmark measures.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
RUNTIME = "torch-distributed"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
# Resources the waiters touch: trainflow (trainjobs watch/list/get, pods + log at completion, events when a
# job looks stuck), the SDK (trainjobs, runtimes, pods), the poll loop (trainjobs).
WAIT_RESOURCES = frozenset({"trainjobs", "trainingruntimes", "clustertrainingruntimes", "pods", "events"})
BENCH_LABEL = "trainflow.dev/benchmark"


def testbed_dir() -> Path:
    return Path(os.environ.get("TRAINFLOW_TESTBED_DIR", "/tmp/trainflow-testbed"))


def kubeconfig_path() -> str:
    path = os.environ.get("TRAINFLOW_BENCH_KUBECONFIG") or str(testbed_dir() / "kubeconfig")
    if not Path(path).exists():
        sys.exit(
            f"no kubeconfig at {path}: start a testbed first, e.g.\n"
            "  TRAINFLOW_TESTBED_DIR=/tmp/trainflow-bench TRAINFLOW_TESTBED_PORT_BASE=29380 bash testbed/up.sh"
        )
    return path


def api_client(kubeconfig: str, pool: int = 32) -> Any:
    """A sync kubernetes ApiClient for the benchmark's own writes (not the measured process)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def server_port(api: Any) -> int:
    return int(re.sub(r".*:(\d+)/?$", r"\1", api.configuration.host))


# --- API server request metrics ------------------------------------------------------------------------
_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def request_counts(api: Any) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` summed by (verb, resource, subresource) — one GET of /metrics."""
    # rest_client.request has the same shape in kubernetes 30 (the bench venv) and 36 (the Airflow venv)
    headers = {}
    token = (api.configuration.api_key or {}).get("authorization")
    if token:
        prefix = (api.configuration.api_key_prefix or {}).get("authorization")
        headers["Authorization"] = f"{prefix} {token}" if prefix else token
    resp = api.rest_client.request("GET", f"{api.configuration.host}/metrics", headers=headers)
    text = resp.data.decode() if isinstance(resp.data, bytes) else str(resp.data)
    counts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        counts[key] = counts.get(key, 0.0) + float(m["value"])
    return counts


def delta(
    after: dict[tuple[str, str, str], float], before: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def waiter_requests(d: dict[tuple[str, str, str], float], *, watches: bool = True) -> float:
    """Requests the waiters could have made: everything on the resources they touch.

    ``watches=False`` leaves WATCH out: the API server counts a watch when it ends, so controllers'
    watch renewals land in any window at random; waiters' watches are counted from their own stats.
    """
    return sum(
        v for (verb, res, _sub), v in d.items() if res in WAIT_RESOURCES and (watches or verb != "WATCH")
    )


def breakdown(d: dict[tuple[str, str, str], float]) -> dict[str, int]:
    return {
        f"{verb} {res}{'/' + sub if sub else ''}": int(v)
        for (verb, res, sub), v in sorted(d.items(), key=lambda kv: -kv[1])
        if res in WAIT_RESOURCES
    }


# --- TrainJob fixtures ------------------------------------------------------------------------------------
def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainjob(name: str, namespace: str, *, managed_by: str | None = MULTIKUEUE) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "runtimeRef": {"name": RUNTIME, "kind": "ClusterTrainingRuntime", "apiGroup": GROUP},
        "trainer": {"numNodes": 1, "image": "registry.invalid/bench:0", "command": ["true"]},
    }
    if managed_by:
        spec["managedBy"] = managed_by
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {BENCH_LABEL: "wait"}},
        "spec": spec,
    }


RUNNING_STATUS: dict[str, Any] = {
    "conditions": None,
    "jobsStatus": [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}],
}


def complete_status() -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "JobsCompleted",
                "message": "benchmark: completed",
                "lastTransitionTime": now_rfc3339(),
            }
        ],
        "jobsStatus": [
            {"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}
        ],
        # what the Trainer's status server holds once rank 0 called report() (TrainJobStatus gate)
        "trainerStatus": {
            "progressPercentage": 100,
            "metrics": [{"name": "loss", "value": "0.125"}],
            "lastUpdatedTime": now_rfc3339(),
        },
    }


def create_namespace(api: Any, namespace: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace, "labels": {BENCH_LABEL: "true"}}})


def delete_namespace(api: Any, namespace: str, wait: float = 0.0) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
    end = time.time() + wait
    while time.time() < end:
        try:
            core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
        time.sleep(1.0)


def namespaces(api: Any, prefix: str) -> list[str]:
    """The benchmarks' namespaces whose name starts with ``prefix``."""
    from kubernetes import client

    found = client.CoreV1Api(api).list_namespace(label_selector=f"{BENCH_LABEL}=true").items
    return [ns.metadata.name for ns in found if ns.metadata.name.startswith(prefix)]


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 16) -> list[Any]:
    """Run ``fn`` over ``items`` with bounded concurrency; raise the first error."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def create_trainjobs(api: Any, namespace: str, names: Sequence[str], workers: int = 16) -> float:
    """Create the TrainJobs (bounded concurrency); returns the seconds it took."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    start = time.perf_counter()
    parallel(
        lambda n: custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, trainjob(n, namespace)
        ),
        names,
        workers,
    )
    return time.perf_counter() - start


def patch_status(api: Any, namespace: str, name: str, status: dict[str, Any]) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


def set_statuses(
    api: Any, namespace: str, names: Sequence[str], status: Callable[[], dict[str, Any]], workers: int = 16
) -> dict[str, float]:
    """Write a status to every job concurrently; returns name -> epoch time just before its write was sent."""
    sent: dict[str, float] = {}
    lock = threading.Lock()

    def one(name: str) -> None:
        body = status()
        t = time.time()
        patch_status(api, namespace, name, body)
        with lock:
            sent[name] = t

    parallel(one, names, workers)
    return sent


# --- the measured process ---------------------------------------------------------------------------------
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a live process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def connections_to(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections of ``pid`` whose remote port is ``port`` (its fds matched to /proc/net/tcp)."""
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], parts[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in inodes:
                count += 1
    return count


def self_peak() -> dict[str, float]:
    """What a measured process reports about itself at exit."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_user_s": ru.ru_utime,
        "cpu_sys_s": ru.ru_stime,
        "maxrss_mib": ru.ru_maxrss / 1024,
        "vmhwm_mib": status_kib(os.getpid(), "VmHWM") / 1024,
    }


# --- reporting --------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ratio(peer: float | None, ours: float | None) -> str:
    """How many times the peer's figure is ours ("x" = peer / trainflow)."""
    if peer is None or ours is None or peer != peer or ours != ours:
        return "n/a"
    if ours <= 0:
        return "inf" if peer > 0 else "1x"
    r = peer / ours
    return f"{r:,.0f}x" if r >= 100 else f"{r:,.1f}x" if r >= 10 else f"{r:.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (also readable in a terminal)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> dict[str, str]:
    """Where and when the figures were taken."""
    from importlib.metadata import version

    def run(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return "?"

    mem = run("free", "-g").splitlines()
    versions = {}
    for pkg in ("kubernetes", "kubernetes_asyncio", "kubeflow", "torch", "apache-airflow"):
        try:
            versions[pkg] = version(pkg)
        except Exception:
            versions[pkg] = "-"
    server = "?"
    state = testbed_dir() / "state.json"
    if state.exists():
        with contextlib.suppress(ValueError):
            server = json.loads(state.read_text()).get("versions", {}).get("kubernetes", "?")
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": run("nproc"),
        "cpu": cpu,
        "memory": mem[1] if len(mem) > 1 else "?",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "api_server": server,
        "load_avg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        **versions,
    }
