"""Issue 10 items 2, 3, 5 and 7 through Airflow on real pods (``airflow dags test`` / ``dag.test()`` in a
subprocess, kubernetes backend from the connection, deferrable waits in the in-process triggerer):

- the retraining example DAG: torch 2x2 function trainer; the downstream task loads the model the pods wrote
  on the shared volume; XCom metrics come from ``trainerStatus``; rank 0's log streams into the task log; the
  wait's history (10+ points, an ETA while running) is drawn on the task's TrainJob page and in the CLI's chart;
- ``@task.trainjob`` on torch-distributed;
- ``on_kill`` (SIGTERM to a task waiting in the worker) deletes the TrainJob: nothing left, CRI included.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from browser import cli_chart_points, history_points, task_page_points
from conftest import TRAINER_GROUP, TRAINER_VERSION, record, sigterm_when_running

pytestmark = pytest.mark.e2e

# run() and the Airflow environment of the kwok e2e suite
_spec = importlib.util.spec_from_file_location(
    "trainflow_e2e_airflow", Path(__file__).resolve().parents[1] / "e2e" / "test_airflow_cluster.py"
)
assert _spec is not None and _spec.loader is not None
_af = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_af)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUNNER = REPO / "tests" / "airflow" / "dag_runner.py"
EXAMPLES = REPO / "dags_examples"
DAGS = Path(__file__).resolve().parent / "dags"
LOGICAL = "2026-03-05"
# The asset events Airflow recorded for one URI, as [[dag_id, task_id], ...] on the last line.
ASSET_EVENTS = """
import json, sys
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as session:
    rows = session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).filter(
        AssetModel.uri == sys.argv[1]).all()
    print(json.dumps([[r.source_dag_id, r.source_task_id] for r in rows]))
"""


def airflow_env(
    home: Path, testbed: Any, ns: str, dags: Path, extra_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The e2e suite's Airflow environment (the connection points at this cluster and namespace), these DAGs."""
    conn = {
        "backend": "kubernetes",
        "kubeconfig_path": str(testbed.kubeconfig),
        "context": testbed.context,
        "namespace": ns,
    }
    env: dict[str, str] = _af.airflow_env(home, conn)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    env.update(extra_env or {})
    return env


run = _af.run


