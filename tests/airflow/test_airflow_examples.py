"""The example DAGs: all parse without a cluster; (a) and (b) train real models through ``airflow dags test``
on the local engine; (c) renders to a valid TorchTune TrainJob offline."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bounds import HANG

RUNNER = Path(__file__).resolve().parent / "dag_runner.py"
EXAMPLE_DAGS = {
    "trainflow_retraining",
    "trainflow_hparam_sweep",
    "trainflow_llm_finetune",
    "trainflow_external_sensor",
}


@pytest.fixture(scope="module")
def dagbag(af, airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    folder = str(af.repo / "dags_examples")
    sys.path.insert(0, folder)  # Airflow puts the dags folder on sys.path; a bare DagBag does not
    try:
        yield DagBag(folder)
    finally:
        sys.path.remove(folder)


def test_examples_parse_without_a_cluster(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= EXAMPLE_DAGS
    assert dagbag.get_dag("trainflow_retraining").schedule == "@daily"


def test_llm_finetune_renders_a_torchtune_trainjob(dagbag) -> None:
    from trainflow.core import build_trainjob
    from trainflow.core.runtimes import find_runtime, local_catalog

    dag = dagbag.get_dag("trainflow_llm_finetune")
    op = dag.get_task("finetune")
    params = {k: dag.params[k] for k in dag.params}
    op.render_template_fields({"params": params})
    ti = SimpleNamespace(
        dag_id=dag.dag_id, task_id="finetune", run_id="manual__2026-02-01T00:00:00", map_index=-1
    )
    request = op.build_request({"ti": ti, "params": params})
    manifest = build_trainjob(request, find_runtime(local_catalog(), request.runtime), namespace="ml-team")
    spec = manifest["spec"]
    assert spec["runtimeRef"]["name"] == "torchtune-llama3.2-1b"
    assert spec["initializer"]["dataset"] == {"storageUri": "hf://tatsu-lab/alpaca/data"}
    model = spec["initializer"]["model"]
    assert model["storageUri"] == "hf://meta-llama/Llama-3.2-1B-Instruct"
    token = {"name": "ACCESS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert token in model["env"]
    assert spec["trainer"]["command"] == ["tune", "run"]  # the Trainer's TorchTune mode
    assert spec["trainer"]["args"][-3:] == ["epochs=1", "batch_size=4", "dataset.split=train[:2000]"]
    assert spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"
    labels = manifest["metadata"]["labels"]
    assert labels["airflow.apache.org/dag-id"] == "trainflow_llm_finetune"
    assert labels["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert "trainflow.dev/key" in labels
    assert manifest["metadata"]["namespace"] == "ml-team"


def dags_test(af, home: Path, tmp_path: Path, dag_id: str, *extra: str) -> dict:
    env = af.env(home)
    started = time.monotonic()
    result = af.run(
        [str(af.bin / "airflow"), "dags", "test", dag_id, *extra], env, 900, tmp_path / f"{dag_id}.log"
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0 and "state=success" in result.stdout, result.stdout[-8000:]
    summary = af.run([sys.executable, str(RUNNER), "--summary", dag_id], env, HANG, tmp_path / "summary.log")
    assert summary.returncode == 0, summary.stdout[-4000:]
    line = [ln for ln in summary.stdout.splitlines() if ln.startswith('{"run_id"')][-1]
    print(f"airflow dags test {dag_id}: {elapsed:.0f}s")
    return {**json.loads(line), "log": result.stdout, "seconds": elapsed}


def model_file(output_uri: str) -> Path:
    assert output_uri.startswith("file://")
    return Path(output_uri[len("file://") :]) / "model.pt"


@pytest.mark.slow
def test_retraining_example_trains_evaluates_and_promotes(af, airflow_db, trainflow_home, tmp_path) -> None:
    out = dags_test(af, trainflow_home, tmp_path, "trainflow_retraining", "2026-03-05")
    tasks, xcoms = out["tasks"], out["xcoms"]
    assert tasks["train[-1]"]["state"] == "success"
    train = xcoms["train[-1].return_value"]
    assert train["state"] == "Complete"
    assert train["metrics"]["world_size"] == 4.0  # 2 nodes x 2 processes, torch DDP
    model = model_file(train["output_uri"])
    assert model.is_file() and model.stat().st_size > 0
    metrics = xcoms["evaluate[-1].return_value"]
    assert metrics["model_path"] == str(model)  # the evaluator found the model through the XCom result
    assert metrics["trainjob"] == train["name"]
    assert metrics["mse"] < 0.01
    assert xcoms["train[-1].job_name"] == train["name"]
    # first run: nothing to beat, so the model is promoted
    assert tasks["promote[-1]"]["state"] == "success" and tasks["keep_current[-1]"]["state"] == "skipped"
    assert Path(xcoms["promote[-1].return_value"]).is_file()
    # the dataset location came from the data interval
    dataset = trainflow_home / "datasets" / "regression" / "2026-03-05" / "manifest.json"
    assert dataset.is_file()

    # the metrics history in XCom: every report of rank 0 (loss every 4 of 60 epochs, then the final one), with
    # an ETA from the second on; and the task's TrainJob page (from that XCom) draws each point, in Chromium
    from browser import cli_chart_points, history_points, task_page_points

    history = train["history"]
    assert len(history["time"]) == history["seen"] == 16 >= 10
    assert all(e is not None for e in history["eta_seconds"][1:])
    expected = history_points(history)
    assert expected["progress"] == expected["loss"] == 16, expected
    assert task_page_points(train, "trainflow_retraining", "train", tmp_path) == expected
    assert cli_chart_points(train, tmp_path) == expected  # the CLI's chart file of the saved XCom result


@pytest.mark.slow
def test_sweep_example_maps_learning_rates_and_picks_the_best(
    af, airflow_db, trainflow_home, tmp_path
) -> None:
    conf = json.dumps({"learning_rates": [0.01, 0.2], "epochs": 20})
    out = dags_test(af, trainflow_home, tmp_path, "trainflow_hparam_sweep", "-c", conf)
    xcoms = out["xcoms"]
    runs = [xcoms[f"train[{i}].return_value"] for i in (0, 1)]
    assert len({r["name"] for r in runs}) == 2  # one TrainJob per mapped task instance
    losses = {r["name"]: r["metrics"]["train_loss"] for r in runs}
    best = xcoms["pick_best[-1].return_value"]
    assert best["name"] == min(losses, key=losses.get)
    assert best["train_loss"] == pytest.approx(min(losses.values()))
    evaluated = xcoms["evaluate_best[-1].return_value"]
    assert Path(evaluated["model_path"]) == model_file(best["output_uri"])
    assert Path(evaluated["model_path"]).is_file()
