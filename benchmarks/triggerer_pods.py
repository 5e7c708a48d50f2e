"""The pods of benchmarks/triggerer_scale.py: each job's rank-0 pod on a kwok node of the benchmark's own, its
log a file the benchmark appends to while kwok serves it (a kwok ``Logs`` object per pod), and the pod's end.

A TrainJob's pod carries the labels the Trainer's JobSet pods carry (``jobset-name``, ``replicatedjob-name=node``,
``job-completion-index=0``, container ``node``), so trainflow's pod watch and log readers find it as on a real
cluster; a batch Job's pod carries ``job-name`` (container ``base``, what ``KubernetesJobOperator`` runs). The
controllers leave the jobs alone (``managedBy`` multikueue), so the benchmark binds the pods itself
(``nodeName``) and ends them before it writes the job's ``Complete``, as the kubelet would.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

NODE = "tf-bench-triggerer-node"
NODE_IP = "127.0.0.1"  # where kwok serves the kubelet API (testbed/kwok.py)
TAINT = {"key": B.BENCH_LABEL, "value": "triggerer", "effect": "NoSchedule"}
MARKER = "tf-bench-marker"
LOGS_GROUP, LOGS_VERSION = "kwok.x-k8s.io", "v1alpha1"


def cri_line(text: str, stream: str = "stdout") -> str:
    """One line of a container log file in the CRI format, timestamped now (what kwok parses and serves)."""
    return f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {stream} F {text}\n"


class RankLog:
    """The log file every rank-0 pod of one implementation "prints": a few lines at first, then a marker line
    whenever the benchmark appends one (``append`` returns when it was written)."""

    def __init__(self, impl: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"tf-bench-{impl}-"))
        self.dir.chmod(0o755)  # kwok may read it as a user of its own (testbed/kwok.py)
        self.path = self.dir / "rank0.log"
        self.path.write_text(
            cri_line("[bench] rank 0 starting") + cri_line("step=0 loss=1.00") + cri_line("warn", "stderr")
        )
        self.path.chmod(0o644)
        self.sent: dict[int, float] = {}
        self._lock = threading.Lock()

    def append(self, seq: int) -> float:
        with self._lock, open(self.path, "a") as fh:
            t = time.time()
            fh.write(cri_line(f"{MARKER} {seq} step={seq} loss={1 / (seq + 1):.4f}"))
            fh.flush()
            os.fsync(fh.fileno())
        self.sent[seq] = t
        return t

    def remove(self) -> None:
        for f in self.dir.iterdir():
            f.unlink()
        self.dir.rmdir()


def ensure_node(api: Any) -> None:
    """A kwok node for the benchmark's pods: room for thousands, tainted so nothing else lands on it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": "10000", "ephemeral-storage": "10Ti"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": NODE, "type": "kwok", B.BENCH_LABEL: "triggerer"},
        },
        "spec": {"taints": [TAINT]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": NODE}],
            "allocatable": capacity,
            "capacity": capacity,
        },
    }
    try:
        core.create_node(node)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.time() + 120
    while time.time() < deadline:
        conds = core.read_node_status(NODE).status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conds):
            return
        time.sleep(1)
    raise RuntimeError(f"kwok did not make node {NODE} Ready in 120 s")


def delete_node(api: Any) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).delete_node(NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise


def pod_name(impl: str, job: str) -> str:
    return f"{job}-node-0-0-bench" if impl.startswith("trainflow") else f"{job}-bench"


def _pod(impl: str, job: str) -> dict[str, Any]:
    if impl.startswith("trainflow"):  # a JobSet pod of the Trainer's "node" replicated job, rank 0
        labels = {
            "jobset.sigs.k8s.io/jobset-name": job,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": "0",
            "batch.kubernetes.io/job-name": f"{job}-node-0",
            "job-name": f"{job}-node-0",
        }
        container, restart = "node", "OnFailure"
    else:  # the pod of KubernetesJobOperator's Job
        labels = {"batch.kubernetes.io/job-name": job, "job-name": job}
        container, restart = "base", "Never"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(impl, job), "labels": {**labels, B.BENCH_LABEL: "triggerer"}},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart,
            "tolerations": [{**TAINT, "operator": "Equal"}],
            "containers": [{"name": container, "image": "registry.invalid/bench:0", "command": ["true"]}],
        },
    }


def create_pods(api: Any, impl: str, namespace: str, jobs: list[str], log: RankLog) -> list[str]:
    """Each job's pod, its log served from ``log``; returns when kwok runs them all (their names)."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def one(job: str) -> str:
        pod = _pod(impl, job)
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]["name"]
        logs = {
            "apiVersion": f"{LOGS_GROUP}/{LOGS_VERSION}",
            "kind": "Logs",
            "metadata": {"name": name},
            "spec": {"logs": [{"containers": [container], "logsFile": str(log.path), "follow": True}]},
        }
        custom.create_namespaced_custom_object(LOGS_GROUP, LOGS_VERSION, namespace, "logs", logs)
        core.create_namespaced_pod(namespace, pod)
        return str(name)

    names = B.parallel(one, jobs)
    deadline = time.time() + 300 + len(jobs) * 0.2
    while True:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{B.BENCH_LABEL}=triggerer").items
        running = sum(1 for p in pods if any(cs.state.running for cs in p.status.container_statuses or []))
        if running == len(jobs):
            return names
        if time.time() > deadline:
            raise RuntimeError(f"kwok runs {running} of {len(jobs)} pods in {namespace}")
        time.sleep(2)


def end_pod(api: Any, impl: str, namespace: str, job: str) -> None:
    """The pod's container exited 0 (what the kubelet reports before the job controllers complete the job)."""
    from kubernetes import client

    t = B.now_rfc3339()
    container = "node" if impl.startswith("trainflow") else "base"
    terminated = {"exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t}
    status = {
        "phase": "Succeeded",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": t}
        ],
        "containerStatuses": [
            {
                "name": container,
                "image": "registry.invalid/bench:0",
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    client.CoreV1Api(api).patch_namespaced_pod_status(pod_name(impl, job), namespace, {"status": status})
