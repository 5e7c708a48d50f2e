"""Small DAGs for the provider's Airflow tests; they run on the local engine with a plain-Python runtime."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG, task

from trainflow.airflow import TrainJobOperator, TrainJobSensor

START = datetime(2026, 1, 1)
RUNTIME = "jax-distributed"  # function trainers run as plain `python3 -c` here: fast to start
MODELS = os.path.join(os.environ.get("TRAINFLOW_HOME", "/tmp"), "models")


def sleeper(seconds: float = 1.0, marker: str = "", fail_first: bool = False, gate: str = "") -> dict:
    """Sleep, then report and return what it did; with fail_first, the first attempt (no marker file yet)
    exits with 4; with a gate, sleep only until that file exists (at most ``seconds``)."""
    import os
    import time

    from trainflow.core.reporting import report

    if fail_first and not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write("failed once")
        print("failing on purpose", flush=True)
        raise SystemExit(4)
    print(f"sleeping {seconds}s", flush=True)
    end = time.time() + float(seconds)
    while time.time() < end and not (gate and os.path.exists(gate)):
        time.sleep(min(0.2, max(0.0, end - time.time())))
    report(metrics={"slept": float(seconds)}, progress=100)
    return {"slept": float(seconds)}


with DAG(
    "tf_test_reattach",
    schedule=None,
    start_date=START,
    params={"seconds": 20, "gate": ""},
    render_template_as_native_obj=True,
):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=sleeper,
        function_kwargs={"seconds": "{{ params.seconds }}", "gate": "{{ params.gate }}"},
        output_uri=f"file://{MODELS}/{{{{ dag.dag_id }}}}/{{{{ ds_nodash }}}}",
        deferrable=False,
    )

with DAG("tf_test_retry", schedule=None, start_date=START, params={"marker": "/nonexistent"}):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=sleeper,
        function_kwargs={"seconds": 0.1, "marker": "{{ params.marker }}", "fail_first": True},
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

with DAG("tf_test_timeout", schedule=None, start_date=START):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=sleeper,
        function_kwargs={"seconds": 3600},  # an hour: only the deadline ends it within the test's run bound
        execution_timeout=timedelta(seconds=10),
        deferrable=True,  # the deadline must hold while the trigger waits (the default waits on the worker)
    )

with DAG("tf_test_decorator", schedule=None, start_date=START):

    @task.trainjob(runtime=RUNTIME, num_nodes=1)
    def measure(text: str, repeat: int = 1) -> float:
        from trainflow.core.reporting import report

        print(f"measuring {text!r}", flush=True)
        report(metrics={"length": len(text) * repeat})
        return float(len(text) * repeat)

    @task
    def check(length: float, ti=None) -> float:
        result = ti.xcom_pull(task_ids="measure", key="trainjob_result")
        assert result["state"] == "Complete" and result["metrics"]["length"] == length, result
        return length

    check(measure(text="{{ ds }}", repeat=2))

with DAG("tf_test_sensor", schedule=None, start_date=START, params={"job_name": "x", "failed_job": "y"}):
    TrainJobSensor(
        task_id="wait_reschedule",
        job_name="{{ params.job_name }}",
        mode="reschedule",
        poke_interval=1,
        timeout=300,
    )
    TrainJobSensor(task_id="wait_deferred", job_name="{{ params.job_name }}", poke_interval=1, timeout=300)
    TrainJobSensor(
        task_id="wait_failed_soft",
        job_name="{{ params.failed_job }}",
        soft_fail=True,
        deferrable=True,
        poke_interval=1,
        timeout=300,
    )
    TrainJobSensor(
        task_id="wait_failed_poke",
        job_name="{{ params.failed_job }}",
        soft_fail=True,
        mode="poke",
        deferrable=False,
        poke_interval=1,
        timeout=300,
    )
