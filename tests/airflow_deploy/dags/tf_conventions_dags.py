"""DAGs for the conventions suite (tests/airflow_deploy/test_conventions.py): operators with their defaults, as
a new user writes them. Only arguments the provider has today appear here, so the file always parses.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from trainflow.airflow import TrainJobOperator

START = datetime(2026, 1, 1)
RUNTIME = "jax-distributed"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


def train_steps(steps: int = 5, step_seconds: float = 1.0) -> None:
    import time

    for i in range(int(steps)):
        time.sleep(float(step_seconds))
        print(f"step {i + 1}/{steps} loss {1.0 / (i + 1):.4f}", flush=True)


with DAG(
    "tf_conv_defaults",
    schedule=None,
    start_date=START,
    params={"steps": 20},
    render_template_as_native_obj=True,
):
    # no deferrable, no stream_logs: the deployment's [operators] default_deferrable and the provider's
    # defaults decide
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=train_steps,
        function_kwargs={"steps": "{{ params.steps }}"},
    )

with DAG("tf_conv_decorator", schedule=None, start_date=START):

    @task.trainjob(runtime=RUNTIME, num_nodes=1, deferrable=False)
    def fit(lr: float) -> dict:
        return {"lr": lr, "accuracy": 0.93}

    @task
    def check(value: dict) -> dict:
        return value

    check(fit(lr=0.01))

with DAG(
    "tf_conv_assets",
    schedule=None,
    start_date=START,
    params={"dataset": "file:///tmp/dataset", "output": "file:///tmp/model"},
):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=train_steps,
        function_kwargs={"steps": 1, "step_seconds": 0.1},
        dataset_uri="{{ params.dataset }}",
        output_uri="{{ params.output }}",
        deferrable=False,
    )

with DAG("tf_conv_cncf_conn", schedule=None, start_date=START, params={"namespace": "default"}):
    # the cncf.kubernetes connection users already have
    TrainJobOperator(
        task_id="train",
        conn_id="kubernetes_default",
        namespace="{{ params.namespace }}",
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=1,
        deferrable=False,
    )
