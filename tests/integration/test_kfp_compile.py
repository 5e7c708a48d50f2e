"""Compile the trainflow KFP components and the example pipeline with the real kfp.compiler."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from kfp import compiler, components, dsl

from trainflow.kfp.compile import compile_all

REPO = Path(__file__).resolve().parents[2]
YAML_DIR = REPO / "components" / "yaml"
sys.path.insert(0, str(REPO / "scripts"))
from ocibuild.recipes import IMAGES  # noqa: E402  (the image builder names the step image)

STEP_IMAGE = IMAGES["kfp"].default_name


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
    assert set(outs["parameters"]) == {"job_name", "namespace", "state", "result"}
    assert outs["artifacts"]["summary"]["artifactType"]["schemaTitle"] == "system.Markdown"
    executor = doc["deploymentSpec"]["executors"]["exec-train-job"]["container"]
    assert "from trainflow.kfp.runner import run_train_job" in "\n".join(executor["command"])
    # users load it as a reusable component
    loaded = components.load_component_from_file(str(YAML_DIR / "train_job.yaml"))
    assert loaded.name == "train-job"


def test_components_run_the_step_image_and_install_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.kfp.components import IMAGE_ENV, make_train_job_component

    for path in sorted(YAML_DIR.glob("*.yaml")):
        (executor,) = yaml.safe_load(path.read_text())["deploymentSpec"]["executors"].values()
        script = " ".join(executor["container"]["command"])
        assert executor["container"]["image"] == STEP_IMAGE == "ghcr.io/trainflow/trainflow-kfp:0.1.0", path
        assert "pip" not in script and "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main" in script, path
    # a mirror: the environment for the default components, --image for the YAMLs, or the factory argument
    mirror = "registry.example.com/ml/trainflow-kfp:0.1.0"
    monkeypatch.setenv(IMAGE_ENV, mirror)
    compiler.Compiler().compile(make_train_job_component(), str(tmp_path / "env.yaml"))
    assert f"image: {mirror}" in (tmp_path / "env.yaml").read_text()
    for path in compile_all(tmp_path / "yamls", image="mirror.example/step:1"):
        assert "image: mirror.example/step:1" in path.read_text() and "trainflow-kfp" not in path.read_text()
    assert compile_all(tmp_path / "default")[0].read_text() == (YAML_DIR / "get_train_job.yaml").read_text()


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
    # training is never a cache hit unless the pipeline opts in; evaluate keeps kfp's default
    assert tasks["train-job"]["cachingOptions"] == {} and tasks["evaluate"]["cachingOptions"]["enableCache"]
    train = tasks["train-job"]["inputs"]["parameters"]
    assert not {"run_id", "task_name", "idempotency_key", "name"} & set(train)  # no identity boilerplate
    assert train["function"]["runtimeValue"]["constant"] == "example_training:train_regression"
    assert "promote" in out.read_text() and "reject" in out.read_text()
    # the examples image (make images) has kfp and trainflow: no step pip-installs anything at start
    executors = doc["deploymentSpec"]["executors"].values()
    assert all(e["container"]["image"] == "ghcr.io/trainflow/trainflow-examples:0.1.0" for e in executors)
    assert not any(
        "pip" in " ".join(e["container"]["command"] + e["container"].get("args", [])) for e in executors
    )


def test_shipped_components_are_not_cached_by_default(tmp_path: Path) -> None:
    for path in sorted(YAML_DIR.glob("*.yaml")):
        (task,) = yaml.safe_load(path.read_text())["root"]["dag"]["tasks"].values()
        assert task["cachingOptions"] == {}, path  # enableCache false: a backend runs the YAML uncached
    # kfp reads no caching option from a component file: a task of a loaded component follows the pipeline's
    # default (on), so the pipeline turns it off itself (docs/kfp.md, "Caching")
    loaded = components.load_component_from_file(str(YAML_DIR / "train_job.yaml"))

    @dsl.pipeline
    def from_yaml():  # no annotations: this module has postponed (string) ones, which kfp cannot read
        loaded(command=["a"])
        loaded(command=["b"]).set_caching_options(False)

    compiler.Compiler().compile(from_yaml, str(tmp_path / "p.yaml"))
    tasks = yaml.safe_load((tmp_path / "p.yaml").read_text())["root"]["dag"]["tasks"]
    assert tasks["train-job"]["cachingOptions"] == {"enableCache": True}
    assert tasks["train-job-2"]["cachingOptions"] == {}
