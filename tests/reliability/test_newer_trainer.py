"""A cluster whose Trainer is newer than the vendored v2.3.0 schema (issue 36): the TrainJob CRD on the testbed is
replaced by the v2.3.0 one plus an optional spec field, as a later release adds fields. The cluster decides: a
request using the field through ``spec_patch`` is accepted and created with it; a misspelled field is refused
naming its path and the schema it was checked against; the same request checked offline is refused naming the
vendored version; and a manifest that skips trainflow's check is still refused by the API server
(``fieldValidation=Strict``), never pruned silently. Here, in the serial reliability suite on its own testbed:
changing a CRD's schema closes every watch of its objects, which the e2e lanes' concurrent tests must not see.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from trainflow_e2e_fixtures import wait_until

from bounds import HANG
from trainflow.core import InvalidRequest, TrainJobRequest, build_trainjob, local_catalog
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.runtimes import find_runtime

pytestmark = pytest.mark.e2e

CRD = "trainjobs.trainer.kubeflow.org"
NEW_FIELD = {"type": "object", "properties": {"policy": {"type": "string"}}, "description": "a newer field"}


def webhook_sees(backend: KubernetesBackend, wanted: TrainJobRequest) -> bool:
    """A dry-run create passes the Trainer's webhook; False while the webhook says the runtime is not found."""
    try:
        backend.submit(wanted, dry_run=True)
    except InvalidRequest as exc:
        if "not found" in str(exc):
            return False
        raise
    return True


def request(**spec_patch: Any) -> TrainJobRequest:
    return TrainJobRequest(
        runtime="torch-distributed", command=["python", "-c", "print(1)"], suspend=True, spec_patch=spec_patch
    )


@contextlib.contextmanager
def crd_with_field(testbed: Any, crd: str, path: tuple[str, ...], name: str) -> Iterator[None]:
    """The CRD ``crd`` with ``name`` added (optional) to the object at ``path`` of its schema, restored after."""
    from kubernetes import client

    api = client.ApiextensionsV1Api(testbed.api_client)
    body = testbed.api_client.sanitize_for_serialization(api.read_custom_resource_definition(crd))
    changed = copy.deepcopy(body)
    for version in changed["spec"]["versions"]:
        node = version["schema"]["openAPIV3Schema"]
        for part in path:
            node = node["properties"][part]
        node["properties"][name] = NEW_FIELD
    api.replace_custom_resource_definition(crd, changed)

    def served() -> bool:  # the API server serves the new schema (its handler follows the CRD)
        now = testbed.api_client.sanitize_for_serialization(api.read_custom_resource_definition(crd))
        established = any(
            c["type"] == "Established" and c["status"] == "True" for c in now["status"]["conditions"]
        )
        return established and name in str(now["spec"]["versions"][0]["schema"])

    wait_until(served, HANG, f"the changed {crd} to be established")
    try:
        yield
    finally:
        current = testbed.api_client.sanitize_for_serialization(api.read_custom_resource_definition(crd))
        for version in current["spec"]["versions"]:
            version["schema"] = next(
                v["schema"] for v in body["spec"]["versions"] if v["name"] == version["name"]
            )
        api.replace_custom_resource_definition(crd, current)


@pytest.fixture
def newer_crd(testbed: Any) -> Iterator[None]:
    """The TrainJob CRD with ``spec.schedulingHints`` added (optional), restored afterwards."""
    with crd_with_field(testbed, CRD, ("spec",), "schedulingHints"):
        yield


def test_the_cluster_decides_what_a_trainjob_may_hold(testbed: Any, namespace: str, newer_crd: None) -> None:
    backend = KubernetesBackend(
        kubeconfig=str(testbed.kubeconfig), context=testbed.context, namespace=namespace
    )
    picture = backend.schema_picture()
    assert picture is not None and "spec.schedulingHints" in picture.beyond_vendored, picture

    # the new field, through the raw spec patch: accepted, created, and kept by the server
    wanted = request(schedulingHints={"policy": "pack"})
    ref = backend.submit(wanted)
    stored = backend.read(namespace, ref.name)
    assert stored is not None and stored["spec"]["schedulingHints"] == {"policy": "pack"}, stored

    # a misspelling: refused before anything is sent, naming the field and the cluster's schema
    with pytest.raises(InvalidRequest) as info:
        backend.submit(request(schedulingHnts={"policy": "pack"}))
    assert info.value.fields == ["spec_patch.schedulingHnts"], info.value
    assert "the TrainJob CRD the cluster serves" in str(info.value)

    # offline, the vendored schema applies and says so
    runtime = find_runtime(local_catalog(), "torch-distributed", "ClusterTrainingRuntime")
    with pytest.raises(InvalidRequest) as offline:
        build_trainjob(wanted, runtime, namespace=namespace)
    assert offline.value.fields == ["spec_patch.schedulingHints"], offline.value
    assert "the vendored Trainer v2.3.0 TrainJob schema" in str(offline.value)

    # past trainflow's check, the API server refuses the unknown field itself (fieldValidation=Strict)
    manifest = build_trainjob(request(), runtime, namespace=namespace, picture=picture)
    manifest["metadata"]["name"] = f"strict-{time.time_ns() % 10**6}"
    manifest["spec"]["schedulingHnts"] = {"policy": "pack"}
    with pytest.raises(InvalidRequest, match=r"unknown field \\?\"spec\.schedulingHnts\\?\"") as server:
        backend.create(manifest)
    assert backend.read(namespace, manifest["metadata"]["name"]) is None, server.value


def test_a_runtime_carrying_a_field_trainflow_does_not_know_is_read_and_used(
    testbed: Any, k8s: Any, namespace: str
) -> None:
    """A newer Trainer's TrainingRuntime (the CRD gains ``spec.podGroupPolicy.schedulerHints``, unknown to
    v2.3.0): the runtime lists, renders and a TrainJob on it is created; the field stays on the runtime."""
    from trainflow_e2e_fixtures import TRAINER_GROUP, TRAINER_VERSION, torch_training_runtime

    with crd_with_field(testbed, "trainingruntimes.trainer.kubeflow.org", ("spec",), "schedulerHints"):
        name = torch_training_runtime(k8s, namespace, "newer-runtime", backoff_limit=0)
        k8s.custom.patch_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", name,
            {"spec": {"schedulerHints": {"policy": "spread"}}},
        )  # fmt: skip
        backend = KubernetesBackend(
            kubeconfig=str(testbed.kubeconfig), context=testbed.context, namespace=namespace
        )
        assert name in [r.name for r in backend.runtimes() if r.kind == "TrainingRuntime"]
        wanted = TrainJobRequest(runtime=name, runtime_kind="TrainingRuntime", command=["x"], suspend=True)
        manifest = backend.render(wanted)
        assert manifest["spec"]["runtimeRef"] == {
            "name": name,
            "apiGroup": TRAINER_GROUP,
            "kind": "TrainingRuntime",
        }
        # the Trainer's webhook reads runtimes from its informer, which restarts its watch when the CRD
        # changes: wait until a server-side dry run (webhooks included, nothing created) finds the runtime
        wait_until(lambda: webhook_sees(backend, wanted), 300, "the Trainer's webhook to see the runtime")
        ref = backend.submit(wanted)
        assert backend.read(namespace, ref.name) is not None
        stored = k8s.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", name
        )
        assert stored["spec"]["schedulerHints"] == {"policy": "spread"}, "the server kept the newer field"
