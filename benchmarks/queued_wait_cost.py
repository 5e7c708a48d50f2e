"""What waiting on Kueue-queued TrainJobs costs, against waiting on running ones, in the same run.

N TrainJobs that Kueue manages (LocalQueue label), each with its Workload, in two namespaces of one testbed:

* queued  — suspended, Suspended condition; the Workload not admitted (``QuotaReserved=False``, Kueue's
  "insufficient unused quota" message), so every waiter shows Kueue's reason;
* running — resumed, one active pod; the Workload admitted.

One waiter process per scenario runs ``KubernetesBackend.wait_async`` for all N jobs in one event loop (the
Airflow triggerer path: one TrainJob watch, one pod watch and one Workload watch per namespace). The statuses are
written here (the benchmark TrainJobs carry ``managedBy: kueue.x-k8s.io/multikueue`` so the Trainer leaves
them alone, and no Kueue controller runs on the benchmark testbed: Kueue's CRDs are installed from the pinned
build when missing). Measured per waiter: every API request it sends over its whole life (counted in the
waiter, by verb and resource), the steady window's requests as the API server counts them
(``apiserver_request_total`` on the resources waiters touch, idle baseline subtracted), its open connections to
the API server, CPU, and peak RSS (VmHWM).

Usage: python benchmarks/queued_wait_cost.py --n 1000 [--window 30] [--warmup 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "bench-queue"
RESOURCES = B.WAIT_RESOURCES | {"workloads"}
PENDING = "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default, 1 more needed"


# --- the measured process ----------------------------------------------------------------------------------
async def _wait(kubeconfig: str, namespace: str, names: list[str], out_file: str) -> None:
    from trainflow.core.kube.aio import AsyncKubeApi
    from trainflow.core.kube.backend import KubernetesBackend
    from trainflow.core.kube.shared_watch import registry

    sent: dict[str, int] = {}  # every request the waiter sends, by verb and resource (retries included)
    original = AsyncKubeApi.run

    async def counted(self: Any, call: Any) -> Any:
        key = f"{call.verb} {call.resource}"
        sent[key] = sent.get(key, 0) + 1
        return await original(self, call)

    AsyncKubeApi.run = counted  # type: ignore[method-assign]
    backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=namespace)
    reasons: dict[str, str] = {}

    def on_update(result: Any) -> None:
        reasons[result.name] = result.status_text

    tasks = [asyncio.create_task(backend.wait_async(n, timeout=3600, on_update=on_update)) for n in names]
    watch = None
    while watch is None or not (watch.settled.is_set() and (watch.queue.synced or watch.queue.off)):
        await asyncio.sleep(0.05)
        watch = next(iter(registry().watches.values()), None)
    await asyncio.sleep(1.0)
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)  # the parent closes stdin: report
    await stop.wait()
    stats = {k: dict(vars(getattr(watch, k))) for k in ("stats", "pod_stats", "queue_stats")}
    Path(out_file).write_text(json.dumps({"stats": stats, "sent": sent, "reasons": reasons, **B.self_peak()}))
    for t in tasks:
        t.cancel()


def waiter_main(a: argparse.Namespace) -> None:
    names = Path(a.names_file).read_text().split()
    asyncio.run(_wait(a.kubeconfig, a.namespace, names, a.out))


# --- fixtures ----------------------------------------------------------------------------------------------
def ensure_workload_crd(api: Any) -> None:
    """Kueue's Workload CRD from the pinned build (testbed/kueue/build.sh), when the testbed has none. A
    testbed running Kueue is refused: its controller and webhooks would rewrite the fixtures."""
    import yaml
    from kubernetes import client

    try:
        client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
            "kueue-mutating-webhook-configuration"
        )
        sys.exit("Kueue runs on this testbed: use one without it (make bench's, or up.sh without --kueue)")
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.read_custom_resource_definition("workloads.kueue.x-k8s.io")
        return
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    build = subprocess.run(
        ["bash", "testbed/kueue/build.sh"], cwd=B.ROOT, capture_output=True, text=True, check=True
    )
    crd = yaml.safe_load(
        (Path(build.stdout.strip()) / "manifests/crd/kueue.x-k8s.io_workloads.yaml").read_text()
    )
    crd["spec"].pop("conversion", None)  # served as stored (v1beta2); no conversion webhook without Kueue
    ext.create_custom_resource_definition(crd)
    for _ in range(240):
        got = ext.read_custom_resource_definition("workloads.kueue.x-k8s.io")
        if any(c.type == "Established" and c.status == "True" for c in got.status.conditions or []):
            return
        time.sleep(0.5)
    raise RuntimeError("the Workload CRD did not become established")


def _cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": B.now_rfc3339(),
    }


def make_jobs(api: Any, namespace: str, names: list[str], queued: bool, workers: int) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)

    def one(name: str) -> None:
        tj = B.trainjob(name, namespace)
        tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
        tj["spec"]["suspend"] = queued
        made = custom.create_namespaced_custom_object(B.GROUP, B.VERSION, namespace, B.PLURAL, tj)
        status = (
            {"conditions": [_cond("Suspended", "True", "Suspended", "TrainJob is suspended")]}
            if queued
            else {
                **B.RUNNING_STATUS,
                "conditions": [_cond("Suspended", "False", "Resumed", "TrainJob is resumed")],
            }
        )
        B.patch_status(api, namespace, name, status)
        uid = made["metadata"]["uid"]
        wl = {
            "apiVersion": "/".join(KUEUE),
            "kind": "Workload",
            "metadata": {
                "name": f"trainjob-{name}-bench",
                "labels": {"kueue.x-k8s.io/job-uid": uid},
                "ownerReferences": [
                    {
                        "apiVersion": f"{B.GROUP}/{B.VERSION}",
                        "kind": "TrainJob",
                        "name": name,
                        "uid": uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "queueName": QUEUE,
                "podSets": [
                    {
                        "name": "node",
                        "count": 1,
                        "template": {
                            "spec": {"containers": [{"name": "node", "image": "registry.invalid/bench:0"}]}
                        },
                    }
                ],
            },
        }
        custom.create_namespaced_custom_object(*KUEUE, namespace, "workloads", wl)
        conditions = (
            [_cond("QuotaReserved", "False", "Pending", PENDING)]
            if queued
            else [
                _cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue bench"),
                _cond("Admitted", "True", "Admitted", "The workload is admitted"),
            ]
        )
        wl_status: dict[str, Any] = {"conditions": conditions}
        if not queued:
            wl_status["admission"] = {
                "clusterQueue": "bench",
                "podSetAssignments": [
                    {"name": "node", "count": 1, "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": "1"}}
                ],
            }
        custom.patch_namespaced_custom_object_status(
            *KUEUE, namespace, "workloads", wl["metadata"]["name"], {"status": wl_status}
        )

    B.parallel(one, names, workers)


# --- one scenario --------------------------------------------------------------------------------------------
def requests_of(d: dict[tuple[str, str, str], float]) -> float:
    return sum(v for (verb, res, _sub), v in d.items() if res in RESOURCES and verb != "WATCH")


def measure(
    api: Any, kubeconfig: str, scenario: str, n: int, a: argparse.Namespace, work: Path
) -> dict[str, Any]:
    namespace = f"bench-kueue-{scenario}-{int(time.time()) % 100000}"
    B.create_namespace(api, namespace)
    try:
        names = [f"{scenario}-{i:05d}" for i in range(n)]
        make_jobs(api, namespace, names, scenario == "queued", a.workers)
        base0 = B.request_counts(api)
        time.sleep(a.baseline)
        baseline_rate = requests_of(B.delta(B.request_counts(api), base0)) / a.baseline
        (work / "names.txt").write_text("\n".join(names))
        out = work / f"{scenario}.json"
        argv = [
            sys.executable,
            __file__,
            "--role",
            "waiter",
            "--kubeconfig",
            kubeconfig,
            "--namespace",
            namespace,
            "--names-file",
            str(work / "names.txt"),
            "--out",
            str(out),
        ]
        port = B.server_port(api)
        started = time.time()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=B.ROOT)
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{scenario}: the waiter did not get ready")
        ready_s = time.time() - started
        time.sleep(a.warmup)
        c0, cpu0, t0 = B.request_counts(api), B.cpu_seconds(proc.pid), time.time()
        conns = []
        for _ in range(4):
            time.sleep(a.window / 4)
            conns.append(B.connections_to(proc.pid, port))
        c1, cpu1, t1 = B.request_counts(api), B.cpu_seconds(proc.pid), time.time()
        proc.stdin.close()  # report and exit
        proc.wait(60)
        steady = requests_of(B.delta(c1, c0)) - baseline_rate * (t1 - t0)
        report = json.loads(out.read_text())
        with_reason = sum(1 for text in report["reasons"].values() if "insufficient unused quota" in text)
        return {
            "scenario": scenario,
            "n": n,
            "ready_s": round(ready_s, 1),
            "requests_life": sum(report["sent"].values()),
            "requests_by_kind": report["sent"],
            "requests_per_job_min": round(max(steady, 0.0) / n / ((t1 - t0) / 60), 5),
            "open_conns": max(conns),
            "cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
            "peak_rss_mib": round(report["vmhwm_mib"], 1),
            "showing_kueue_reason": with_reason,
            "watch_stats": report["stats"],
        }
    finally:
        B.delete_namespace(api, namespace)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", default="bench", choices=["bench", "waiter"])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--baseline", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--json")
    p.add_argument("--kubeconfig")
    p.add_argument("--namespace")
    p.add_argument("--names-file")
    p.add_argument("--out")
    a = p.parse_args()
    if a.role == "waiter":
        return waiter_main(a)
    kubeconfig = B.kubeconfig_path()
    api = B.api_client(kubeconfig)
    ensure_workload_crd(api)
    work = Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip())
    rows = [measure(api, kubeconfig, s, a.n, a, work) for s in ("running", "queued")]
    run, q = rows
    headers = [
        "N",
        "waiters",
        "API requests (life)",
        "req / job-min (steady)",
        "open conns",
        "CPU %",
        "peak RSS MiB",
        "show Kueue's reason",
    ]
    table = [
        [
            r["n"],
            r["scenario"],
            r["requests_life"],
            r["requests_per_job_min"],
            r["open_conns"],
            r["cpu_pct"],
            r["peak_rss_mib"],
            r["showing_kueue_reason"],
        ]
        for r in rows
    ]
    print(B.table(headers, table))
    print(
        f"queued / running: requests {B.ratio(q['requests_life'], run['requests_life'])}, connections "
        f"{B.ratio(q['open_conns'], run['open_conns'])}, peak RSS {B.ratio(q['peak_rss_mib'], run['peak_rss_mib'])}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": B.machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
