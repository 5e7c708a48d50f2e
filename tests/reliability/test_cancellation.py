"""Row 3 gaps: an Airflow task cancelled in sync mode (SIGTERM to the task process -> ``on_kill``) on the
real local engine, with ``on_kill_action`` delete and keep; and ``trainflow cancel`` (the CLI, another
process) against the testbed's real API server: the TrainJob and its JobSet are gone, a second cancel is a
no-op.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from airflow_local import dag_args, job_dirs, job_processes, kill_group, start, wait_for

from bounds import HANG
from conftest import TRAINER_GROUP, TRAINER_VERSION, held_request, trainjobs
from trainflow.core import get_backend

OUT = Path(os.environ.get("TRAINFLOW_RELIABILITY_OUT", "/tmp/trainflow-reliability"))


def _record(name: str, data: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data))
    print(json.dumps({name: data}))


@pytest.mark.slow
@pytest.mark.parametrize("action", ["delete", "keep"])
def test_sigterm_to_a_sync_task_applies_on_kill_action(action: str, tmp_path: Path):
    home = tmp_path / "trainflow"
    home.mkdir()
    backend = get_backend("local", home=str(home))
    dag_id = f"tf_rel_sync_{action}"
    marker = tmp_path / "phase.marker"
    log = tmp_path / "task.log"
    proc = start(home, "waiting", marker, dag_args(dag_id, "2026-03-02T01:00:00", {"seconds": 3 * HANG}), log)
    try:
        wait_for(marker.exists, HANG, "the task to wait synchronously")
        job = wait_for(
            lambda: next((j for j in backend.list() if j.state.value == "Running"), None),
            HANG,
            "a Running job",
        )
        before = wait_for(lambda: job_processes(home), HANG, "the job's processes")
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # the task runs in the dag.test process: a worker's SIGTERM
        if action == "delete":  # on_kill deletes the job, so the sync wait ends and the task exits
            try:
                rc = proc.wait(timeout=HANG)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGUSR1)  # the runner's faulthandler dumps every thread's stack
                time.sleep(2.0)
                pytest.fail(
                    f"the task did not exit {HANG:.0f} s after SIGTERM; its log ends:\n{log.read_text()[-12000:]}"
                )
        else:
            # Airflow 3's task SDK only calls on_kill on SIGTERM; its supervisor then escalates to SIGKILL
            # after escalation_delay (5 s). dag.test has no supervisor, so do what it would do.
            time.sleep(5.0)
            kill_group(proc)
            rc = proc.returncode
        task_exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            kill_group(proc)
    text = log.read_text()
    if action == "delete":
        assert f"Task killed: deleted TrainJob default/{job.name}: True" in text, text[-4000:]
        assert backend.list() == [] and job_dirs(home) == []
        wait_for(lambda: not job_processes(home), HANG, "no process of the job left")
        leftover = job_processes(home)
        assert leftover == [] and not [p for p in before if Path(f"/proc/{p}").exists()], leftover
    else:
        assert "Task killed: deleted" not in text
        time.sleep(3.0)  # still training after its task is gone
        kept = backend.get(job.ref)
        assert kept.state.value == "Running", kept  # kept and still training
        alive = job_processes(home)
        assert alive, "the kept job's processes should still run"
        assert backend.cancel(job.ref) is True  # clean up, then prove nothing is left
        wait_for(lambda: not job_processes(home), HANG, "no process of the job left after cleanup")
    _record(
        f"cancel_sync_{action}",
        {"rc": rc, "task_exit_s": round(task_exit_s, 1), "job_pids_before": len(before)},
    )


@pytest.mark.e2e
def test_cli_cancel_deletes_trainjob_and_jobset_then_is_a_noop(testbed, k8s, kube_backend, namespace):
    ref = kube_backend.submit(held_request("reliability/cli-cancel", seconds=300))
    wait_for(
        lambda: k8s.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")[
            "items"
        ],
        HANG,
        "the Trainer to create the JobSet",
        interval=0.5,
    )
    wait_for(lambda: kube_backend.get(ref).state.value == "Running", HANG, "the job to run", interval=0.5)
    cmd = [
        str(Path(sys.executable).parent / "trainflow"),
        "--backend",
        "kubernetes",
        "--kubeconfig",
        str(testbed.kubeconfig),
        "--context",
        testbed.context,
        "-n",
        namespace,
        "cancel",
        ref.name,
    ]
    t0 = time.monotonic()
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG)
    first_s = time.monotonic() - t0
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"cancelled {ref.name}"

    seen: dict[str, float] = {}

    def gone() -> bool:
        left = {
            "trainjob": trainjobs(k8s, namespace),
            "jobset": k8s.custom.list_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets"
            )["items"],
            "pods": k8s.core.list_namespaced_pod(namespace).items,
        }
        for what, items in left.items():
            if not items:
                seen.setdefault(what, round(time.monotonic() - t0, 1))
        return len(seen) == 3

    # background deletion: the TrainJob at once, then the garbage collector takes the JobSet, Jobs and pods
    wait_for(gone, HANG, "TrainJob, JobSet and pods to be gone", interval=0.5)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"{ref.name} was already gone"
    assert "Traceback" not in first.stderr + second.stderr
    with pytest.raises(Exception) as err:
        k8s.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", ref.name
        )
    assert getattr(err.value, "status", None) == 404
    _record("cli_cancel", {"first_cancel_s": round(first_s, 1), "gone_after_s": seen})
