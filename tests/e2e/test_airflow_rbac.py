"""Airflow workers and triggerers with ONLY the shipped RBAC (providers/airflow/rbac/trainflow-airflow-rbac.yaml).

Two ServiceAccounts, airflow-worker and airflow-triggerer, get the manifest's Role and ClusterRole and
nothing else; every call below goes through their tokens (TokenRequest) to the real kube-apiserver:
- a real ``dag.test()`` of the deferrable TrainJobOperator whose connection carries the worker's kubeconfig
  (submit, defer, the trigger's watch, XCom downstream);
- the calls each process makes, split by identity: the worker submits, reads node-0's log and cancels; the
  triggerer waits with the shared watch, follows the log and deletes on kill;
- and the tokens reach nothing else (another namespace, pods, secrets).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import config as k8s_config
from test_airflow_cluster import airflow_home as airflow_home_fixture  # noqa: F401 (the module's fixture)
from test_airflow_cluster import run_dag, trigger_states

from conftest import (
    KWOK_COMPLETE_DELAY,
    TRAINER_GROUP,
    TRAINER_VERSION,
    apply_rbac,
    delete_cluster_role_bindings,
    sa_kubeconfig,
    wait_until,
)
from trainflow.core import TrainJobRequest
from trainflow.core.errors import BackendError
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.result import JobState

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "providers" / "airflow" / "rbac" / "trainflow-airflow-rbac.yaml"
ACCOUNTS = ("airflow-worker", "airflow-triggerer")
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
TIMEOUT = 150


def test_manifest_binds_the_worker_and_triggerer_accounts() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text())}
    assert set(docs) == {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        assert [s["name"] for s in docs[kind]["subjects"]] == list(ACCOUNTS)
    verbs = {
        (r["apiGroups"][0], res): set(r["verbs"]) for r in docs["Role"]["rules"] for res in r["resources"]
    }
    assert verbs[("trainer.kubeflow.org", "trainjobs")] == {
        "create",
        "get",
        "list",
        "watch",
        "delete",
        "patch",
    }
    assert verbs[("", "pods")] == {"get", "list", "watch"}  # the triggerers' pod watch (crash exit codes)
    assert not any("*" in v for v in verbs.values())  # no wildcards
    assert ("", "secrets") not in verbs


@pytest.fixture
def identities(testbed: Any, namespace: str, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Kubeconfigs of the two accounts, bound by the shipped manifest only."""
    core = client.CoreV1Api(testbed.api_client)
    for name in ACCOUNTS:
        core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        )
    bindings = apply_rbac(testbed, namespace, RBAC)
    yield {
        name: sa_kubeconfig(testbed, namespace, name, tmp_path / f"{name}.kubeconfig") for name in ACCOUNTS
    }
    delete_cluster_role_bindings(testbed, bindings)


def _backend(kubeconfig: Path, namespace: str) -> KubernetesBackend:
    return KubernetesBackend(kubeconfig=str(kubeconfig), namespace=namespace)


def _request(key: str, delay: str) -> TrainJobRequest:
    """A torch-distributed job whose kwok pods run for ``delay`` and print the testbed's log lines."""
    pod_meta = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: delay}}}
    node = {"name": "node", "template": {"spec": {"template": pod_meta}}}
    return TrainJobRequest(
        runtime="torch-distributed",
        idempotency_key=key,
        num_nodes=2,
        image=IMAGE,
        command=["torchrun", "--nnodes=2", "train.py"],
        runtime_patches=[
            {
                "manager": "example.com/e2e",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
            }
        ],
    )


