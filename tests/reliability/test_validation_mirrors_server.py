"""Server refusals the dry-run property test found, now refused by trainflow first, naming the field.

Each case: trainflow rejects the request naming the field, and the manifest trainflow would have sent
without its check is refused by the real server (so the rule mirrors the server, not a guess).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime

BASE = {"name": "mirror", "image": "pytorch/pytorch:2.13.0", "command": ["torchrun", "t.py"]}
CASES = [
    # Trainer v2.3.0 webhook: the runtime's dataset-initializer has no 'initializer' volumeMount
    ({"runtime": "torch-distributed-with-cache", "dataset_uri": "cache://schema/table"}, "dataset_uri", 403),
    # CRD: imagePullSecrets is a list-map keyed by name
    (
        {"runtime": "torch-distributed", "image_pull_secrets": ["regcred", "regcred"]},
        "image_pull_secrets[1]",
        422,
    ),
    # Trainer webhook: runtimePatches[].manager must be a domain-prefixed path
    (
        {"runtime": "torch-distributed", "runtime_patches": [{"manager": "team"}]},
        "runtime_patches[0].manager",
        403,
    ),
    (
        {"runtime": "torch-distributed", "runtime_patches": [{"manager": "Example.com/x"}]},
        "runtime_patches[0].manager",
        403,
    ),
]
IDS = ["cache-runtime-dataset-uri", "duplicate-pull-secret", "manager-no-domain", "manager-uppercase-domain"]


@pytest.mark.parametrize(("extra", "field", "_status"), CASES, ids=IDS)
def test_trainflow_refuses_naming_the_field(extra: dict[str, Any], field: str, _status: int) -> None:
    req = {**BASE, **extra}
    runtime = find_runtime(local_catalog(), req["runtime"])
    with pytest.raises(InvalidRequest) as info:
        build_trainjob(req, runtime)
    assert field in info.value.fields, info.value


@pytest.mark.e2e
@pytest.mark.parametrize(("extra", "field", "status"), CASES, ids=IDS)
def test_the_server_refuses_it_too(
    kube_backend, k8s, namespace, extra: dict[str, Any], field: str, status: int
) -> None:
    req = {**BASE, **extra}
    runtime = kube_backend.get_runtime(req["runtime"])
    with mock.patch("trainflow.core.manifest.validate_request"):
        manifest = build_trainjob(req, runtime, namespace=namespace)
    with pytest.raises(Exception) as info:  # the server itself, through the kubernetes client: the oracle
        k8s.custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", manifest, dry_run="All"
        )
    assert getattr(info.value, "status", None) == status, info.value
    with pytest.raises(InvalidRequest):  # and through trainflow's API boundary: a bad request, not a crash
        kube_backend.dry_run(manifest)
