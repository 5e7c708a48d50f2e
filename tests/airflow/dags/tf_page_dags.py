"""Two teams' DAGs for the TrainJob page's ownership tests (tests/airflow/test_airflow_job_view.py): team A's task
in its own namespace and a mapped task whose connection is a template; team B's job prints a secret, on the
default connection and on a connection of its own (``tf_team_b``, another local engine home)."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from trainflow.airflow import TrainJobOperator

START = datetime(2026, 1, 1)
RUNTIME = "jax-distributed"  # function trainers run as plain `python3 -c` here: fast to start


def say(text: str = "") -> None:
    """Print one line (rank 0's log holds it) and report once."""
    from trainflow.core.reporting import report

    print(text, flush=True)
    report(metrics={"said": 1.0}, progress=100)


with DAG("tf_page_a", schedule=None, start_date=START, params={"conn": "kubeflow_trainer_default"}):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=say,
        function_kwargs={"text": "own-line-of-team-a"},
        namespace="team-a",
        deferrable=False,
    )
    TrainJobOperator.partial(
        task_id="mapped", runtime=RUNTIME, function=say, conn_id="{{ params.conn }}", deferrable=False
    ).expand(function_kwargs=[{"text": "mapped-line-0"}, {"text": "mapped-line-1"}])

with DAG("tf_page_b", schedule=None, start_date=START):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=say,
        function_kwargs={"text": "TOPSECRET-of-team-b"},
        namespace="team-b",
        deferrable=False,
    )
    TrainJobOperator(
        task_id="elsewhere",
        runtime=RUNTIME,
        function=say,
        function_kwargs={"text": "TOPSECRET-of-team-b-elsewhere"},
        namespace="team-b",
        conn_id="tf_team_b",
        deferrable=False,
    )
