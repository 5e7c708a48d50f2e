"""One default node count (runtimes.node_count): the TrainJob's numNodes, else the runtime's, as the Trainer
decides it; every place that needs the count (names, TorchTune's rules, the local engine, the Airflow log
selection) asks it. The real Trainer is the oracle in tests/e2e/test_node_count_on_the_trainer.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow.core import local_catalog
from trainflow.core.errors import InvalidRequest
from trainflow.core.manifest import build_trainjob, job_name
from trainflow.core.request import TrainJobRequest
from trainflow.core.runtimes import Runtime, find_runtime, node_count
from trainflow.core.validation import max_name_length

DATA = Path(__file__).resolve().parents[2] / "src" / "trainflow" / "core" / "data" / "runtimes"


def vendored() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(DATA.glob("*.yaml"))]


def variant(base: str, ml_policy: dict[str, Any] | None, parallelism: int | None = None) -> Runtime:
    """A copy of a vendored runtime with another ML policy (None: none) and trainer-job parallelism."""
    obj = copy.deepcopy(next(o for o in vendored() if o["metadata"]["name"] == base))
    obj["metadata"]["name"] = f"{base}-variant"
    if ml_policy is None:
        obj["spec"].pop("mlPolicy", None)
    else:
        obj["spec"]["mlPolicy"] = ml_policy
    rt = Runtime.from_object(obj)
    if parallelism is not None:
        job = rt.ancestor_job("trainer")
        assert job is not None
        job["template"]["spec"]["parallelism"] = parallelism
    return rt


def test_every_vendored_runtime_gives_its_ml_policy_node_count() -> None:
    objs = vendored()
    assert len(objs) >= 9
    for obj in objs:
        rt = Runtime.from_object(obj)
        assert node_count(None, rt) == obj["spec"]["mlPolicy"].get("numNodes", 1), rt.name
        assert node_count(4, rt) == 4


@pytest.mark.parametrize(
    ("ml_policy", "parallelism", "nodes"),
    [
        ({"numNodes": 3, "torch": {}}, None, 3),
        ({"torch": {}}, 5, 1),  # a policy without numNodes: 1, whatever the job's parallelism
        (None, 2, 2),  # no policy: the trainer job keeps its parallelism
        (None, None, 1),
    ],
)
def test_the_runtime_rule(ml_policy: dict[str, Any] | None, parallelism: int | None, nodes: int) -> None:
    assert node_count(None, variant("torch-distributed", ml_policy, parallelism)) == nodes
    assert node_count(None, None) == 1


def test_names_leave_room_for_the_runtime_default_nodes() -> None:
    rt = variant("torch-distributed", {"numNodes": 11, "torch": {}})
    request = TrainJobRequest(idempotency_key="dag/task/run/0", command=["python3", "t.py"])
    assert len(job_name(request, rt)) <= max_name_length(rt, 11) < max_name_length(rt, 1)
    with pytest.raises(InvalidRequest) as info:
        build_trainjob({"name": "a" * max_name_length(rt, 1), "command": ["python3", "t.py"]}, rt)
    assert info.value.fields == ["name"]


def test_torchtune_rules_count_the_runtime_default_nodes() -> None:
    base = find_runtime(local_catalog(), "torchtune-llama3.2-1b")
    obj = {
        "kind": base.kind,
        "metadata": {"name": base.name, "labels": base.labels},
        "spec": {"mlPolicy": {**base.ml_policy, "numNodes": 2}, "template": base.template},
    }
    rt = Runtime.from_object(obj)
    lora = {"runtime": rt.name, "args": ["model.lora_rank=8"]}
    with pytest.raises(InvalidRequest) as info:  # was accepted: TorchTune counted 1 node when unset
        build_trainjob(lora, rt)
    assert "num_nodes" in info.value.fields
    build_trainjob({**lora, "num_nodes": 1}, rt)


def test_the_local_engine_runs_the_runtime_default_nodes(tmp_path: Path) -> None:
    from trainflow.core.local import policies

    rt = variant("torch-distributed", None, 2)  # plain ML: the local engine runs it
    manifest = build_trainjob({"command": ["python3", "t.py"]}, rt)
    plan = policies.make_plan(manifest, rt, home=tmp_path / "home", jobdir=tmp_path / "job")
    assert plan["num_nodes"] == 2  # was 1: a runtime without an ML policy counted 1 node


def test_the_airflow_log_selection_counts_the_runtime_default_nodes() -> None:
    from trainflow.airflow.logstream import log_steps
    from trainflow.airflow.logstream import node_count as airflow_nodes

    rt = variant("torch-distributed", None, 3)
    manifest = build_trainjob({"command": ["python3", "t.py"]}, rt)
    assert airflow_nodes(manifest, rt) == 3
    assert log_steps("all", airflow_nodes(manifest, rt)) == ["node-0", "node-1", "node-2"]


@pytest.mark.parametrize("runtime_name", [r.name for r in local_catalog()])
def test_every_pod_name_fits_jobsets_check(runtime_name: str) -> None:
    """JobSet's webhook (v0.12.0, jobset_webhook.go) refuses a JobSet whose longest pod name
    ``<jobset>-<rjob>-<jobIdx>-<podIdx>-abcde`` passes 63 characters; the Trainer then never creates it. The
    derived name leaves room for it in every replicated job, initializers included (found on real pods: a
    39-character name with ``dataset-initializer`` was refused)."""
    rt = next(r for r in local_catalog() if r.name == runtime_name)
    request = TrainJobRequest(idempotency_key="a-very-long-pipeline/and-task/identity-key" * 3, command=["x"])
    name = job_name(request, rt)
    for rjob in rt.replicated_job_names:
        assert len(f"{name}-{rjob}-0-0-abcde") <= 63, (name, rjob)