def test_deferrable_task_runs_with_the_worker_token(
    testbed: Any,
    namespace: str,
    k8s: Any,
    identities: dict[str, Path],
    airflow_home_fixture: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    extra = {
        "backend": "kubernetes",
        "kubeconfig_path": str(identities["airflow-worker"]),
        "namespace": namespace,
    }
    out = run_dag(airflow_home_fixture, "tf_e2e_cluster", extra, tmp_path)
    assert out["state"] == "success", (out["tasks"], out["log"][-6000:])
    assert "Pausing task as DEFERRED" in out["log"]
    states = trigger_states(out["log"], namespace)
    assert states and states[-1] == "Complete", states  # reported by the trigger's watch
    assert out["xcoms"]["report[-1].return_value"]["state"] == "Complete"
    assert "permission denied" not in out["log"] and "Forbidden" not in out["log"]
    (job,) = k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs")[
        "items"
    ]
    assert job["metadata"]["labels"]["airflow.apache.org/dag-id"] == "tf_e2e_cluster"


def test_worker_submits_and_reads_logs_triggerer_waits_and_follows(
    identities: dict[str, Path], namespace: str
) -> None:
    worker = _backend(identities["airflow-worker"], namespace)
    triggerer = _backend(identities["airflow-triggerer"], namespace)
    try:
        # the shipped RBAC reads the TrainJob CRD (that one only): the served schema checks the request
        picture = worker.schema_picture()
        assert picture is not None and "the cluster serves" in picture.source, picture
        ref = worker.submit(_request("rbac/complete", "15s"))
        assert worker.submit(_request("rbac/complete", "15s")).uid == ref.uid  # a retried task reattaches
        followed: list[str] = []

        def follow() -> None:  # the trigger's stream_logs, on a thread as the trigger runs it
            for line in triggerer.logs(ref, follow=True, pod_wait=TIMEOUT):
                followed.append(line)
                if "training finished" in line:  # kwok keeps a followed stream open: stop at the last line
                    return

        pump = threading.Thread(target=follow, daemon=True)
        pump.start()
        result = asyncio.run(asyncio.wait_for(triggerer.wait_async(ref, timeout=TIMEOUT), TIMEOUT + 30))
        assert result.state is JobState.COMPLETE
        pump.join(TIMEOUT)
        assert "training finished" in "\n".join(followed), followed
        assert list(worker.logs(ref, tail_lines=1))[-1].endswith("training finished")
    finally:
        worker.close()
        triggerer.close()


def test_worker_and_triggerer_cancel(identities: dict[str, Path], namespace: str, k8s: Any) -> None:
    worker = _backend(identities["airflow-worker"], namespace)
    triggerer = _backend(identities["airflow-triggerer"], namespace)
    try:
        refs = [worker.submit(_request(f"rbac/cancel-{who}", "300s")) for who in ("worker", "triggerer")]
        for ref in refs:
            wait_until(lambda ref=ref: triggerer.get(ref).state is JobState.RUNNING, TIMEOUT, f"{ref} to run")
        assert worker.cancel(refs[0]) is True  # operator on_kill
        assert triggerer.cancel(refs[1]) is True  # trigger on_kill (user killed the deferred task)
        assert worker.cancel(refs[0]) is False  # already gone: not an error
        names = {
            i["metadata"]["name"]
            for i in k8s.custom.list_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs"
            )["items"]
        }
        assert not names & {r.name for r in refs}
    finally:
        worker.close()
        triggerer.close()


def test_the_tokens_reach_nothing_else(identities: dict[str, Path], namespace: str) -> None:
    for kubeconfig in identities.values():
        elsewhere = _backend(kubeconfig, "default")
        try:
            with pytest.raises(
                BackendError, match="permission denied: cannot list trainjobs in namespace 'default'"
            ):
                elsewhere.list()
        finally:
            elsewhere.close()
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        core = client.CoreV1Api(api)
        pod = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": IMAGE}]}}
        for method, args in (
            (core.list_namespaced_secret, (namespace,)),
            (core.delete_collection_namespaced_pod, (namespace,)),
            (core.create_namespaced_pod, (namespace, pod)),
        ):
            with pytest.raises(client.ApiException) as info:
                method(*args)
            assert info.value.status == 403, method.__name__
        api.close()
