"""Webhook parity: for every vendored runtime, each request the Trainer v2.3.0 webhook refuses is refused
offline, naming the request field, and the real webhook refuses what trainflow would have sent without
its checks, naming the matching spec path (server-side dry-run on the testbed).

Runtime patches naming a replicated job or container the runtime lacks pass the v2.3.0 webhook (it checks
them against the runtime template with the patch already merged in), but the controller then cannot build
the JobSet or its Jobs: the TrainJob never starts and gets no status, only a Warning event. trainflow
refuses them offline too; the server half checks that outcome on torch-distributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from diff_intents import node_patch

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import RESERVED_ENV, Runtime, find_runtime
from trainflow.core.torchtune import IMMUTABLE_CONFIGS

LORA = "model.lora_attn_modules=[q_proj,v_proj,output_proj]"
BASE: dict[str | None, dict[str, Any]] = {
    "torch": {"command": ["torchrun", "/app/train.py"]},
    "mpi": {"command": ["mpirun", "python3", "/app/train.py"]},
    "jax": {"command": ["python3", "/app/train.py"]},
    "xgboost": {"command": ["python3", "/app/train.py"]},
}


def cases_for(runtime: Runtime) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    """(case id, request fields, the field trainflow names, the spec path the webhook names)."""
    base = {} if runtime.is_torchtune else BASE[runtime.policy]
    for name in sorted(RESERVED_ENV.get(runtime.policy or "", ())):
        if (
            runtime.policy != "jax"
        ):  # the webhook reserves no JAX name (trainflow does: the controller overwrites them)
            yield f"env-{name}", {**base, "env": {name: "1"}}, f"env.{name}", "spec.trainer.env"
    if runtime.is_torchtune:
        yield "tune-2-nodes", {"num_nodes": 2}, "num_nodes", "spec.trainer.numNodes"
        for i, key in enumerate(sorted(IMMUTABLE_CONFIGS)):
            yield (
                f"tune-args-{key}",
                {"args": ["epochs=1"] * i + [f"{key}=/x"]},
                f"args[{i}]",
                "spec.trainer.args",
            )
        qlora = {"args": [LORA, "model.quantize_base=True"], "resources": {"gpu": 2}}
        if "qwen" in runtime.name:
            yield "tune-qlora", qlora, "args[1]", "spec.runtimeRef.name"
        else:
            yield "tune-qlora-2-gpus", qlora, "resources", "spec.trainer.resourcesPerNode"
    for kind, uri in (("dataset", "hf://org/data"), ("model", "hf://org/model")):
        step = f"{kind}-initializer"
        if step not in runtime.replicated_job_names or not any(
            m.get("name") == "initializer"
            for c in runtime.containers(step)
            for m in c.get("volumeMounts") or []
        ):
            yield f"{kind}-uri", {**base, f"{kind}_uri": uri}, f"{kind}_uri", "spec.runtimeRef"
    trainer = runtime.trainer_job_name
    patches = [
        ("patch-unknown-job", node_patch("nope", {}), "runtime_patches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name"),
        (
            "patch-unknown-container",
            node_patch(trainer, {"containers": [{"name": "sidecar"}]}),
            "runtime_patches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0].name",
        ),
        ("patch-env-on-node", node_patch(trainer, {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]}), "runtime_patches[0]"),
        ("patch-manager", node_patch(trainer, {}, manager="team"), "runtime_patches[0].manager"),
    ]  # fmt: skip
    for case, patch, field in patches:
        yield case, {**base, "runtime_patches": [patch]}, field, "spec.runtimePatches"


CONTROLLER_REFUSES = {"patch-unknown-job", "patch-unknown-container"}  # not the webhook: see the docstring


RUNTIMES = list(local_catalog())
CASES = [(r.name, *case) for r in RUNTIMES for case in cases_for(r)]
IDS = [f"{runtime}/{case}" for runtime, case, *_ in CASES]


def test_every_vendored_runtime_has_its_webhook_rules() -> None:
    per_runtime = {r.name: [c for c in CASES if c[0] == r.name] for r in RUNTIMES}
    assert len(RUNTIMES) == 9
    for name, cases in per_runtime.items():
        runtime = find_runtime(RUNTIMES, name)
        minimum = 4 + (0 if runtime.policy == "jax" else 4) + (6 if runtime.is_torchtune else 0)
        assert len(cases) >= minimum, (name, [c[1] for c in cases])


@pytest.mark.parametrize(("runtime", "case", "request_", "field", "_path"), CASES, ids=IDS)
def test_refused_offline_naming_the_field(
    runtime: str, case: str, request_: dict, field: str, _path: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "parity", **request_}, find_runtime(RUNTIMES, runtime))
    assert field in err.value.fields, err.value


@pytest.fixture(scope="module")
def parity_namespace(testbed: Any) -> Iterator[str]:
    from conftest import _e2e

    ns = _e2e.create_namespace(testbed, "parity")
    yield ns
    _e2e.delete_namespace(testbed, ns)


WEBHOOK_CASES = [c for c in CASES if c[1] not in CONTROLLER_REFUSES]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("runtime", "case", "request_", "_field", "path"),
    WEBHOOK_CASES,
    ids=[f"{runtime}/{case}" for runtime, case, *_ in WEBHOOK_CASES],
)
def test_the_webhook_refuses_it_too(
    testbed: Any, parity_namespace: str, runtime: str, case: str, request_: dict, _field: str, path: str
) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(testbed.api_client)
    served = Runtime.from_object(
        custom.get_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime
        )
    )
    with mock.patch("trainflow.core.manifest.validate_request"):
        manifest = build_trainjob({"name": "parity", **request_}, served, namespace=parity_namespace)
    with pytest.raises(client.ApiException) as err:
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", parity_namespace, "trainjobs", manifest, dry_run="All"
        )
    assert err.value.status in (403, 422), err.value
    assert path in str(err.value.body), err.value.body


@pytest.mark.e2e
def test_patches_of_missing_jobs_or_containers_never_start(testbed: Any, parity_namespace: str) -> None:
    """Created for real: the controller cannot build them, and says so only in Warning events."""
    import time

    from kubernetes import client

    custom = client.CustomObjectsApi(testbed.api_client)
    served = Runtime.from_object(
        custom.get_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "torch-distributed"
        )
    )
    cases = {c[1]: c[2] for c in CASES if c[0] == "torch-distributed" and c[1] in CONTROLLER_REFUSES}
    assert sorted(cases) == sorted(CONTROLLER_REFUSES)
    names = {}
    for i, (case, request_) in enumerate(sorted(cases.items())):
        names[case] = f"never-{i}"
        with mock.patch("trainflow.core.manifest.validate_request"):
            manifest = build_trainjob({"name": names[case], **request_}, served, namespace=parity_namespace)
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", parity_namespace, "trainjobs", manifest
        )
    deadline, warned = time.monotonic() + 120, set()
    while time.monotonic() < deadline and len(warned) < len(names):
        events = client.CoreV1Api(testbed.api_client).list_namespaced_event(parity_namespace).items
        warned = {
            e.involved_object.name
            for e in events
            if e.type == "Warning" and e.reason in ("TrainJobResourcesCreationFailed", "JobCreationFailed")
        }
        time.sleep(1)
    assert set(names.values()) <= warned, warned
    for name in names.values():
        job = custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", parity_namespace, "trainjobs", name
        )
        assert not (job.get("status") or {}).get("conditions"), job.get("status")
