"""TrainJobOperator, @task.trainjob and TrainJobSensor under real Airflow (dag.test) on the real local engine.

Each run is a subprocess with its own process group, so a test can SIGKILL the "worker" mid-wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bounds import HANG

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).resolve().parent / "dag_runner.py"
LOGICAL = "2026-02-01T00:00:00"


def dag_cmd(dag_id: str, run_after: str, conf: dict | None = None) -> list[str]:
    cmd = [sys.executable, str(RUNNER), dag_id, LOGICAL, run_after]
    return cmd + ([json.dumps(conf)] if conf else [])


def summary(output: str) -> dict:
    last = [ln for ln in output.splitlines() if ln.startswith('{"run_id"')]
    assert last, output[-6000:]
    return json.loads(last[-1])


def run_dag(
    af, home: Path, dag_id: str, tmp_path: Path, conf: dict | None = None, run_after: str = LOGICAL
) -> dict:
    log = tmp_path / f"{dag_id}-{time.monotonic_ns()}.log"
    result = af.run(dag_cmd(dag_id, run_after, conf), af.env(home, af.test_dags), HANG, log)
    assert result.returncode == 0, result.stdout[-6000:]
    return {**summary(result.stdout), "log": result.stdout}


def key_jobs(backend, dag_id: str, run_id: str, task_id: str = "train") -> list:
    from trainflow.airflow.operators import idempotency_key
    from trainflow.core.naming import KEY_LABEL, key_label

    return backend.list(labels={KEY_LABEL: key_label(idempotency_key(dag_id, task_id, run_id, -1))})


def wait_for(predicate, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def start_and_kill_when_running(
    af, home: Path, backend, tmp_path: Path, seconds: float, run_after: str, gate: str = ""
):
    """Start the DAG, SIGKILL the whole task process tree once its TrainJob runs; return the job."""
    log = tmp_path / "killed.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            dag_cmd("tf_test_reattach", run_after, {"seconds": seconds, "gate": gate}),
            env=af.env(home, af.test_dags),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        job = wait_for(
            lambda: next((j for j in backend.list() if j.state.value == "Running"), None),
            HANG,
            "a running TrainJob",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no on_kill: the worker just vanished
        proc.wait()
    assert "Submitted TrainJob" in log.read_text()
    return job


def test_killed_worker_rerun_reattaches_to_the_running_job(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    run_after = "2026-02-01T01:00:00"
    gate = tmp_path / "gate"  # the job runs until the rerun has reattached (however slow Airflow starts)
    conf = {"seconds": HANG, "gate": str(gate)}
    job = start_and_kill_when_running(af, trainflow_home, local_backend, tmp_path, HANG, run_after, str(gate))
    assert not local_backend.get(job.ref).state.terminal  # the TrainJob outlived the killed worker

    def open_gate_once_reattached() -> None:
        wait_for(
            lambda: any("Reattaching" in p.read_text() for p in tmp_path.glob("tf_test_reattach-*.log")),
            HANG,
            "the rerun to reattach",
        )
        gate.touch()

    opener = threading.Thread(target=open_gate_once_reattached, daemon=True)
    opener.start()
    out = run_dag(af, trainflow_home, "tf_test_reattach", tmp_path, conf, run_after=run_after)
    gate.touch()
    assert out["state"] == "success", out["tasks"]
    assert f"Reattaching to running TrainJob default/{job.name}" in out["log"], [
        ln for ln in out["log"].splitlines() if "TrainJob default/" in ln
    ]
    jobs = key_jobs(local_backend, "tf_test_reattach", out["run_id"])
    assert [j.name for j in jobs] == [job.name]  # one TrainJob, not two
    result = out["xcoms"]["train[-1].return_value"]
    assert result["name"] == job.name and result["state"] == "Complete"
    assert result["metrics"] == {"slept": HANG} and result["return_value"] == {"slept": HANG}, result
    assert out["xcoms"]["train[-1].job_name"] == job.name
    assert out["xcoms"]["train[-1].job_namespace"] == "default"


def test_rerun_after_completion_returns_result_without_resubmitting(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    run_after = "2026-02-01T02:00:00"
    job = start_and_kill_when_running(af, trainflow_home, local_backend, tmp_path, 3, run_after)
    wait_for(lambda: local_backend.get(job.ref).succeeded, HANG, "the orphaned TrainJob to complete")

    out = run_dag(af, trainflow_home, "tf_test_reattach", tmp_path, {"seconds": 3}, run_after=run_after)
    assert out["state"] == "success", out["tasks"]
    assert "already completed: returning its result without resubmitting" in out["log"]
    assert "Submitted TrainJob" not in out["log"]
    assert [j.name for j in key_jobs(local_backend, "tf_test_reattach", out["run_id"])] == [job.name]
    # the reused result carries what downstream reads: metrics, the function's return value, the output
    result = out["xcoms"]["train[-1].return_value"]
    assert result["metrics"] == {"slept": 3.0} and result["return_value"] == {"slept": 3.0}, result
    assert result["output_uri"] == f"file://{trainflow_home}/models/tf_test_reattach/20260201", result


def test_failed_attempt_is_retried_as_a_new_trainjob(af, airflow_db, trainflow_home, local_backend, tmp_path):
    out = run_dag(af, trainflow_home, "tf_test_retry", tmp_path, {"marker": str(tmp_path / "marker")})
    assert out["state"] == "success", out["tasks"]
    jobs = sorted(key_jobs(local_backend, "tf_test_retry", out["run_id"]), key=lambda j: j.attempt or 0)
    assert [(j.attempt, j.state.value) for j in jobs] == [(1, "Failed"), (2, "Complete")]
    first, second = jobs
    assert second.name.endswith("-2") and second.name != first.name
    assert out["xcoms"]["train[-1].return_value"]["name"] == second.name
    assert "exit" in out["log"] and "reason=" in out["log"]  # try 1 failed with the job's reason


def test_execution_timeout_holds_while_deferred_and_deletes_the_job(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    started = time.time()
    log = tmp_path / "timeout.log"
    result = af.run(dag_cmd("tf_test_timeout", LOGICAL), af.env(trainflow_home, af.test_dags), HANG, log)
    assert result.returncode == 0, result.stdout[-6000:]
    out = summary(result.stdout)
    assert out["state"] == "failed"
    assert out["tasks"]["train[-1]"]["state"] == "failed"
    assert "Pausing task as DEFERRED" in result.stdout
    assert "execution_timeout reached: deleted TrainJob" in result.stdout
    assert key_jobs(local_backend, "tf_test_timeout", out["run_id"]) == []
    assert time.time() - started < HANG  # the hour-long job did not run to the end


def test_task_trainjob_decorator_runs_the_function_with_templated_kwargs(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    out = run_dag(af, trainflow_home, "tf_test_decorator", tmp_path)
    assert out["state"] == "success", out["tasks"]
    # the function's return value is the task's; the TrainJobResult is beside it
    assert out["xcoms"]["measure[-1].return_value"] == 20.0  # "{{ ds }}" rendered to 10 characters, twice
    result = out["xcoms"]["measure[-1].trainjob_result"]
    assert result["metrics"] == {"length": 20.0} and result["return_value"] == 20.0
    assert out["xcoms"]["check[-1].return_value"] == 20.0
    assert local_backend.logs(result["name"]) is not None
    assert any("measuring '2026-02-01'" in line for line in local_backend.logs(result["name"]))


def test_sensor_waits_for_external_jobs_in_every_mode(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    from trainflow.core import TrainJobRequest

    sys.path.insert(0, str(af.test_dags))
    try:
        from tf_test_dags import sleeper as sleeper_source
    finally:
        sys.path.remove(str(af.test_dags))
    good = local_backend.submit(
        TrainJobRequest(
            runtime="jax-distributed",
            name="external-good",
            function=sleeper_source,
            function_kwargs={"seconds": 8},
        )
    )
    bad = local_backend.submit(
        TrainJobRequest(
            runtime="jax-distributed",
            name="external-bad",
            function=sleeper_source,
            function_kwargs={"fail_first": True, "marker": str(tmp_path / "m")},
        )
    )
    out = run_dag(
        af, trainflow_home, "tf_test_sensor", tmp_path, {"job_name": good.name, "failed_job": bad.name}
    )
    tasks = out["tasks"]
    assert tasks["wait_reschedule[-1]"]["state"] == "success", tasks
    assert tasks["wait_deferred[-1]"]["state"] == "success", tasks
    assert tasks["wait_failed_soft[-1]"]["state"] == "skipped", tasks
    assert tasks["wait_failed_poke[-1]"]["state"] == "skipped", tasks
    assert out["xcoms"]["wait_deferred[-1].return_value"]["metrics"] == {"slept": 8.0}
    assert out["xcoms"]["wait_reschedule[-1].return_value"]["state"] == "Complete"
    assert local_backend.get(good).succeeded  # a sensor never deletes the job it watches


def test_sigterm_to_a_running_task_deletes_its_trainjob(
    af, airflow_db, trainflow_home, local_backend, tmp_path
):
    """A task killed on the worker (SIGTERM -> on_kill, as for mark-failed) takes its TrainJob with it."""
    log = tmp_path / "sigterm.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            dag_cmd("tf_test_reattach", "2026-02-01T03:00:00", {"seconds": 120}),
            env=af.env(trainflow_home, af.test_dags),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        job = wait_for(
            lambda: next((j for j in local_backend.list() if j.state.value == "Running"), None),
            HANG,
            "a running TrainJob",
        )
        os.kill(proc.pid, signal.SIGTERM)  # dag.test runs the task in this process
        wait_for(lambda: not local_backend.list(), HANG, "the TrainJob to be deleted")
        # on_kill logs after its delete returns: wait for that line, not only for the deletion it reports
        line = f"Task killed: deleted TrainJob default/{job.name}: True"
        wait_for(lambda: line in log.read_text() or proc.poll() is not None, HANG, "on_kill's log line")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert line in log.read_text()
