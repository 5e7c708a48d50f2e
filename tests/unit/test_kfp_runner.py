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


def test_identity_key_is_stable_and_separates_arguments() -> None:
    params = {"function": "m:f", "function_kwargs": {"epochs": 1}}
    a = kparams.identity_key(idempotency_key=None, run_id="run-1", task_name="train-job", params=params)
    b = kparams.identity_key(idempotency_key=None, run_id="run-1", task_name="train-job", params=dict(params))
    other = kparams.identity_key(
        idempotency_key=None,
        run_id="run-1",
        task_name="train-job",
        params={**params, "function_kwargs": {"epochs": 2}},
    )
    assert a == b and a is not None and a.startswith("train-job/run-1/")
    assert other != a  # ParallelFor iterations with different arguments get different jobs
    assert kparams.identity_key(idempotency_key="mine", run_id="r", task_name="t", params=params) == "mine"


def test_identity_key_ignores_unresolved_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KFP_RUN_ID", raising=False)
    assert (
        kparams.identity_key(
            idempotency_key=None,
            run_id="{{$.pipeline_job_uuid}}",
            task_name="{{$.pipeline_task_name}}",
            params={},
        )
        is None
    )
    monkeypatch.setenv("KFP_RUN_ID", "from-env")
    key = kparams.identity_key(
        idempotency_key=None, run_id="{{$.pipeline_job_uuid}}", task_name="t", params={}
    )
    assert key is not None and key.startswith("t/from-env/")


# Output artifact URIs as the KFP backend's driver provisions them (2.4+: a uuid per task execution, shared by
# every retry of the step's pod), as it did before 2.4, and as kfp.local lays them out.
BACKEND = "minio://mlpipeline/v2/artifacts/train-pipeline/6f1c2a0e-0b7d-4f0e-9d55-0d6c3f7c2b11/train-job/{salt}/model"
SALT_1 = "0a1b2c3d-1111-4222-8333-944455556666"
SALT_2 = "7e8f9a0b-aaaa-4bbb-8ccc-dddddddddddd"
OLD_BACKEND = "minio://mlpipeline/v2/artifacts/train-pipeline/run-7/train-job/model"
KFP_LOCAL = "/tmp/root/train-pipeline-2026-12-01-13-25-56-013443/for-loop-2-iteration-{i}/train-job/model"


def derived(uri: str, params: dict[str, object] | None = None) -> str | None:
    return kparams.identity_key(
        idempotency_key=None, run_id=None, task_name=None, params=params or {}, artifact_uri=uri
    )


def test_identity_from_output_artifact_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KFP_RUN_ID", raising=False)
    monkeypatch.delenv("KFP_TASK_NAME", raising=False)
    params = {"function": "m:f"}
    first = derived(BACKEND.format(salt=SALT_1), params)
    # a retried pod gets the same executor input; the metrics artifact sits in the same folder
    assert first == derived(BACKEND.format(salt=SALT_1).replace("/model", "/metrics"), params)
    assert first is not None and first.startswith("train-job/")  # the task's folder, not the uuid
    # another execution of the task (a ParallelFor iteration, even with identical arguments) is another job
    assert derived(BACKEND.format(salt=SALT_2), params) != first
    # before KFP 2.4 iterations shared one folder: the arguments still tell them apart
    assert derived(OLD_BACKEND, {"x": 1}) != derived(OLD_BACKEND, {"x": 2})
    assert derived(OLD_BACKEND, {"x": 1}) == derived(OLD_BACKEND, {"x": 1})
    assert derived(KFP_LOCAL.format(i=0)) != derived(KFP_LOCAL.format(i=1))
    for no_folder in (None, "", "model", "/model", "s3://model", "{{$.outputs.artifacts['model'].uri}}"):
        assert derived(no_folder) is None, no_folder  # type: ignore[arg-type]


def test_explicit_identity_wins_over_the_artifact_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KFP_RUN_ID", raising=False)
    uri = BACKEND.format(salt=SALT_1)
    assert kparams.identity_key(
        idempotency_key="mine", run_id="r", task_name="t", params={}, artifact_uri=uri
    ) == ("mine")
    by_run = kparams.identity_key(
        idempotency_key=None, run_id="r", task_name="t", params={}, artifact_uri=uri
    )
    assert by_run is not None and by_run.startswith("t/r/")
    monkeypatch.setenv("KFP_RUN_ID", "from-env")
    monkeypatch.setenv("KFP_TASK_NAME", "task-env")
    by_env = kparams.identity_key(
        idempotency_key=None, run_id=None, task_name=None, params={}, artifact_uri=uri
    )
    assert by_env is not None and by_env.startswith("task-env/from-env/")


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


def test_step_without_any_identity_is_refused_before_submitting(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.kfp.runner import request_fields

    monkeypatch.delenv("KFP_RUN_ID", raising=False)
    monkeypatch.delenv("KFP_TASK_NAME", raising=False)
    with pytest.raises(InvalidRequest) as err:
        request_fields({"function": "m:f"}, None, None, artifact_uri=None)
    assert err.value.fields == ["run_id"] and "idempotency_key" in str(err.value)
    fields = request_fields({"function": "m:f"}, None, None, artifact_uri=BACKEND.format(salt=SALT_1))
    assert fields["idempotency_key"] == derived(BACKEND.format(salt=SALT_1), {"function": "m:f"})