def summary(env: dict[str, str], dag_id: str, log: Path) -> dict[str, Any]:
    rc, out = run([sys.executable, str(RUNNER), "--summary", dag_id], env, 300, log)
    assert rc == 0, out[-4000:]
    return json.loads([ln for ln in out.splitlines() if ln.startswith('{"run_id"')][-1])


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("airflow-pods")
    (home / "airflow").mkdir()
    (home / "trainflow").mkdir()
    env = {**os.environ, "AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    rc, out = run([str(BIN / "airflow"), "db", "migrate"], env, HANG, home / "migrate.log")
    assert rc == 0, out[-4000:]
    yield home


def test_retraining_example_dag_trains_on_pods_and_evaluates_the_model_from_the_shared_volume(
    testbed: Any, k8s: Any, namespace: str, shared_volume: Any, airflow_home: Path, tmp_path: Path
) -> None:
    env = airflow_env(
        airflow_home,
        testbed,
        namespace,
        EXAMPLES,
        {
            "TRAINFLOW_SHARED_PVC": shared_volume.claim,
            "TRAINFLOW_SHARED_MOUNT": str(shared_volume.path),
            # a deployment with a triggerer: the example's operator follows [operators] default_deferrable
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        },
    )
    t0 = time.monotonic()
    rc, log = run(
        [str(BIN / "airflow"), "dags", "test", "trainflow_retraining", LOGICAL],
        env,
        900,
        tmp_path / "dag.log",
    )
    elapsed = time.monotonic() - t0
    assert rc == 0 and "state=success" in log, log[-8000:]
    out = summary(env, "trainflow_retraining", tmp_path / "summary.log")
    tasks, xcoms = out["tasks"], out["xcoms"]
    assert tasks["train[-1]"]["state"] == "success" and tasks["evaluate[-1]"]["state"] == "success", tasks
    assert "DEFERRED" in log.upper(), log[-6000:]  # the triggerer waited, not the worker

    train = xcoms["train[-1].return_value"]
    assert train["state"] == "Complete" and train["namespace"] == namespace
    # XCom metrics are the ones the Trainer's status server wrote into trainerStatus
    tj = k8s.custom.get_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", train["name"]
    )
    posted = {m["name"]: float(m["value"]) for m in tj["status"]["trainerStatus"]["metrics"]}
    assert train["metrics"] == pytest.approx(posted), (train["metrics"], posted)
    assert posted["world_size"] == 4.0  # 2 nodes x 2 processes in real pods
    assert tj["status"]["trainerStatus"]["progressPercentage"] == 100

    # the model the pods wrote, read by the downstream task from the shared volume (same path here)
    model = Path(train["output_uri"].removeprefix("file://")) / "model.pt"
    assert model.is_relative_to(shared_volume.path) and model.is_file()
    metrics = xcoms["evaluate[-1].return_value"]
    assert metrics["model_path"] == str(model) and metrics["trainjob"] == train["name"]
    assert metrics["mse"] < 0.01
    assert tasks["promote[-1]"]["state"] == "success"
    # rank 0's log lines were streamed into the train task's log while it ran
    assert "world_size=4" in log and "saved model to" in log, log[-8000:]

    # the history the deferred wait kept from trainerStatus (rank 0 reports every 4 of 60 epochs, then the final
    # report; a status update may fold two reports into one point): an ETA from the second running point on, and
    # the task's TrainJob page, read by Chromium, draws every point of it
    history = train["history"]
    assert 10 <= len(history["time"]) <= 16, history
    running = [e for e, p in zip(history["eta_seconds"], history["progress"], strict=True) if p and p < 100]
    assert running[1:] and all(e is not None for e in running[1:]), history
    expected = history_points(history)
    assert expected["loss"] >= 10, expected
    assert task_page_points(train, "trainflow_retraining", "train", tmp_path) == expected
    assert cli_chart_points(train, tmp_path) == expected  # the CLI's chart file of the saved XCom result
    record("airflow_retraining_dag", {"seconds": round(elapsed, 1), "history_points": len(history["time"])})


def test_task_trainjob_function_runs_on_torch_distributed(
    testbed: Any, namespace: str, airflow_home: Path, tmp_path: Path
) -> None:
    env = airflow_env(airflow_home, testbed, namespace, DAGS)
    t0 = time.monotonic()
    rc, log = run(
        [sys.executable, str(RUNNER), "tf_pods_task_trainjob", f"{LOGICAL}T00:00:00", f"{LOGICAL}T00:00:00"],
        env,
        600,
        tmp_path / "dag.log",
    )
    assert rc == 0, log[-8000:]
    out = json.loads([ln for ln in log.splitlines() if ln.startswith('{"run_id"')][-1])
    checked = out["xcoms"]["check[-1].return_value"]
    assert checked["state"] == "Complete", out
    # ranks 0 and 1 contributed 1*2.5 + 2*2.5 through gloo; rank 0 reported it via the status server
    assert checked["metrics"] == {"reduced": 7.5, "world_size": 2.0}, checked
    # the function's return value (rank 0's, from its pod's log) is the task's XCom, as with @task.kubernetes
    assert checked["returned"] == {"reduced": 7.5, "world_size": 2, "rank": 0}, checked
    record("airflow_task_trainjob", {"seconds": round(time.monotonic() - t0, 1)})


def test_on_kill_deletes_the_trainjob_and_its_pods(
    testbed: Any, k8s: Any, namespace: str, airflow_home: Path, tmp_path: Path
) -> None:
    env = airflow_env(airflow_home, testbed, namespace, DAGS)
    log = tmp_path / "dag.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(RUNNER), "tf_pods_on_kill", f"{LOGICAL}T01:00:00", f"{LOGICAL}T01:00:00"],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    total, gone = sigterm_when_running(testbed, k8s, namespace, proc, group=False)  # as a worker does
    text = log.read_text()
    assert "deleted TrainJob" in text, text[-6000:]
    record("airflow_on_kill", {"sigterm_to_all_gone_s": round(total, 1), "wait_s": round(gone, 1)})


