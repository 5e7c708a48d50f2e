"""Compile the trainflow KFP components and the example pipeline with the real kfp.compiler."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml
from kfp import compiler, components

from trainflow.kfp.compile import compile_all

REPO = Path(__file__).resolve().parents[2]
YAML_DIR = REPO / "components" / "yaml"


def load_example():
    spec = importlib.util.spec_from_file_location(
        "kfp_train_pipeline", REPO / "dags_examples" / "kfp_train_pipeline.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["kfp_train_pipeline"] = module
    spec.loader.exec_module(module)
    return module


def test_compiled_yamls_are_up_to_date(tmp_path: Path) -> None:
    written = compile_all(tmp_path)
    assert sorted(p.name for p in written) == ["get_train_job.yaml", "train_job.yaml", "wait_train_job.yaml"]
    for path in written:
        committed = YAML_DIR / path.name
        assert committed.exists(), f"{committed} missing: run `make components`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make components`"
    # deterministic: a second run changes nothing
    again = tmp_path / "again"
    for first, second in zip(written, compile_all(again), strict=True):
        assert first.read_text() == second.read_text()


def test_train_job_yaml_interface_and_round_trip() -> None:
    doc = yaml.safe_load((YAML_DIR / "train_job.yaml").read_text())
    comp = doc["components"]["comp-train-job"]
    params = comp["inputDefinitions"]["parameters"]
    for name in (
        "runtime",
        "function",
        "num_nodes",
        "resources",
        "secret_env",
        "run_id",
        "task_name",
        "on_cancel",
    ):
        assert name in params
    assert params["num_nodes"]["parameterType"] == "NUMBER_INTEGER"
    assert params["command"]["parameterType"] == "LIST"
    assert params["env"]["parameterType"] == "STRUCT"
    assert comp["inputDefinitions"]["artifacts"]["dataset"]["isOptional"] is True
    outs = comp["outputDefinitions"]
    assert outs["artifacts"]["model"]["artifactType"]["schemaTitle"] == "system.Model"
    assert outs["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert set(outs["parameters"]) == {"job_name", "namespace", "state"}
    executor = doc["deploymentSpec"]["executors"]["exec-train-job"]["container"]
    assert executor["image"] == "python:3.11-slim"
    assert "from trainflow.kfp.runner import run_train_job" in "\n".join(executor["command"])
    # users load it as a reusable component
    loaded = components.load_component_from_file(str(YAML_DIR / "train_job.yaml"))
    assert loaded.name == "train-job"


def test_task_config_passthroughs_in_ir() -> None:
    text = (YAML_DIR / "train_job.yaml").read_text()
    assert "taskConfigPassthroughs" in text
    for field in ("RESOURCES", "KUBERNETES_AFFINITY", "KUBERNETES_VOLUMES", "ENV"):
        assert field in text


def test_example_pipeline_compiles(tmp_path: Path) -> None:
    module = load_example()
    out = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(module.build_pipeline(), str(out))
    doc = yaml.safe_load(out.read_text())
    tasks = doc["root"]["dag"]["tasks"]
    assert {"train-job", "evaluate", "condition-branches-1"} <= set(tasks)
    train = tasks["train-job"]["inputs"]["parameters"]
    assert train["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    assert train["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}"
    assert train["function"]["runtimeValue"]["constant"] == "example_training:train_regression"
    assert "promote" in out.read_text() and "reject" in out.read_text()
    # the examples image (make images) has kfp and trainflow: no step pip-installs anything at start
    executors = doc["deploymentSpec"]["executors"].values()
    assert all(e["container"]["image"] == "ghcr.io/trainflow/trainflow-examples:0.1.0" for e in executors)
    assert not any(
        "pip" in " ".join(e["container"]["command"] + e["container"].get("args", [])) for e in executors
    )
