"""Wait for a TrainJob created outside Airflow (by a notebook, the trainflow CLI, or another team).

The job name is a DAG param, so the same DAG watches any job: ``airflow dags trigger
trainflow_external_sensor -c '{"job_name": "nightly-bert"}'``. Complete -> success, Failed -> failure
(or skipped with soft_fail). Deferrable when the deployment says so (``[operators] default_deferrable``) or with
``deferrable=True``; ``mode="reschedule"`` works as well.
"""

from __future__ import annotations

from datetime import datetime

try:  # Airflow 3 (common-compat's sdk module is missing where 3.0.6's constraints pin 1.7.3)
    from airflow.sdk import DAG, Param, task
except ImportError:  # Airflow 2
    from airflow.decorators import task
    from airflow.models.param import Param

    from airflow import DAG

from trainflow.airflow import TrainJobSensor

with DAG(
    dag_id="trainflow_external_sensor",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "job_name": Param("external-job", type="string"),
        "namespace": Param("default", type="string"),
    },
    tags=["trainflow", "example"],
    doc_md=__doc__,
) as dag:
    wait = TrainJobSensor(
        task_id="wait_for_trainjob",
        job_name="{{ params.job_name }}",
        namespace="{{ params.namespace }}",
        poke_interval=5,
        timeout=6 * 3600,
        soft_fail=False,
    )

    @task
    def use_result(result: dict) -> str:
        print(
            f"{result['name']} finished {result['state']}; metrics {result['metrics']}; output {result['output_uri']}"
        )
        return result["output_uri"] or ""

    use_result(wait.output)
