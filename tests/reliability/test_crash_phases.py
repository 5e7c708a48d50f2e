"""Row 2a: SIGKILL of the Airflow task process at each phase of TrainJobOperator (sync mode, local engine),
then the same DagRun run again: one TrainJob (none for a kill before create), the rerun reattaches and returns
the result.

The task runs inside the ``dag.test()`` process. To stop at a phase deterministically, that subprocess (only)
runs ``airflow_phase_runner.py``, which wraps the local backend's public ``create`` / ``wait`` to write a
marker file at the phase (and hold there for the create phases); the test SIGKILLs the whole process group
once the marker appears. The window between the create returning and the XCom push is microseconds, too
small to hit from outside, hence the hold.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from airflow_local import dag_args as args
from airflow_local import (
    job_dirs,
    job_processes,
    kill_group,
    run,
    start,
    wait_for,
    xcom_keys,
)

from bounds import HANG
from trainflow.core import get_backend
from trainflow.core.naming import KEY_LABEL, key_label

pytestmark = pytest.mark.slow
DAG = "tf_rel_sync_delete"
OUT = Path(os.environ.get("TRAINFLOW_RELIABILITY_OUT", "/tmp/trainflow-reliability"))


def open_once_reattached(log: Path, gate: Path) -> None:
    """Open the trainer's gate once the rerun's log says it reattached (the job must still run then)."""
    deadline = time.monotonic() + HANG
    while not gate.exists() and time.monotonic() < deadline:
        if log.exists() and "Reattaching to running TrainJob" in log.read_text(errors="replace"):
            gate.touch()
            return
        time.sleep(0.2)


def key_jobs(backend, run_id: str) -> list:
    from trainflow.airflow.operators import idempotency_key

    return backend.list(labels={KEY_LABEL: key_label(idempotency_key(DAG, "train", run_id, -1))})


@pytest.mark.parametrize(
    ("phase", "run_after", "seconds"),
    [
        ("before_create", "2026-03-01T01:00:00", 3),
        # the trainer of a job the rerun must find running trains until the rerun said it reattached (a gate
        # file): a 90 s job had ended before a rerun at load 33 started, as a 45 s one had at load 13-16
        ("after_create", "2026-03-01T02:00:00", 90),
        ("waiting", "2026-03-01T03:00:00", 90),
    ],
)
def test_sigkill_at_phase_then_rerun_reattaches(phase: str, run_after: str, seconds: int, tmp_path: Path):
    home = tmp_path / "trainflow"
    home.mkdir()
    backend = get_backend("local", home=str(home))
    marker = tmp_path / "phase.marker"
    gate = tmp_path / "reattached.gate"
    conf = {"seconds": seconds, "gate": str(gate) if phase != "before_create" else ""}
    t0 = time.monotonic()
    proc = start(home, phase, marker, args(DAG, run_after, conf), tmp_path / "killed.log")
    try:
        wait_for(marker.exists, HANG, f"the task to reach {phase}")
        if phase == "waiting":  # mid-wait: the job's trainer is running
            wait_for(lambda: [j for j in backend.list() if j.state.value == "Running"], HANG, "a Running job")
    finally:
        kill_group(proc)  # SIGKILL: no on_kill, the worker just vanished
    killed_at = time.monotonic() - t0
    log = (tmp_path / "killed.log").read_text()
    after_kill = backend.list()
    recorded = xcom_keys(DAG, run_after)  # what the killed try left in the metadata DB
    xcom_name = json.loads(recorded["job_name"]) if "job_name" in recorded else None

    if phase == "before_create":
        assert "Submitted TrainJob" not in log
        assert after_kill == [] and job_dirs(home) == [], after_kill  # nothing created, nothing orphaned
        assert job_processes(home) == []
        assert xcom_name is None
    else:
        assert [j.state.terminal for j in after_kill] == [False], after_kill  # the job outlived the worker
        name = after_kill[0].name
        if phase == "after_create":
            assert marker.read_text() == f"after_create {name}"
            assert xcom_name is None, recorded  # the identity was never recorded
            assert "Submitted TrainJob" not in log
        else:
            assert xcom_name == name, recorded

    t1 = time.monotonic()
    rerun_log = tmp_path / "rerun.log"
    opener = threading.Thread(target=open_once_reattached, args=(rerun_log, gate), daemon=True)
    opener.start()
    try:
        out = run(home, args(DAG, run_after, conf), rerun_log)
    finally:
        gate.touch()  # however the rerun ended, no trainer waits on the gate
    rerun_s = time.monotonic() - t1
    assert out["state"] == "success", out["tasks"]
    assert out["run_id"] == f"manual__{run_after}+00:00"  # the same DagRun
    jobs = key_jobs(backend, out["run_id"])
    assert len(jobs) == 1, jobs  # exactly one TrainJob
    job = jobs[0]
    if phase == "before_create":
        assert "Submitted TrainJob" in out["log"]
    else:
        assert job.name == after_kill[0].name
        assert f"Reattaching to running TrainJob default/{job.name}" in out["log"]
        assert "Submitted TrainJob" not in out["log"]
    result = out["xcoms"]["train[-1].return_value"]
    assert result["name"] == job.name and result["state"] == "Complete"
    assert result["metrics"] == {"slept": float(seconds)}
    assert out["xcoms"]["train[-1].job_name"] == job.name
    assert job_processes(home) == []  # the finished job left nothing running
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"crash_phase_{phase}.json").write_text(
        json.dumps(
            {
                "phase": phase,
                "killed_after_s": round(killed_at, 1),
                "jobs_after_kill": len(after_kill),
                "xcom_job_name_after_kill": xcom_name,
                "rerun_s": round(rerun_s, 1),
                "jobs_after_rerun": len(jobs),
                "tries": out["tasks"],
            }
        )
    )
    print(
        json.dumps({"phase": phase, "killed_after_s": killed_at, "rerun_s": rerun_s, "tasks": out["tasks"]})
    )
