"""The default node count (runtimes.node_count) against the real Trainer: for every vendored runtime and for
runtimes that set the count differently (mlPolicy.numNodes, a policy without it, no policy), a TrainJob without
numNodes gets the trainer job's parallelism trainflow predicts."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from bounds import HANG
from conftest import TRAINER_GROUP, TRAINER_VERSION
from trainflow.core.runtimes import ANCESTOR_LABEL, Runtime, node_count

pytestmark = pytest.mark.e2e


def trainer_parallelism(k8s: Any, namespace: str, name: str) -> int:
    deadline = time.time() + HANG
    while True:
        try:
            jobset = k8s.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name
            )
            break
        except Exception:
            assert time.time() < deadline, f"no JobSet {namespace}/{name} after {HANG:.0f} s"
            time.sleep(0.5)
    for job in jobset["spec"]["replicatedJobs"]:
        if ((job["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) == "trainer":
            return int(job["template"]["spec"].get("parallelism", 1))
    raise AssertionError(f"JobSet {name} has no trainer job: {jobset['spec']['replicatedJobs']}")


def trainjob(k8s: Any, namespace: str, name: str, runtime: str, kind: str) -> None:
    body = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime, "kind": kind}, "suspend": True, "trainer": {}},
    }
    k8s.custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", body)


def variants(base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Namespaced copies of a runtime: numNodes 3, a policy without numNodes (parallelism 5), no policy
    (parallelism 2)."""
    out = []
    for name, policy, parallelism in (
        ("nodes-3", {**base["spec"]["mlPolicy"], "numNodes": 3}, None),
        ("policy-no-count", {k: v for k, v in base["spec"]["mlPolicy"].items() if k != "numNodes"}, 5),
        ("no-policy", None, 2),
    ):
        obj = {
            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
            "kind": "TrainingRuntime",
            "metadata": {"name": name, "labels": dict(base["metadata"].get("labels") or {})},
            "spec": copy.deepcopy(base["spec"]),
        }
        if policy is None:
            obj["spec"].pop("mlPolicy")
        else:
            obj["spec"]["mlPolicy"] = policy
        for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
            if parallelism and (job["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL):
                job["template"]["spec"]["parallelism"] = parallelism
        out.append((name, obj))
    return out


def test_the_trainer_runs_the_node_count_trainflow_predicts(k8s: Any, namespace: str) -> None:
    runtimes = k8s.custom.list_cluster_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes"
    )
    cases: list[tuple[str, str, Runtime]] = []
    for obj in runtimes["items"]:
        name = obj["metadata"]["name"]
        cases.append((name, "ClusterTrainingRuntime", Runtime.from_object(obj)))
        if name == "torch-distributed":
            for vname, vobj in variants(obj):
                k8s.custom.create_namespaced_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, namespace, "trainingruntimes", vobj
                )
                cases.append((vname, "TrainingRuntime", Runtime.from_object(vobj)))
    assert len(cases) >= 12, [c[0] for c in cases]  # the 9 vendored runtimes and the 3 variants
    for i, (runtime, kind, _) in enumerate(cases):
        trainjob(k8s, namespace, f"nodes-{i}", runtime, kind)
    seen = {
        runtime: trainer_parallelism(k8s, namespace, f"nodes-{i}") for i, (runtime, _, _) in enumerate(cases)
    }
    predicted = {runtime: node_count(None, rt) for runtime, _, rt in cases}
    assert seen == predicted
    assert (seen["nodes-3"], seen["policy-no-count"], seen["no-policy"]) == (3, 1, 2)
