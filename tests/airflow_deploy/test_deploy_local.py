"""TrainJobOperator in a real deployment on the local engine: DAG runs triggered over REST, waits deferred
to the real triggerer process, and the triggerer and a worker killed mid-wait.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow_deployment import DEFER, Deployment, assert_complete_once, jobs_of, wait_running_job
from airflow_rest import Airflow, wait_for
from airflow_stack import start_component, stop_component, tagged
from triggerer_restart import restart_while_streaming

from bounds import HANG

pytestmark = pytest.mark.e2e

WORKER = "tf_deploy_worker"


@pytest.fixture(scope="module")
def deferred_run(deployment: Deployment) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """One deferred run, shared: the deferral test reads it, the clear test clears it (no second 15 s job)."""
    api, run_id = deployment.api, f"deferred-{uuid.uuid4().hex[:6]}"
    api.trigger(DEFER, run_id, {"steps": 15, "step_seconds": 1.0})
    deferred = api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})
    return run_id, deferred, assert_complete_once(api, deployment, DEFER, run_id, tries=1)


def test_deferral_through_the_real_triggerer(
    api: Airflow, deferred_run: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    run_id, deferred, result = deferred_run
    assert deferred["state"] == "deferred", deferred
    assert result["metrics"] == {"loss": 0.0704, "steps": 15.0}, result
    log = api.log(DEFER, run_id, "train", 1)
    # the trigger ran in the triggerer process and its lines are in the task log: state updates and
    # rank 0's training output (stream_logs=True); then the task resumed on a worker
    # its state lines (Running, or only Complete when a loaded triggerer took the trigger up after the job ran)
    assert re.search(rf"TrainJob {result['namespace']}/{result['name']}: (Running|Complete)", log), log[
        -4000:
    ]
    assert "[node-0] step 15/15 loss 0.0704" in log, log[-4000:]
    assert "Pausing task as DEFERRED" in log and "Complete in" in log, log[-4000:]


def test_clear_reruns_the_training(
    deployment: Deployment, api: Airflow, deferred_run: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    """Clearing a finished task trains again: a new TrainJob (attempt 2), as a cleared KubernetesPodOperator
    starts a new pod; the first job's result is not replayed (a retry still reuses it)."""
    run_id, _, first = deferred_run
    cleared = api.clear(DEFER, run_id, ["train"])
    assert [t["task_id"] for t in cleared] == ["train"], cleared
    ti = wait_for(
        lambda: (
            (t := api.ti(DEFER, run_id, "train"))["try_number"] == 2
            and t["state"] in ("success", "failed")
            and t
        ),
        300,
        "the cleared task to run again",
    )
    log = api.log(DEFER, run_id, "train", 2)
    assert ti["state"] == "success", (ti, log[-4000:])
    jobs = sorted(jobs_of(deployment, DEFER, run_id), key=lambda j: j.attempt or 0)
    assert [j.attempt for j in jobs] == [1, 2], [(j.name, j.attempt) for j in jobs]
    second = api.xcom(DEFER, run_id, "train")
    assert second["name"] == jobs[1].name != first["name"], (first, second)
    assert "cleared after its TrainJob completed: training again" in log, log[-4000:]


