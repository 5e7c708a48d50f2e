"""Issue 14: the compiled ``train_job`` component (components/yaml/train_job.yaml) runs its own container command
in the KFP step image (``make images``), in a real pod, as pipeline-runner with only the shipped RBAC.

The pod gets what the KFP launcher would run: the YAML's command and args with ``{{$}}`` replaced by an executor
input shaped like the KFP driver's (output URIs ``<root>/<pipeline>/<run>/<task>/<execution uuid>/<name>``) and no
identity arguments. The first pod is lost (force-deleted: SIGKILL) while its TrainJob runs; the retried pod, with
the same executor input as an Argo retry has, reattaches to that TrainJob instead of creating a second one. A third
pod (a run retried after the job completed) reuses it and publishes the metrics a fresh wait read.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from bounds import HANG
from conftest import REPO, apply_rbac, delete_cluster_role_bindings, trainjobs, wait_until
from kfp_driver_input import step_container

pytestmark = pytest.mark.e2e

RBAC = REPO / "components" / "rbac" / "trainflow-kfp-rbac.yaml"
STEP_IMAGE = "ghcr.io/trainflow/trainflow-kfp:0.1.0"
TRAINER = (
    "import time; from trainflow.core import report; print('training', flush=True); time.sleep(25); "
    "report(metrics={'loss': 0.5}, progress=100); print('trained', flush=True)"
)
# No identity arguments, no namespace, no kubeconfig: the pod's service account and namespace decide.
PARAMETERS = {
    "runtime": "torch-distributed",
    "image": STEP_IMAGE,  # the step image has Python and trainflow: it serves as the trainer image too
    "command": ["python3", "-c", TRAINER],
    "num_nodes": 1,
    "timeout": 240.0,
}


def step_pod(name: str) -> client.V1Pod:
    image, command, args = step_container(PARAMETERS)
    assert image == STEP_IMAGE
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            service_account_name="pipeline-runner",
            restart_policy="Never",
            termination_grace_period_seconds=5,
            containers=[
                client.V1Container(
                    name="main",
                    image=image,
                    image_pull_policy="Never",  # imported into the node's containerd by up.sh --pods
                    command=command,
                    args=args,
                    env=[  # what KFP's Argo compiler sets on every step container (argocompiler/common.go)
                        client.V1EnvVar(
                            name=n,
                            value_from=client.V1EnvVarSource(
                                field_ref=client.V1ObjectFieldSelector(field_path=f)
                            ),
                        )
                        for n, f in (("KFP_POD_NAME", "metadata.name"), ("KFP_POD_UID", "metadata.uid"))
                    ],
                )
            ],
        ),
    )


@pytest.fixture
def pipeline_runner(testbed: Any, k8s: Any, namespace: str) -> Any:
    k8s.core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="pipeline-runner"))
    )
    bindings = apply_rbac(testbed, namespace, RBAC)
    yield
    delete_cluster_role_bindings(testbed, bindings)


def pod_phase(k8s: Any, ns: str, name: str) -> str:
    return str(k8s.core.read_namespaced_pod(name, ns).status.phase)


def run_step(k8s: Any, ns: str, name: str) -> str:
    """One step pod to its end; it must succeed. Returns its log."""
    k8s.core.create_namespaced_pod(ns, step_pod(name))
    wait_until(lambda: pod_phase(k8s, ns, name) in ("Succeeded", "Failed"), 300, f"{name} done")
    text = str(k8s.core.read_namespaced_pod_log(name, ns))
    assert pod_phase(k8s, ns, name) == "Succeeded", text[-4000:]
    return text


def test_compiled_component_in_the_step_image_reattaches_after_a_lost_pod(
    testbed: Any, k8s: Any, namespace: str, pipeline_runner: Any
) -> None:
    t0 = time.monotonic()
    k8s.core.create_namespaced_pod(namespace, step_pod("step-try-1"))
    (job,) = wait_until(lambda: trainjobs(k8s, namespace), HANG, "the step's TrainJob")
    name = job["metadata"]["name"]
    wait_until(
        lambda: any(
            p.status.phase == "Running" and p.metadata.name.startswith(name)
            for p in k8s.core.list_namespaced_pod(namespace).items
        ),
        HANG,
        "the trainer pod Running",
    )
    first = k8s.core.read_namespaced_pod_log("step-try-1", namespace)
    assert f"Submitted TrainJob {namespace}/{name} (attempt 1)" in first, first[-3000:]
    assert "pip install" not in first  # nothing was installed when the step started
    # the step's pod is lost: no SIGTERM handler runs, the TrainJob keeps going
    k8s.core.delete_namespaced_pod("step-try-1", namespace, grace_period_seconds=0)
    wait_until(lambda: not [p for p in k8s.core.list_namespaced_pod(namespace).items if p.metadata.name == "step-try-1"],
               60, "step-try-1 gone")  # fmt: skip
    second = run_step(k8s, namespace, "step-try-2")  # the retry
    assert f"Reattaching to running TrainJob {namespace}/{name} (attempt 1)" in second, second[-4000:]
    assert f'TrainJob {namespace}/{name} Complete; metrics={{"loss": 0.5}}' in second, second[-4000:]
    (done,) = trainjobs(k8s, namespace)  # still one TrainJob
    assert done["metadata"]["name"] == name
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in done["status"]["conditions"])
    # the run is retried after the job completed (say the upload of the outputs failed): the step reuses the
    # TrainJob and publishes the metrics a fresh wait read (rank 0's log), not a bare read of the TrainJob
    third = run_step(k8s, namespace, "step-try-3")
    assert f"TrainJob {namespace}/{name} already completed" in third, third[-4000:]
    assert f'TrainJob {namespace}/{name} Complete; metrics={{"loss": 0.5}}' in third, third[-4000:]
    assert len(trainjobs(k8s, namespace)) == 1
    print(f"\nstep image in real pods: lost pod + retry -> Complete in {time.monotonic() - t0:.1f}s")
