"""DAGs for the Airflow e2e test: TrainJobOperator (deferrable) against the testbed cluster.

The cluster, namespace and credentials come from the ``kubeflow_trainer_default`` connection
(``AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT``), as in production; kwok runs no containers, so a plain
``command`` is enough.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from trainflow.airflow import TrainJobOperator

START = datetime(2026, 1, 1)
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
# kwok Stages set up by testbed/kwok.py: the label fails a pod with the annotation's exit code.
KWOK_FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
KWOK_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
# pods run this long, so the trigger's watch (which starts after the deferral) sees them Running
KWOK_COMPLETE_DELAY = {"pod-complete.stage.kwok.x-k8s.io/delay": "12s"}
KWOK_FAIL_DELAY = {"pod-container-running-failed.stage.kwok.x-k8s.io/delay": "12s"}

with DAG("tf_e2e_cluster", schedule=None, start_date=START):
    train = TrainJobOperator(
        task_id="train",
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "--nnodes=2", "train.py"],
        num_nodes=2,
        output_uri="s3://bucket/models/airflow-e2e",
        annotations=KWOK_COMPLETE_DELAY,
        deferrable=True,
        execution_timeout=timedelta(seconds=150),
    )

    @task
    def report(result: dict) -> dict:
        """Downstream consumer of the operator's XCom result."""
        return {k: result.get(k) for k in ("state", "name", "namespace", "uid", "reason", "runtime")}

    report(train.output)

with DAG("tf_e2e_cluster_fail", schedule=None, start_date=START):
    TrainJobOperator(
        task_id="train",
        runtime="torch-no-retry",  # created in the namespace by the test: backoffLimit 0
        runtime_kind="TrainingRuntime",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=1,
        labels={KWOK_FAIL_LABEL: "true"},
        annotations={KWOK_EXIT_CODE: "3", **KWOK_FAIL_DELAY},
        deferrable=True,
        execution_timeout=timedelta(seconds=150),
        retries=0,
    )

# The retry scenarios (tests/e2e/test_retry_scenarios.py): the whole request comes from the run's conf.
with DAG(
    "tf_e2e_scenario",
    schedule=None,
    start_date=START,
    params={"request": {}},
    render_template_as_native_obj=True,
):
    TrainJobOperator(
        task_id="train",
        request="{{ params.request }}",
        deferrable=False,
        retries=0,
        execution_timeout=timedelta(seconds=600),
    )
