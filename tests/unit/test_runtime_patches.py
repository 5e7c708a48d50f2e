"""Issue 11.7: raw runtime_patches are held to the Trainer webhook's rules, naming the field offline."""

from __future__ import annotations

from typing import Any

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime

PATH = "runtime_patches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]"


def patch(job: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "manager": "example.com/team",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": job, "template": {"spec": {"template": {"spec": pod}}}}]}
            }
        },
    }


def build(runtime: str, *patches: dict[str, Any]) -> dict[str, Any]:
    request = {"name": "p", "command": ["mpirun", "x"], "runtime_patches": list(patches)}
    return build_trainjob(request, find_runtime(local_catalog(), runtime))


@pytest.mark.parametrize(
    ("runtime", "job", "pod", "field"),
    [
        ("torch-distributed", "launcher", {}, f"{PATH}.name"),
        (
            "torch-distributed",
            "node",
            {"containers": [{"name": "sidecar"}]},
            f"{PATH}.template.spec.template.spec.containers[0].name",
        ),
        (
            "deepspeed-distributed",
            "node",
            {"initContainers": [{"name": "init"}]},
            f"{PATH}.template.spec.template.spec.initContainers[0].name",
        ),
        (
            "torch-distributed",
            "node",
            {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]},
            "runtime_patches[0]",
        ),
    ],
)
def test_patches_naming_what_the_runtime_lacks_are_refused(
    runtime: str, job: str, pod: dict, field: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        build(runtime, patch(job, pod))
    assert err.value.fields == [field]


def test_patches_of_existing_jobs_and_containers_pass() -> None:
    mounts = {"containers": [{"name": "node", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}
    manifest = build("deepspeed-distributed", patch("launcher", mounts))
    assert manifest["spec"]["runtimePatches"][-1]["manager"] == "example.com/team"
