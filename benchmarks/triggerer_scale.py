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

Run with the Airflow venv (``tests/airflow_deploy/venv.sh 3.3``) and a testbed (``TRAINFLOW_TESTBED_DIR``):
    python benchmarks/triggerer_scale.py --n 1000 --window 60 --sample 200 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "airflow_deploy"))
import _bench as B
import airflow_stack

HERE = Path(__file__).resolve().parent

RESOURCES = frozenset({"trainjobs", "jobs", "pods", "events", "trainingruntimes", "clustertrainingruntimes"})
DAGS = {"trainflow": "tf_bench_trainjob", "cncf": "tf_bench_kubejob"}
POLL_INTERVAL = 10.0  # KubernetesJobOperator's job_poll_interval default


# --- fixtures on the cluster ------------------------------------------------------------------------------
def create_jobs(api: Any, namespace: str, names: list[str]) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(api)
    container = {"name": "base", "image": "registry.invalid/bench:0", "command": ["true"]}
    B.parallel(
        lambda n: batch.create_namespaced_job(
            namespace,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": n, "labels": {B.BENCH_LABEL: "triggerer"}},
                "spec": {
                    "managedBy": B.MULTIKUEUE,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                },
            },
        ),
        names,
    )


def job_status(state: str) -> dict[str, Any]:
    t = B.now_rfc3339()
    if state == "running":
        return {"startTime": t, "active": 1, "ready": 1}
    cond = {"status": "True", "reason": "CompletionsReached", "message": "benchmark", "lastTransitionTime": t}
    return {
        "active": 0,
        "ready": 0,
        "succeeded": 1,
        "completionTime": t,
        "conditions": [{**cond, "type": "SuccessCriteriaMet"}, {**cond, "type": "Complete"}],
    }


def write_status(api: Any, impl: str, namespace: str, name: str, state: str) -> None:
    from kubernetes import client

    if impl == "trainflow":
        body = B.RUNNING_STATUS if state == "running" else B.complete_status()
        B.patch_status(api, namespace, name, body)
    else:
        client.BatchV1Api(api).patch_namespaced_job_status(name, namespace, {"status": job_status(state)})


