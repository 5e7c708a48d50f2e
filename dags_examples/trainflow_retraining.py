"""Scheduled retraining: train a regression model every day, evaluate it, promote it only if it is better.

prepare_dataset -> train (TrainJob: torch-distributed, 2 nodes x 2 processes) -> evaluate -> branch
-> promote | keep_current. The dataset location is templated from the data interval; the evaluator
loads the model file the TrainJob wrote (found through the XCom result's ``output_uri``); the current
best metric lives in the Airflow Variable ``trainflow_retraining_best_mse``.

Runs on a cluster or on the embedded local engine: the ``kubeflow_trainer_default`` connection decides
(``{"backend": "local"}`` for the local engine, as ``scripts/demo.sh`` sets it up). On a cluster, the
datasets and the model live on a shared ReadWriteMany volume mounted at the same path in the trainer pods and
in the Airflow workers: ``TRAINFLOW_SHARED_PVC`` names its PersistentVolumeClaim, ``TRAINFLOW_SHARED_MOUNT``
the mount path (default ``/mnt/trainflow``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

try:  # Airflow 3 (common-compat's sdk module is missing where 3.0.6's constraints pin 1.7.3)
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow.decorators import task

    from airflow import DAG
from example_training import train_regression

from trainflow.airflow import TrainJobOperator

BEST_VARIABLE = "trainflow_retraining_best_mse"
SHARED_PVC = os.environ.get("TRAINFLOW_SHARED_PVC")
SHARED_MOUNT = os.environ.get("TRAINFLOW_SHARED_MOUNT", "/mnt/trainflow")


def _data_root() -> str:
    """Where daily datasets land: the shared volume on a cluster, a plain directory for the local engine."""
    if SHARED_PVC:
        return os.path.join(SHARED_MOUNT, "datasets")
    home = os.environ.get("TRAINFLOW_HOME") or os.path.expanduser("~/.local/share/trainflow")
    return os.environ.get("TRAINFLOW_DATA_ROOT") or os.path.join(home, "datasets")


def _model_path(output_uri: str) -> Path:
    path = output_uri[len("file://") :] if output_uri.startswith("file://") else output_uri
    return Path(path) / "model.pt"


with DAG(
    dag_id="trainflow_retraining",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # every step is safe to repeat; a retry also rides out a worker lost or an API server slow to answer
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    render_template_as_native_obj=True,
    user_defined_macros={"data_root": _data_root()},
    tags=["trainflow", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_dataset(data_interval_start=None, ds=None) -> str:
        """Materialise the interval's dataset manifest where the TrainJob's dataset initializer reads it."""
        import json

        folder = Path(_data_root()) / "regression" / str(ds)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = {"interval_start": str(data_interval_start), "generator": "y = 3*x1 - 2*x2 + 0.5"}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return str(folder)

    train = TrainJobOperator(
        task_id="train",
        runtime="torch-distributed",
        function=train_regression,
        function_kwargs={"epochs": 60, "lr": 0.1, "seed": "{{ data_interval_start.day }}"},
        num_nodes=2,
        proc_per_node=2,
        # the local engine hands a file:// dataset to the trainer; the cluster runtime has no dataset
        # initializer, so there the trainer reads TRAINING_DATA from the shared volume
        dataset_uri=None
        if SHARED_PVC
        else "file://{{ data_root }}/regression/{{ data_interval_start | ds }}",
        env={
            "TRAINING_INTERVAL": "{{ data_interval_start | ds }}/{{ data_interval_end | ds }}",
            "TRAINING_DATA": "{{ data_root }}/regression/{{ data_interval_start | ds }}",
        },
        output_uri=f"file://{SHARED_MOUNT}/models/{{{{ dag.dag_id }}}}/{{{{ ts_nodash }}}}"
        if SHARED_PVC
        else None,
        volumes=[{"claim_name": SHARED_PVC, "mount_path": SHARED_MOUNT}] if SHARED_PVC else None,
        stream_logs=True,  # rank 0's log lines appear in this task's log as they are written
        retries=1,
        retry_delay=timedelta(seconds=5),
    )

    @task
    def evaluate(result: dict) -> dict:
        """Load the model file the TrainJob wrote and score it on held-out data."""
        from example_training import evaluate_model

        model = _model_path(result["output_uri"])
        metrics = evaluate_model(model)
        metrics.update(
            model_path=str(model), trainjob=result["name"], train_loss=result["metrics"].get("train_loss")
        )
        print(f"evaluation of {result['name']}: mse={metrics['mse']:.3e} model={model}")
        return metrics

    @task.branch
    def better_than_current(metrics: dict) -> str:
        try:
            from airflow.sdk import Variable
        except ImportError:  # Airflow 2
            from airflow.models import Variable

        best = Variable.get(BEST_VARIABLE, None)  # the default, positionally: 2.x calls it default_var
        if best is None or metrics["mse"] < float(best):
            print(f"new mse {metrics['mse']:.3e} beats current {best}: promoting")
            return "promote"
        print(f"new mse {metrics['mse']:.3e} does not beat current {best}: keeping the current model")
        return "keep_current"

    @task
    def promote(metrics: dict) -> str:
        import shutil

        try:
            from airflow.sdk import Variable
        except ImportError:  # Airflow 2
            from airflow.models import Variable

        target = Path(_data_root()).parent / "models" / "regression" / "best"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(metrics["model_path"], target / "model.pt")
        Variable.set(BEST_VARIABLE, str(metrics["mse"]))
        print(f"promoted {metrics['model_path']} -> {target / 'model.pt'}")
        return str(target / "model.pt")

    @task
    def keep_current() -> None:
        print("current model kept")

    dataset = prepare_dataset()
    metrics = evaluate(train.output)
    choice = better_than_current(metrics)
    dataset >> train
    choice >> [promote(metrics), keep_current()]
