"""Fixtures for the real-pods suite (``make e2e-pods``): the testbed in pods mode (``testbed/up.sh --pods``).

Two real nodes run the pods (each: containerd, runc, the kubelet, kube-proxy and CoreDNS), with the Trainer
controller in cluster (TrainJobStatus on). The e2e fixtures (``testbed``, ``k8s``, ``namespace``, ...) are
reused from tests/e2e/conftest.py; this module adds the shared RWX volume, CRI inspection and helpers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from shared_volumes import delete_pv, shared_claim

_spec = importlib.util.spec_from_file_location(
    "trainflow_e2e_conftest", Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_e2e = importlib.util.module_from_spec(_spec)
sys.modules["trainflow_e2e_conftest"] = _e2e
_spec.loader.exec_module(_e2e)

# e2e fixtures and hooks, registered for this directory too.
testbed = _e2e.testbed
k8s = _e2e.k8s
namespace = _e2e.namespace
pytest_runtest_makereport = _e2e.pytest_runtest_makereport
wait_until = _e2e.wait_until
apply_rbac = _e2e.apply_rbac
delete_cluster_role_bindings = _e2e.delete_cluster_role_bindings
condition = _e2e.condition
dump_namespace = _e2e.dump_namespace
TRAINER_GROUP, TRAINER_VERSION = _e2e.TRAINER_GROUP, _e2e.TRAINER_VERSION
JOBSET_GROUP, JOBSET_VERSION = _e2e.JOBSET_GROUP, _e2e.JOBSET_VERSION

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The image torch-distributed names (Trainer v2.3.0), imported into containerd by up.sh --pods.
TORCH_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
POD_NS_LABEL = "io.kubernetes.pod.namespace"
# A trainer that runs until stopped and stops on SIGTERM, as a training loop should (a bare `sleep` ignores
# SIGTERM as PID 1, so every pod would take its whole 30 s grace period to go).
SLEEPER = ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]


@pytest.fixture(scope="session", autouse=True)
def pods_mode(testbed: Any) -> None:
    """Every test here needs the real node: fail loudly on a kwok testbed."""
    if testbed.state.get("mode") != "pods":
        pytest.fail(
            f"{testbed.dir} is a {testbed.state.get('mode', 'kwok')} testbed; start it with "
            "`bash testbed/up.sh --pods` (make e2e-pods does)",
            pytrace=False,
        )


def trainjobs(k8s: Any, ns: str) -> list[dict[str, Any]]:
    return k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs")["items"]


def jobsets(k8s: Any, ns: str) -> list[dict[str, Any]]:
    return k8s.custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets")["items"]


def cri_containers(testbed: Any, ns: str) -> list[str]:
    """Container ids the CRI (containerd's k8s.io namespace) of any node still holds for pods of ``ns``,
    sandboxes too."""
    node_bin = Path(testbed.state["node_bin"])
    ids = []
    for node in testbed.state["nodes"]:
        r = subprocess.run(
            [
                str(node_bin / "ctr"),
                "--address",
                node["containerd_socket"],
                "--namespace",
                "k8s.io",
                "containers",
                "ls",
                "--quiet",
                f'labels."{POD_NS_LABEL}"=={ns}',
            ],
            capture_output=True,
            text=True,
            timeout=HANG,
        )
        assert r.returncode == 0, r.stderr
        ids += r.stdout.split()
    return ids


def spread_over_nodes(*replicated_jobs: str) -> list[dict[str, Any]]:
    """runtime_patches that put each pod of the job on a node of its own (required pod anti-affinity on the
    hostname among the namespace's JobSet pods), as a user asks for ranks on distinct nodes."""
    affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {
                        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
                    },
                }
            ]
        }
    }
    jobs = [
        {"name": j, "template": {"spec": {"template": {"spec": {"affinity": affinity}}}}}
        for j in replicated_jobs
    ]
    return [
        {
            "manager": "trainflow.test/spread",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}},
        }
    ]


def pod_nodes(k8s: Any, ns: str, selector: str = "") -> dict[str, str]:
    """Pod name -> spec.nodeName for the pods of ``ns`` (matching ``selector``)."""
    return {
        p.metadata.name: p.spec.node_name
        for p in k8s.core.list_namespaced_pod(ns, label_selector=selector).items
    }


def assert_all_gone(testbed: Any, k8s: Any, ns: str, timeout: float = HANG) -> float:
    """TrainJob, JobSet, pods and their containers all gone; returns the seconds it took."""
    t0 = time.monotonic()

    def left() -> dict[str, Any]:
        return {
            k: v
            for k, v in {
                "trainjobs": [j["metadata"]["name"] for j in trainjobs(k8s, ns)],
                "jobsets": [j["metadata"]["name"] for j in jobsets(k8s, ns)],
                "pods": [p.metadata.name for p in k8s.core.list_namespaced_pod(ns).items],
                "cri_containers": cri_containers(testbed, ns),
            }.items()
            if v
        }

    last: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout:
        last = left()
        if not last:
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"still there {timeout}s after cancel: {last}")


