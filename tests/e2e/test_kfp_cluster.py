"""trainflow's train_job KFP component on the real testbed cluster, acting as pipeline-runner with only the
shipped RBAC (components/rbac/trainflow-kfp-rbac.yaml): kfp.local runs the step, the kubernetes backend talks
to a real kube-apiserver with the Trainer v2.3.0 controller, and kwok runs the pods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from kfp import local
from kubernetes import client
from sa_requests import counted

from bounds import HANG
from conftest import apply_rbac, delete_cluster_role_bindings, sa_kubeconfig, wait_until
from trainflow.core.naming import KEY_LABEL, MANAGED_BY_LABEL
from trainflow.kfp import make_train_job_component

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "components" / "rbac" / "trainflow-kfp-rbac.yaml"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
KWOK_FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
KWOK_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


@pytest.fixture
def runner_kubeconfig(testbed: Any, namespace: str, tmp_path: Path) -> Any:
    core = client.CoreV1Api(testbed.api_client)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="pipeline-runner"))
    )
    bindings = apply_rbac(testbed, namespace, RBAC)
    yield sa_kubeconfig(testbed, namespace, "pipeline-runner", tmp_path / "pipeline-runner.kubeconfig")
    delete_cluster_role_bindings(testbed, bindings)


@pytest.fixture
def kfp_local(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    return root


def trainjobs(k8s: Any, ns: str) -> list[dict[str, Any]]:
    return k8s.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"]


def step_kwargs(kubeconfig: Path, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=2,
        output_uri="s3://bucket/models/kfp-e2e",
        backend="kubernetes",
        backend_config={"kubeconfig": str(kubeconfig)},
        idempotency_key="run-e2e/train-job",  # the second call below is a retry of this step
        timeout=HANG,
    )
    base.update(kw)
    return base


def train_op() -> Any:
    return make_train_job_component(
        base_image="python:3.11", packages_to_install=(), install_kfp_package=False
    )


def test_train_job_completes_and_a_retry_reattaches(
    runner_kubeconfig: Path, kfp_local: Path, namespace: str, k8s: Any, testbed: Any
) -> None:
    step_calls = {
        "get-runtime": ("get", "trainer.kubeflow.org", "clustertrainingruntimes", True),
        "create-trainjob": ("create", "trainer.kubeflow.org", "trainjobs", False),
    }
    with counted(testbed, namespace, "pipeline-runner", step_calls) as calls:
        started = time.monotonic()
        first = train_op()(**step_kwargs(runner_kubeconfig))
        elapsed = time.monotonic() - started
        # one step: one runtime read and one create, counted by the API server for the step's account only
        assert calls() == {"get-runtime": 1, "create-trainjob": 1}
    assert first.outputs["state"] == "Complete" and first.outputs["namespace"] == namespace
    (job,) = trainjobs(k8s, namespace)
    assert job["metadata"]["name"] == first.outputs["job_name"]
    assert (
        job["metadata"]["labels"][MANAGED_BY_LABEL] == "trainflow" and KEY_LABEL in job["metadata"]["labels"]
    )
    assert job["spec"]["trainer"]["numNodes"] == 2
    meta = first.outputs["model"].metadata
    assert meta["model_uri"] == "s3://bucket/models/kfp-e2e"  # cluster mode: the location, not a copy
    assert meta["runtime"] == "torch-distributed" and meta["job_name"] == job["metadata"]["name"]
    second = train_op()(**step_kwargs(runner_kubeconfig))  # the retried step (same key)
    assert second.outputs["job_name"] == first.outputs["job_name"]
    assert len(trainjobs(k8s, namespace)) == 1
    print(f"\nkfp step on cluster: submit->Complete {elapsed:.1f}s")


def test_failed_trainjob_fails_the_step(
    runner_kubeconfig: Path,
    kfp_local: Path,
    namespace: str,
    k8s: Any,
    capfd: pytest.CaptureFixture[str],
    no_retry_runtime: str,
) -> None:
    runtime = no_retry_runtime
    kwargs = step_kwargs(
        runner_kubeconfig,
        runtime=runtime,
        runtime_kind="TrainingRuntime",
        num_nodes=1,
        labels={KWOK_FAIL_LABEL: "true"},
        extra={"annotations": {KWOK_EXIT_CODE: "3"}},
    )
    with pytest.raises(RuntimeError, match="FAILURE"):
        train_op()(**kwargs)
    out = capfd.readouterr().out
    assert "[trainflow] ERROR: TrainJob" in out and "reason=FailedJobs" in out and "exit_code=3" in out
    (job,) = trainjobs(k8s, namespace)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])


STEP_SCRIPT = """
import json, signal, sys
from kfp import local
signal.signal(signal.SIGTERM, lambda *_: None)  # the "launcher" keeps streaming the step's log
from trainflow.kfp import make_train_job_component
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1])
op = make_train_job_component(base_image="python:3.11", packages_to_install=(), install_kfp_package=False)
op(**json.loads(sys.argv[2]))
"""


def test_sigterm_deletes_the_trainjob(
    runner_kubeconfig: Path, namespace: str, k8s: Any, tmp_path: Path
) -> None:
    kwargs = step_kwargs(
        runner_kubeconfig,
        extra={"annotations": {KWOK_COMPLETE_DELAY: "600s"}},
        timeout=600.0,
        idempotency_key="run-term/train-job",
    )
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent(STEP_SCRIPT))
    log = tmp_path / "step.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "root"), json.dumps(kwargs)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def running() -> bool:
            assert proc.poll() is None, log.read_text()
            jobs = trainjobs(k8s, namespace)
            pods = k8s.core.list_namespaced_pod(namespace).items
            return bool(jobs) and len([p for p in pods if p.status.phase == "Running"]) == 2

        wait_until(running, HANG, "the TrainJob's 2 pods Running")
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=HANG)
        text = log.read_text()
        assert "received signal 15" in text and "deleted" in text and "FAILURE" in text, text
        wait_until(lambda: not trainjobs(k8s, namespace), HANG, "the TrainJob to be deleted")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