def test_s3_dag_initializers_fill_the_workspace_and_the_downstream_task_loads_the_model_from_the_store(
    testbed: Any,
    k8s: Any,
    namespace: str,
    store: Any,
    initializers_runtime: str,
    airflow_home: Path,
    tmp_path: Path,
) -> None:
    """Issue 22, acceptance 1 and 4: the Trainer's initializers download the dataset and the base model from the
    store; the deferred task's function trainer fine-tunes it and publishes to s3://; the downstream task loads
    it from the store with its own credentials. The store's keys appear in no object, env, log or XCom."""
    from test_objstore_pods import everything, seed_inputs

    from trainflow.core import storage

    data, model = seed_inputs(store, namespace, tmp_path)
    output = store.uri(namespace, "models", "airflow")
    s3_env = {"TF_S3_DATA": data, "TF_S3_MODEL": model, "TF_S3_OUTPUT": output}
    s3_env |= {"TF_S3_ENDPOINT": store.service_endpoint, "TF_S3_REGION": store.region}
    env = airflow_env(airflow_home, testbed, namespace, DAGS, {**s3_env, **store.host_env()})
    t0 = time.monotonic()
    logical = f"{LOGICAL}T02:00:00"
    rc, log = run(
        [sys.executable, str(RUNNER), "tf_pods_s3", logical, logical], env, 600, tmp_path / "dag.log"
    )
    elapsed = time.monotonic() - t0
    assert rc == 0, log[-8000:]
    out = json.loads([ln for ln in log.splitlines() if ln.startswith('{"run_id"')][-1])
    assert "DEFERRED" in log.upper(), log[-6000:]  # the triggerer waited, not the worker
    evaluated = out["xcoms"]["evaluate[-1].return_value"]
    result = evaluated["result"]
    assert result["state"] == "Complete" and result["output_uri"] == output, result
    assert evaluated["files"] == ["model.pt", "weights.json"], evaluated
    weights = evaluated["weights"]
    assert weights["base"] == "tiny-linear" and weights == evaluated["returned"], evaluated
    assert weights["w"] == pytest.approx(2.0, abs=0.05) and weights["b"] == pytest.approx(1.0, abs=0.05)
    assert result["metrics"]["loss"] < 1e-3  # from trainerStatus

    # both initializers ran the Trainer's code against the store; the trainer saw what they downloaded
    pods = {
        p.metadata.labels.get("jobset.sigs.k8s.io/replicatedjob-name"): p
        for p in k8s.core.list_namespaced_pod(namespace).items
    }
    assert set(pods) == {"dataset-initializer", "model-initializer", "node"}, list(pods)
    logs = {
        step: k8s.core.read_namespaced_pod_log(
            p.metadata.name, namespace, container=p.spec.containers[0].name
        )
        for step, p in pods.items()
    }
    assert "points.csv" in logs["dataset-initializer"], logs["dataset-initializer"]
    assert "Skipping ignored file" in logs["model-initializer"], logs["model-initializer"]
    assert "model dir: ['config.json']" in logs["node"], logs["node"][-3000:]
    assert f"published 2 file(s) to {output}" in logs["node"], logs["node"][-3000:]
    assert storage.download(output, tmp_path / "got", store.host_env()) == ["model.pt", "weights.json"]
    # the task's Asset outlet names the object: Airflow recorded its event when the task succeeded
    rc, events = run([sys.executable, "-c", ASSET_EVENTS, output], env, 120, tmp_path / "assets.log")
    assert rc == 0 and json.loads(events.strip().splitlines()[-1]) == [["tf_pods_s3", "fit"]], events[-3000:]

    # the keys reached the pods as Secret references only, and the task log and XCom never held them
    text = (
        everything(k8s, namespace)
        + json.dumps(out)
        + "".join(p.read_text(errors="replace") for p in (airflow_home / "airflow" / "logs").rglob("*.log"))
    )
    assert store.secret_access_key not in text and store.access_key_id not in text
    record("airflow_s3_dag", {"seconds": round(elapsed, 1)})