@dataclass
class SharedVolume:
    """A ReadWriteMany hostPath volume: the same directory on the host and, at the same path, in every pod."""

    claim: str
    path: Path

    def request_volume(self) -> dict[str, str]:
        return {"claim_name": self.claim, "mount_path": str(self.path)}


@pytest.fixture
def shared_volume(testbed: Any, k8s: Any, namespace: str) -> Iterator[SharedVolume]:
    """PV (hostPath under the testbed dir, RWX) bound to PVC ``shared`` in the test namespace."""
    path, pv = testbed.dir / "shared" / namespace, f"shared-{namespace}"
    shared_claim(k8s.core, namespace, path, pv)
    yield SharedVolume("shared", path)
    delete_pv(k8s.core, pv)


def cli(testbed: Any, ns: str, *args: str) -> list[str]:
    """argv for the trainflow CLI against the testbed, in ``ns``."""
    return [
        str(BIN / "trainflow"),
        "--backend",
        "kubernetes",
        "--kubeconfig",
        str(testbed.kubeconfig),
        "--context",
        testbed.context,
        "-n",
        ns,
        *args,
    ]


def make_backend(testbed: Any, namespace: str, **config: Any) -> Any:
    from trainflow.core import get_backend

    return get_backend(
        "kubernetes",
        kubeconfig=str(testbed.kubeconfig),
        context=testbed.context,
        namespace=namespace,
        **config,
    )


@pytest.fixture
def backend(testbed: Any, namespace: str) -> Any:
    return make_backend(testbed, namespace)


def pod_logs(k8s: Any, ns: str, selector: str) -> dict[str, str]:
    """Current log of the trainer container of every pod matching ``selector``, by pod name."""
    out = {}
    for pod in k8s.core.list_namespaced_pod(ns, label_selector=selector).items:
        out[pod.metadata.name] = k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container="node")
    return out


def record(name: str, data: dict[str, Any]) -> None:
    """Measured figures of one test, printed (and kept in $TRAINFLOW_PODS_OUT when set)."""
    out = os.environ.get("TRAINFLOW_PODS_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(data))
    print(json.dumps({name: data}))


def poll(fn: Callable[[], Any], timeout: float, desc: str, interval: float = 1.0) -> Any:
    return wait_until(fn, timeout, desc, interval=interval)


BACKOFF_RUNTIME = "torch-backoff-2"


@pytest.fixture
def no_retry_runtime(k8s: Any, namespace: str) -> str:
    """Like ``backoff_runtime`` without retries: one failed container fails the Job, the JobSet and the
    TrainJob at once, and the JobSet deletes the pods."""
    return _e2e.torch_training_runtime(k8s, namespace, _e2e.NO_RETRY_RUNTIME, 0)


@pytest.fixture
def backoff_runtime(k8s: Any, namespace: str) -> str:
    """A namespaced TrainingRuntime like torch-distributed whose Job gives up after 2 retries (the default
    allows 6: with the kubelet's 10-20-40-80-160 s restart back-off, minutes); returns its name."""
    return _e2e.torch_training_runtime(k8s, namespace, BACKOFF_RUNTIME, 2)


def sigterm_when_running(testbed: Any, k8s: Any, ns: str, proc: Any, group: bool) -> tuple[float, float]:
    """Once a 2-node job runs (2 sandboxes + 2 trainer containers in the CRI), SIGTERM ``proc`` (its process
    group if ``group``), wait for it to exit and for everything to be gone. Returns (SIGTERM to all gone,
    time waited after the exit) in seconds; kills the group if it is still there."""
    import signal

    try:
        poll(lambda: len(cri_containers(testbed, ns)) >= 4, HANG, "2 pods' sandboxes and containers")
        assert trainjobs(k8s, ns), "no TrainJob"
        t0 = time.monotonic()
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=HANG)
        gone = assert_all_gone(testbed, k8s, ns)
        return time.monotonic() - t0, gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def store(testbed: Any, k8s: Any, namespace: str) -> Any:
    """The testbed's object store, its credentials in the Secret ``store`` of the test namespace."""
    from s3store import SECRET, make_secret, store_of

    s = store_of(testbed)
    make_secret(k8s, namespace, SECRET, s.access_key_id, s.secret_access_key)
    return s


@pytest.fixture
def initializers_runtime(k8s: Any, namespace: str, shared_volume: SharedVolume) -> str:
    """TrainingRuntime ``torch-with-initializers`` in the test namespace (s3store.runtime_with_initializers)."""
    from s3store import runtime_with_initializers

    return runtime_with_initializers(k8s, namespace, shared_volume.claim)
