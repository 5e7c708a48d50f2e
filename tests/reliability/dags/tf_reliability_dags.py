"""DAGs for the reliability suite: sync-mode TrainJobOperator tasks on the local engine (plain-Python runtime)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from trainflow.airflow import TrainJobOperator

START = datetime(2026, 1, 1)
RUNTIME = "jax-distributed"  # function trainers run as plain `python3 -c` on the local engine: fast to start


def sleeper(seconds: float = 1.0, gate: str = "", hang: float = 600.0) -> None:
    """Sleep, then report how long. With ``gate``, train until that file exists instead (at most ``hang``
    seconds): a test opens it once its rerun has reattached, however slow the rerun is to start."""
    import os
    import time

    from trainflow.core.reporting import report

    print(f"sleeping {seconds}s" + (f" or until {gate} exists" if gate else ""), flush=True)
    start = time.monotonic()
    while gate and not os.path.exists(gate) and time.monotonic() - start < float(hang):
        time.sleep(0.2)
    if not gate:
        time.sleep(float(seconds))
    report(metrics={"slept": float(seconds)}, progress=100)


for _dag_id, _action in (("tf_rel_sync_delete", "delete"), ("tf_rel_sync_keep", "keep")):
    with DAG(
        _dag_id,
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
            deferrable=False,
            on_kill_action=_action,
        )


# Bad input fails the task at once, whatever its retries: a malformed connection (the test sets
# AIRFLOW_CONN_TF_REL_MALFORMED) and a request that names a runtime that does not exist.
with DAG("tf_rel_bad_input", schedule=None, start_date=START):
    for _task_id, _conn, _runtime in (
        ("bad_connection", "tf_rel_malformed", RUNTIME),
        ("bad_request", "kubeflow_trainer_default", "no-such-runtime"),
    ):
        TrainJobOperator(
            task_id=_task_id,
            conn_id=_conn,
            runtime=_runtime,
            command=["true"],
            deferrable=False,
            retries=3,
            retry_delay=timedelta(seconds=0),
        )
