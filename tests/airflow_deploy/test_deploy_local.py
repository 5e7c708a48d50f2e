"""TrainJobOperator in a real deployment on the local engine: DAG runs triggered over REST, waits deferred
to the real triggerer process, and the triggerer and a worker killed mid-wait.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from airflow_deployment import DEFER, Deployment, assert_complete_once, wait_running_job
from airflow_rest import Airflow, wait_for
from airflow_stack import start_component, stop_component, tagged

pytestmark = pytest.mark.e2e

WORKER = "tf_deploy_worker"


def test_deferral_through_the_real_triggerer(deployment: Deployment, api: Airflow, run_id: str) -> None:
    api.trigger(DEFER, run_id, {"steps": 15, "step_seconds": 1.0})
    deferred = api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})
    assert deferred["state"] == "deferred", deferred
    result = assert_complete_once(api, deployment, DEFER, run_id, tries=1)
    assert result["metrics"] == {"loss": 0.0704, "steps": 15.0}, result
    log = api.log(DEFER, run_id, "train", 1)
    # the trigger ran in the triggerer process and its lines are in the task log: state updates and
    # rank 0's training output (stream_logs=True); then the task resumed on a worker
    assert f"TrainJob {result['namespace']}/{result['name']}: Running" in log, log[-4000:]
    assert "[node-0] step 15/15 loss 0.0704" in log, log[-4000:]
    assert "Pausing task as DEFERRED" in log and "Complete in" in log, log[-4000:]


def test_triggerer_killed_mid_wait_loses_nothing(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """SIGKILL the triggerer while it holds the trigger; the job completes while no triggerer runs; the
    restarted triggerer takes the trigger over and reports the completion; nothing is submitted twice."""
    api.trigger(DEFER, run_id, {"steps": 12, "step_seconds": 1.0})
    assert api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})["state"] == "deferred"
    job = wait_running_job(deployment, DEFER, run_id)
    wait_for(lambda: "step 2/12" in api.log(DEFER, run_id, "train", 1), 120, "the trigger to stream the log")
    old = deployment.state["pids"]["triggerer"]
    stop_component(deployment.root, "triggerer", sig=signal.SIGKILL, timeout=0)
    assert not deployment.pids("triggerer")
    done = wait_for(
        lambda: (r := deployment.local_backend().get(job.ref)).state.terminal and r, 180, "the job to end"
    )
    assert done.state.value == "Complete"
    assert api.ti(DEFER, run_id, "train")["state"] == "deferred"  # nobody reported it yet
    new = start_component(deployment.root, "triggerer")
    assert new != old
    assert_complete_once(api, deployment, DEFER, run_id, tries=1)


def _worker_processes(dep: Deployment, ti_id: str) -> list[int]:
    """The LocalExecutor worker (the task's supervisor) and the task process running one task instance."""
    found = []
    for pid in tagged(dep.root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if title in (f"airflow worker -- LocalExecutor: {ti_id}", f"airflow worker -- {ti_id}"):
            found.append(pid)
    return found


def test_worker_killed_then_retry_reattaches(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """SIGKILL the worker (supervisor and task process) while it waits; the scheduler's heartbeat check fails
    the try, and the retry reattaches to the still-running TrainJob instead of submitting another."""
    api.trigger(WORKER, run_id, {"steps": 60, "step_seconds": 1.0})
    ti = api.wait_ti_state(WORKER, run_id, "train", {"running", "success", "failed"})
    assert ti["state"] == "running", ti
    job = wait_running_job(deployment, WORKER, run_id)
    procs = wait_for(
        lambda: len(p := _worker_processes(deployment, ti["id"])) == 2 and p, 60, "the worker processes"
    )
    for pid in procs:
        os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    assert deployment.local_backend().get(job.ref).state.value == "Running"  # the job outlives its waiter
    second = wait_for(
        lambda: (t := api.ti(WORKER, run_id, "train"))["try_number"] >= 2 and t["state"] == "running" and t,
        240,
        "the retry to start",
    )
    detected_after = time.monotonic() - t_kill
    assert_complete_once(api, deployment, WORKER, run_id, tries=second["try_number"])
    log = api.log(WORKER, run_id, "train", second["try_number"])
    assert f"Reattaching to running TrainJob {job.namespace}/{job.name}" in log, log[-4000:]
    print(f"worker kill detected and retried after {detected_after:.0f}s")


def test_marking_a_deferred_task_failed_deletes_its_trainjob(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """A user marks the deferred task failed in the UI/REST: the triggerer cancels the trigger and the
    TrainJob is deleted (on_kill_action="delete"), as a killed running task deletes its job."""
    api.trigger(DEFER, run_id, {"steps": 120, "step_seconds": 1.0})
    assert api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})["state"] == "deferred"
    job = wait_running_job(deployment, DEFER, run_id)
    # the user acts once the trigger runs (before that, no trigger code runs that could delete the job)
    running = f"TrainJob {job.namespace}/{job.name}: Running"
    wait_for(lambda: running in api.log(DEFER, run_id, "train", 1), 120, "the trigger to start")
    api.set_ti_state(DEFER, run_id, "train", "failed")
    from trainflow.core.errors import TrainJobNotFound

    def deleted() -> bool:
        try:
            return deployment.local_backend().get(job.ref).state.terminal
        except TrainJobNotFound:
            return True

    wait_for(deleted, 120, f"TrainJob {job.name} to be deleted after the task was marked failed")
    assert api.ti(DEFER, run_id, "train")["state"] == "failed"