def test_defaults_wait_on_the_worker_and_stream_the_log(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """No ``deferrable``, no ``stream_logs``: ``[operators] default_deferrable = False`` (Airflow's default) keeps
    the wait on the worker, as cncf.kubernetes operators do, and rank 0's output is in the task log while the job
    runs (streaming is on by default)."""
    assert deployment.state["env"]["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "False"
    api.trigger("tf_conv_defaults", run_id, {"steps": 12})
    seen: set[str] = set()

    def streamed_while_running() -> bool:
        state = api.ti("tf_conv_defaults", run_id, "train")["state"]
        seen.add(state)
        return state == "running" and "[node-0] step 3/12" in api.log("tf_conv_defaults", run_id, "train", 1)

    wait_for(streamed_while_running, HANG, "rank 0's lines in the task log while the task runs", interval=1.0)
    run = api.wait_run("tf_conv_defaults", run_id)
    seen.add(api.ti("tf_conv_defaults", run_id, "train")["state"])
    assert run["state"] == "success" and "deferred" not in seen, (run, seen)
    log = api.log("tf_conv_defaults", run_id, "train", 1)
    assert "[node-0] step 12/12" in log and "Pausing task as DEFERRED" not in log, log[-4000:]


def test_task_trainjob_returns_the_function_return_value(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """``@task.trainjob`` hands the function's (rank 0's) return value downstream, as ``@task.kubernetes`` does;
    the TrainJobResult is beside it (XCom ``trainjob_result``)."""
    api.trigger("tf_conv_decorator", run_id)
    run = api.wait_run("tf_conv_decorator", run_id)
    assert run["state"] == "success", api.log("tf_conv_decorator", run_id, "fit", 1)[-3000:]
    assert api.xcom("tf_conv_decorator", run_id, "check") == {"lr": 0.01, "accuracy": 0.93}
    result = api.xcom("tf_conv_decorator", run_id, "fit", key="trainjob_result")
    assert result["state"] == "Complete" and result["return_value"] == {"lr": 0.01, "accuracy": 0.93}, result


def test_output_is_an_asset_and_lineage_names_dataset_and_model(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """``output_uri`` (templated) becomes an asset event of the run, and with the OpenLineage provider (console
    transport) the task's COMPLETE event has the dataset as input and the model as output."""
    root = deployment.root / "assets" / run_id
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("x,y\n1,2\n")
    dataset, output = f"file://{root}/data", f"file://{root}/model"
    api.trigger("tf_conv_assets", run_id, {"dataset": dataset, "output": output})
    assert api.wait_run("tf_conv_assets", run_id)["state"] == "success"
    events = api.asset_events(run_id)
    assert [e["uri"] for e in events] == [output], events
    log = api.log("tf_conv_assets", run_id, "train", 1)
    complete = [
        ln for ln in log.splitlines() if '"eventType": "COMPLETE"' in ln or "eventType=COMPLETE" in ln
    ]
    assert complete, log[-4000:]
    assert str(root / "data") in complete[-1] and str(root / "model") in complete[-1], complete[-1][:2000]


def test_triggerer_killed_mid_wait_loses_nothing(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """SIGKILL the triggerer while it holds the trigger; the job completes while no triggerer runs; the
    restarted triggerer takes the trigger over and reports the completion; nothing is submitted twice."""
    api.trigger(DEFER, run_id, {"steps": 12, "step_seconds": 1.0})
    assert api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})["state"] == "deferred"
    job = wait_running_job(deployment, DEFER, run_id)
    wait_for(lambda: "step 2/12" in api.log(DEFER, run_id, "train", 1), HANG, "the trigger to stream the log")
    old = deployment.state["pids"]["triggerer"]
    stop_component(deployment.root, "triggerer", sig=signal.SIGKILL, timeout=0)
    assert not deployment.pids("triggerer")
    done = wait_for(
        lambda: (r := deployment.local_backend().get(job.ref)).state.terminal and r, HANG, "the job to end"
    )
    assert done.state.value == "Complete"
    assert api.ti(DEFER, run_id, "train")["state"] == "deferred"  # nobody reported it yet
    new = start_component(deployment.root, "triggerer")
    assert new != old
    assert_complete_once(api, deployment, DEFER, run_id, tries=1)


LOGS = "tf_deploy_logs"  # 20 deferred runs at once, their numbered lines streamed


def test_a_restarted_triggerer_continues_each_log_where_it_stopped(
    deployment: Deployment, api: Airflow, run_id: str, tmp_path: Path
) -> None:
    """20 deferred tasks stream their logs; the triggerer is stopped (SIGTERM to its process group) and started
    again, then killed (SIGKILL) and started again; the trainers run until the test releases them, after the
    last triggerer streams. Each task log holds every numbered line; a line repeats only if it was copied after
    the last saved position; where the stopped trigger may save on its way out (2.11, 3.3), every line up to
    the position saved before the kill is there exactly once, in order. Each new trigger says where it
    continued. The restarted triggerer's memory stays within 1.1x of the first one's."""
    release = tmp_path / "release"
    # the stopped trigger saves on its way out where the triggerer lets it finish on SIGTERM; 3.0.6's trigger
    # runner takes the SIGTERM sent to the triggerer's process group (as systemd sends it) and exits at once
    version = tuple(int(p) for p in importlib.metadata.version("apache-airflow").split(".")[:2])
    restart_while_streaming(
        deployment,
        api,
        LOGS,
        [f"{run_id}-log{i}" for i in range(20)],
        {"release": str(release), "step_seconds": 0.5},
        release.touch,
        graceful=not (3, 0) <= version < (3, 3),
    )


def _worker_processes(dep: Deployment, ti: dict[str, Any]) -> list[int]:
    """The LocalExecutor worker (the task's supervisor) and the task process running one task instance: on 3.x
    titled with the TI's id; on 2.x "airflow task supervisor: [... run_id ...]" and "airflow task runner: ...".
    """
    found = []
    for pid in tagged(dep.root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if "id" in ti:
            mine = title in (f"airflow worker -- LocalExecutor: {ti['id']}", f"airflow worker -- {ti['id']}")
        else:
            mine = (
                title.startswith(("airflow task supervisor:", "airflow task runner:"))
                and ti["dag_run_id"] in title
            )
        if mine:
            found.append(pid)
    return found


def durable_line(api: Airflow) -> bool:
    """This deployment's Airflow has the task state store (3.3+), where the operator records its TrainJob."""
    major, minor = (int(p) for p in importlib.metadata.version("apache-airflow").split(".")[:2])
    return api.major >= 3 and (major, minor) >= (3, 3)


def test_worker_killed_then_retry_reattaches(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """SIGKILL the worker (supervisor and task process) while it waits; the scheduler's heartbeat check fails
    the try, and the retry reattaches to the still-running TrainJob instead of submitting another (or, when the
    heartbeat check took longer than the job, returns that job's result: never a second TrainJob)."""
    # detection takes the 90 s heartbeat timeout and more under load; a job that ended first is reused
    api.trigger(WORKER, run_id, {"steps": 150, "step_seconds": 1.0})
    ti = api.wait_ti_state(WORKER, run_id, "train", {"running", "success", "failed"})
    assert ti["state"] == "running", ti
    job = wait_running_job(deployment, WORKER, run_id)
    procs = wait_for(
        lambda: len(p := _worker_processes(deployment, ti)) == 2 and p, HANG, "the worker processes"
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
    running_at_retry = deployment.local_backend().get(job.ref).state.value == "Running"
    assert_complete_once(api, deployment, WORKER, run_id, tries=second["try_number"])
    log = api.log(WORKER, run_id, "train", second["try_number"])
    reattached = f"Reattaching to running TrainJob {job.namespace}/{job.name}" in log
    reused = f"TrainJob {job.namespace}/{job.name} already completed: returning its result" in log
    # a retry that started while the job ran must reattach; one that may have started after it ended reuses it
    assert reattached if running_at_retry else (reattached or reused), (running_at_retry, log[-4000:])
    if durable_line(api):  # 3.3: the retry read the task state store first, and reattached through it
        stored = api.state_store(WORKER, run_id, "train", "trainflow_trainjob")
        want = {"namespace": job.namespace, "name": job.name, "uid": job.uid, "attempt": 1}
        assert stored == {k: v for k, v in want.items() if v is not None}, stored
        recorded = (
            f"Earlier try recorded TrainJob {job.namespace}/{job.name} (attempt 1) in the task state store"
        )
        assert recorded in log, log[-4000:]
        assert not running_at_retry or "(attempt 1, as an earlier try recorded it)" in log, log[-4000:]
    else:  # before 3.3 there is no store: the identity labels found it
        assert "task state store" not in log, log[-4000:]
    print(
        f"worker kill detected and retried after {detected_after:.0f}s; job running then: {running_at_retry}"
    )


def test_marking_a_deferred_task_failed_deletes_its_trainjob(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """A user marks the deferred task failed in the UI/REST: the triggerer cancels the trigger and the
    TrainJob is deleted (on_kill_action="delete"), as a killed running task deletes its job."""
    # a job far longer than the wait below: it must be deleted, never merely finished by then
    api.trigger(DEFER, run_id, {"steps": int(2 * HANG), "step_seconds": 1.0})
    assert api.wait_ti_state(DEFER, run_id, "train", {"deferred", "success", "failed"})["state"] == "deferred"
    job = wait_running_job(deployment, DEFER, run_id)
    # the user acts once the trigger runs (before that, no trigger code runs that could delete the job)
    running = f"TrainJob {job.namespace}/{job.name}: Running"
    wait_for(lambda: running in api.log(DEFER, run_id, "train", 1), HANG, "the trigger to start")
    api.set_ti_state(DEFER, run_id, "train", "failed")
    from trainflow.core.errors import TrainJobNotFound

    def deleted() -> bool:
        try:
            deployment.local_backend().get(job.ref)
        except TrainJobNotFound:
            return True
        return False

    wait_for(deleted, HANG, f"TrainJob {job.name} to be deleted after the task was marked failed")
    assert api.ti(DEFER, run_id, "train")["state"] == "failed"


def test_streaming_triggers_do_not_block_other_completions(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """More streaming TrainJobs in the triggerer than its event loop's default executor has threads
    (cpu_count + 4): a short job's log and completion still arrive, because log follows never hold that pool.
    The long runs are then marked failed (their TrainJobs deleted), so they cost nothing after the assertion."""
    long_runs = [f"{run_id}-long{i}" for i in range(min(32, (os.cpu_count() or 1) + 4) + 1)]
    for rid in long_runs:
        api.trigger(DEFER, rid, {"steps": 300, "step_seconds": 1.0})
    for rid in long_runs:
        assert (
            api.wait_ti_state(DEFER, rid, "train", {"deferred", "success", "failed"})["state"] == "deferred"
        )
    short = f"{run_id}-short"
    # over 10 s (docs/airflow.md, "A trigger that fires within seconds")
    api.trigger(DEFER, short, {"steps": 12, "step_seconds": 1.0})
    ti = wait_for(
        lambda: (t := api.ti(DEFER, short, "train"))["state"] in ("success", "failed") and t,
        180,
        "the short job's task to finish while the long ones stream",
    )
    log = api.log(DEFER, short, "train", 1)
    assert ti["state"] == "success", log[-3000:]
    assert "[node-0] step 1/12" in log and "[node-0] step 12/12" in log, log[-3000:]
    assert [api.ti(DEFER, rid, "train")["state"] for rid in long_runs] == ["deferred"] * len(long_runs)
    for rid in long_runs:
        api.set_ti_state(DEFER, rid, "train", "failed")