# --- deferred task instances (runs in a subprocess with the deployment's environment) ---------------------
def inject(dag_id: str, run_id: str, impl: str, namespace: str, kubeconfig: str) -> None:
    """Put every task instance of the run in the deferred state with its trigger, as the Execution API does."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    def trigger(i: int) -> Any:
        name = f"bench-{i:05d}"
        if impl == "trainflow":
            from trainflow.airflow.triggers import TrainJobTrigger

            return TrainJobTrigger(name=name, namespace=namespace, conn_id="kubeflow_trainer_default")
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        return KubernetesJobTrigger(
            job_name=name,
            job_namespace=namespace,
            pod_names=[f"{name}-pod"],
            pod_namespace=namespace,
            base_container_name="base",
            kubernetes_conn_id="kubernetes_default",
            poll_interval=POLL_INTERVAL,
            get_logs=True,
            do_xcom_push=False,
        )

    now = timezone.utcnow()
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        run.state, run.start_date = DagRunState.RUNNING, now
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        assert len(tis) > 1 and all(ti.map_index >= 0 for ti in tis), "the mapped task was not expanded"
        rows = []
        for ti in tis:
            classpath, kwargs = trigger(ti.map_index).serialize()
            rows.append((ti, Trigger(classpath=classpath, kwargs=kwargs)))
        session.add_all([t for _, t in rows])
        session.flush()
        for ti, t in rows:
            ti.state, ti.trigger_id, ti.next_method = TaskInstanceState.DEFERRED, t.id, "execute_complete"
            ti.try_number, ti.start_date, ti.queued_dttm = 1, now, now
    print(f"deferred {len(rows)} task instances of {dag_id}/{run_id}")


# --- the triggerer ------------------------------------------------------------------------------------------
def pss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def group_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += B.cpu_seconds(pid)
        except OSError:
            continue
    return total


def runner_pid(pids: list[int]) -> int:
    """The trigger runner: the triggerer's child that runs the triggers' event loop (the largest one)."""
    return max(pids, key=lambda p: B.status_kib(p, "VmRSS")) if pids else 0


def loop_stalls(log: Path, offset: int) -> dict[str, float]:
    """What this triggerer reported: event-loop stalls of the runner, heartbeat gaps of the supervisor."""
    import re

    with open(log, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    blocked = [float(x) for x in re.findall(r"async thread was blocked for ([0-9.]+) seconds", text)]
    gaps = [float(x) for x in re.findall(r"Heartbeat recovered after ([0-9.]+) seconds", text)]
    return {
        "loop_blocked_max_s": max(blocked, default=0.0),
        "loop_blocked_total_s": round(sum(blocked), 1),
        "heartbeat_gap_max_s": max(gaps, default=0.0),
    }


class Deferred:
    """Polls the metadata DB: when each task instance of a run left the deferred state (the trigger fired)."""

    def __init__(self, port: int, dag_id: str, run_id: str) -> None:
        import psycopg2

        self.db = psycopg2.connect(
            host="127.0.0.1", port=port, user="airflow", password="airflow", dbname="airflow"
        )
        self.db.autocommit = True
        self.dag_id, self.run_id = dag_id, run_id
        self.left: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        cur = self.db.cursor()
        while not self.stop.is_set():
            cur.execute(
                "SELECT map_index FROM task_instance WHERE dag_id=%s AND run_id=%s AND state <> 'deferred'",
                (self.dag_id, self.run_id),
            )
            t = time.time()
            for (index,) in cur.fetchall():
                self.left.setdefault(index, t)
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.db.close()


def measure(impl: str, args: argparse.Namespace, root: Path, api: Any) -> dict[str, Any]:
    state = airflow_stack.load(root)
    n, dag_id = args.n, DAGS[impl]
    namespace = f"bench-trig-{impl}-{uuid.uuid4().hex[:5]}"
    names = [f"bench-{i:05d}" for i in range(n)]
    B.create_namespace(api, namespace)
    if impl == "trainflow":
        B.create_trainjobs(api, namespace, names)
    else:
        create_jobs(api, namespace, names)
    B.parallel(lambda name: write_status(api, impl, namespace, name, "running"), names)
    run_id = f"bench-{impl}-{uuid.uuid4().hex[:6]}"
    out = airflow_stack.airflow_cli(state, "dags", "trigger", dag_id, "--run-id", run_id)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    env = {**airflow_stack.process_env(state), "TF_BENCH_TRIGGERER_N": str(n)}
    subprocess.run(
        [sys.executable, __file__, "inject", dag_id, run_id, impl, namespace, args.kubeconfig],
        env=env,
        check=True,
    )
    before = B.request_counts(api)  # idle baseline: the objects exist, nothing waits on them
    time.sleep(args.baseline)
    base = B.delta(B.request_counts(api), before)
    t_start = time.time()
    log_file = root / "logs" / "triggerer.log"
    log_offset = log_file.stat().st_size if log_file.exists() else 0
    airflow_stack.start_component(root, "triggerer")
    logs = Path(state["env"]["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"

    def started() -> bool:
        return len(list(logs.glob("task_id=wait/map_index=*/attempt=1.log.trigger.*.log"))) >= n

    deadline = time.time() + args.start_timeout
    while not started():
        assert time.time() < deadline, (
            f"only {len(list(logs.glob('task_id=wait/map_index=*/*.trigger.*')))} of {n} triggers started"
        )
        assert airflow_stack.component_pids(root, "triggerer"), airflow_stack.tail(root, "triggerer")
        time.sleep(0.5)
    startup = time.time() - t_start
    time.sleep(max(args.warmup, POLL_INTERVAL + 2))
    pids = airflow_stack.component_pids(root, "triggerer")
    runner = runner_pid(pids)
    port = B.server_port(api)
    c0, r0, w0 = group_cpu(pids), B.request_counts(api), time.time()
    conns = []
    for _ in range(4):
        time.sleep(args.window / 4)
        conns.append(B.connections_to(runner, port))
    c1, r1, w1 = group_cpu(pids), B.request_counts(api), time.time()
    minutes = (w1 - w0) / 60
    d = B.delta(r1, r0)
    reqs = sum(v for (verb, res, _), v in d.items() if res in RESOURCES and verb != "WATCH")
    idle = sum(v for (verb, res, _), v in base.items() if res in RESOURCES and verb != "WATCH")
    per_min = reqs / minutes - idle / (args.baseline / 60)
    pss = sum(pss_mib(p) for p in pids)
    rss_runner = B.status_kib(runner, "VmRSS") / 1024

    deferred = Deferred(state["ports"]["postgres"], dag_id, run_id)
    sample = random.Random(7).sample(range(n), min(args.sample, n))
    sent: dict[int, float] = {}
    for i in sample:
        sent[i] = time.time()
        write_status(api, impl, namespace, names[i], "complete")
        time.sleep(0.05)
    end = time.time() + 120
    while time.time() < end and not all(t in deferred.left for t in sent):
        time.sleep(0.1)
    latencies = [deferred.left[t] - s for t, s in sent.items() if t in deferred.left]
    rest = [names[i] for i in range(n) if i not in set(sample)]
    B.parallel(lambda name: write_status(api, impl, namespace, name, "complete"), rest)
    last_write = time.time()
    end = time.time() + 300
    while time.time() < end and len(deferred.left) < n:
        time.sleep(0.1)
    drained = len(deferred.left)
    drain = (max(deferred.left.values()) - last_write) if drained == n else float("nan")
    deferred.close()
    hwm = B.status_kib(runner, "VmHWM") / 1024
    stalls = loop_stalls(log_file, log_offset)
    airflow_stack.stop_component(root, "triggerer")
    B.delete_namespace(api, namespace)
    return {
        "impl": impl,
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
        "detected": f"{len(latencies)}/{len(sent)}",
        "p50_s": round(B.percentile(latencies, 0.5), 2),
        "p99_s": round(B.percentile(latencies, 0.99), 2),
        "burst_drain_s": round(drain, 1),
        "drained": f"{drained}/{n}",
        **stalls,
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
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--impls", default="trainflow,cncf")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("TRAINFLOW_BENCH_AIRFLOW_DIR", "/tmp/trainflow-bench-airflow")),
    )
    p.add_argument(
        "--port-base", type=int, default=int(os.environ.get("TRAINFLOW_BENCH_AIRFLOW_PORT_BASE", "27470"))
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.kubeconfig = B.kubeconfig_path()
    root = args.dir.resolve()
    extra = {
        "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": json.dumps(
            {
                "conn_type": "kubeflow_trainer",
                "extra": {"backend": "kubernetes", "kubeconfig_path": args.kubeconfig},
            }
        ),
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": args.kubeconfig}}
        ),
        "AIRFLOW__TRIGGERER__CAPACITY": str(args.n + 100),
        "AIRFLOW__OPENLINEAGE__DISABLED": "True",
        "TF_BENCH_TRIGGERER_N": str(args.n),
    }
    api = B.api_client(args.kubeconfig)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the deployment on the way out
    results = []
    try:
        state = airflow_stack.up(
            root, Path(sys.prefix), HERE / "dags", args.port_base, extra, components=("api-server",)
        )
        out = airflow_stack.airflow_cli(state, "dags", "reserialize", timeout=900)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        for impl in args.impls.split(","):
            print(f"--- {impl}: {args.n} deferred tasks", file=sys.stderr, flush=True)
            results.append(measure(impl, args, root, api))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        airflow_stack.down(root)
    report(results, args)
    return 0


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    by = {r["impl"]: r for r in results}
    ours, peer = by.get("trainflow"), by.get("cncf")
    keys = [
        ("requests_per_min", "API requests/min"),
        ("cpu_pct", "triggerer CPU %"),
        ("pss_mib", "triggerer PSS MiB"),
        ("runner_peak_rss_mib", "runner peak RSS MiB"),
        ("connections", "open connections"),
        ("p50_s", "detection p50 s"),
        ("p99_s", "detection p99 s"),
        ("burst_drain_s", "burst drain s"),
        ("startup_s", f"{args.n} triggers started s"),
    ]
    rows = []
    for key, label in keys:
        a = ours.get(key) if ours else None
        b = peer.get(key) if peer else None
        rows.append([label, a, b, B.ratio(b, a)])
    print(f"\nTriggerer, N = {args.n} deferred tasks, one triggerer process ({B.machine()['date']})")
    print(B.table(["", "TrainJobTrigger", "KubernetesJobTrigger", "ratio (cncf / trainflow)"], rows))
    for r in results:
        print(f"{r['impl']}: detected {r['detected']}, drained {r['drained']}; requests {r['requests']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": B.machine(), "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
