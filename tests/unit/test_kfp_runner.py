"""Unit tests of the KFP step's parameter mapping (pure functions; no backend, no kfp runtime)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog, parse_request
from trainflow.kfp import artifacts
from trainflow.kfp import params as kparams
from trainflow.kfp import task_config as tcfg

TORCH = next(r for r in local_catalog() if r.name == "torch-distributed")


def task_config(**kw: object) -> SimpleNamespace:
    base = dict(
        affinity=None,
        tolerations=None,
        node_selector=None,
        env=None,
        volumes=None,
        volume_mounts=None,
        resources=None,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_build_request_fields_drops_unset_and_rejects_duplicates_in_extra() -> None:
    fields = kparams.build_request_fields(
        {
            "runtime": "torch-distributed",
            "image": "",
            "command": None,
            "env": {},
            "num_nodes": 2,
            "extra": {"queue": "q"},
        }
    )
    assert fields == {"runtime": "torch-distributed", "num_nodes": 2, "queue": "q"}
    with pytest.raises(InvalidRequest) as err:
        kparams.build_request_fields({"num_nodes": 2, "extra": {"num_nodes": 3}})
    assert err.value.fields == ["extra.num_nodes"]


def test_task_config_maps_onto_request_and_renders() -> None:
    tc = task_config(
        resources={"requests": {"cpu": "2"}, "limits": {"cpu": "4", "nvidia.com/gpu": "1"}},
        env=[
            {"name": "A", "value": "1"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"pool": "gpu"},
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
        },
        volumes=[
            {"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "run-1-kfp-workspace"}},
            {"name": "cfg", "configMap": {"name": "train-cfg"}},
        ],
        volume_mounts=[
            {"name": "kfp-workspace", "mountPath": "/kfp-workspace"},
            {"name": "cfg", "mountPath": "/etc/cfg"},
        ],
    )
    fields = tcfg.apply_task_config({"function": "m:f", "env": {"A": "explicit"}}, tc)
    assert fields["env"] == {"A": "explicit"}  # the step parameter wins over the TaskConfig
    assert fields["secret_env"] == {"HF_TOKEN": "hf/token"}
    assert fields["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert fields["volumes"][0]["claim_name"] == "run-1-kfp-workspace"
    manifest = build_trainjob(parse_request(fields), TORCH)
    trainer = manifest["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["requests"] == {"cpu": "2"}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in trainer[
        "env"
    ]
    patches = manifest["spec"]["runtimePatches"]
    ours = [p for p in patches if p["manager"] == tcfg.AFFINITY_MANAGER]
    assert len(ours) == 1
    pod = ours[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]
    assert pod["spec"]["affinity"] == tc.affinity
    assert pod["spec"]["volumes"] == [{"name": "cfg", "configMap": {"name": "train-cfg"}}]
    text = str(patches)
    assert "run-1-kfp-workspace" in text and "'pool': 'gpu'" in text


def test_workspace_volume_found_by_mount_path() -> None:
    tc = task_config(
        volumes=[{"name": "ws", "persistentVolumeClaim": {"claimName": "pvc-ws"}}],
        volume_mounts=[{"name": "ws", "mountPath": "/kfp-workspace"}],
    )
    vol = tcfg.workspace_volume(tc, "/kfp-workspace")
    assert vol is not None and vol["claim_name"] == "pvc-ws" and vol["mount_path"] == "/kfp-workspace"
    assert tcfg.workspace_volume(task_config(), "/kfp-workspace") is None


def test_dataset_artifact_becomes_dataset_uri_or_env(tmp_path: Path) -> None:
    s3 = SimpleNamespace(uri="s3://bucket/data", path="/nonexistent")
    assert artifacts.dataset_field({}, s3)["dataset_uri"] == "s3://bucket/data"  # type: ignore[arg-type]
    (tmp_path / "d").mkdir()
    local = SimpleNamespace(uri="gs://b/d", path=str(tmp_path / "d"))
    fields = artifacts.dataset_field({"env": {"X": "1"}}, local)  # type: ignore[arg-type]
    assert fields["env"] == {
        "X": "1",
        "TRAINFLOW_DATASET_URI": "gs://b/d",
        "TRAINFLOW_DATASET_PATH": str(tmp_path / "d"),
    }
    with pytest.raises(InvalidRequest) as err:
        artifacts.dataset_field({"dataset_uri": "hf://x"}, s3)  # type: ignore[arg-type]
    assert err.value.fields == ["dataset"]


def test_copy_model_from_file_uri(tmp_path: Path) -> None:
    src = tmp_path / "out"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"w")
    (src / "sub" / "x.json").write_text("{}")
    found = artifacts.local_dir(src.as_uri())
    assert found == src
    assert artifacts.local_dir("s3://bucket/x") is None
    files = artifacts.copy_model(found, str(tmp_path / "model"))
    assert files == ["model.pt", "sub/x.json"]
    assert (tmp_path / "model" / "model.pt").read_bytes() == b"w"


def test_numeric_metrics_skip_text_and_bools() -> None:
    assert artifacts.numeric_metrics({"loss": 0.5, "n": 2, "tag": "x", "ok": True}) == {"loss": 0.5, "n": 2.0}


def test_log_steps_take_nodes_and_initializers_and_refuse_the_rest() -> None:
    from trainflow.kfp.runner import step_log_sink

    assert list(step_log_sink(None).steps) == ["node-0"]
    assert list(step_log_sink(["dataset-initializer", "node-1"]).steps) == ["dataset-initializer", "node-1"]
    for bad in (["rank0"], ["node-"], [3]):
        with pytest.raises(InvalidRequest, match="log_steps"):
            step_log_sink(bad)
