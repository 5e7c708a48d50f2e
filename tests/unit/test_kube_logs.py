"""Step -> pod selection, log timestamps, and TRAINFLOW_REPORT parsing."""

from __future__ import annotations

import pytest

from trainflow.core.errors import InvalidRequest
from trainflow.core.kube.diagnostics import newest as newest_pod
from trainflow.core.kube.logs import container_state, parse_timestamp, step_target, will_restart
from trainflow.core.report_lines import last_report
from trainflow.core.reporting import parse_report_line
from trainflow.core.runtimes import find_runtime, local_catalog


def runtime(name: str):
    return find_runtime(local_catalog(), name)


def test_torch_rank_and_initializer_steps():
    rt = runtime("torch-distributed")
    t = step_target("job", "node-0", rt)
    assert t.selector == (
        "jobset.sigs.k8s.io/jobset-name=job,jobset.sigs.k8s.io/replicatedjob-name=node,"
        "batch.kubernetes.io/job-completion-index=0"
    )
    assert t.container == "node"
    assert step_target("job", "node-3", rt).selector.endswith("job-completion-index=3")
    init = step_target("job", "dataset-initializer", rt)
    assert init.container == "dataset-initializer"
    assert init.selector.endswith("replicatedjob-name=dataset-initializer")
    with pytest.raises(InvalidRequest, match="step"):
        step_target("job", "worker-1", rt)


def test_mpi_rank0_is_the_launcher():
    rt = runtime("deepspeed-distributed")
    assert "replicatedjob-name=launcher," in step_target("job", "node-0", rt).selector
    assert step_target("job", "node-1", rt).selector.endswith(
        "replicatedjob-name=node,batch.kubernetes.io/job-completion-index=0"
    )


def test_newest_pod_and_container_state():
    old = {"metadata": {"name": "a", "creationTimestamp": "2026-11-29T10:00:00Z"}, "status": {}}
    new = {
        "metadata": {"name": "b", "creationTimestamp": "2026-11-29T10:05:00Z"},
        "status": {"containerStatuses": [{"name": "node", "state": {"running": {}}}]},
    }
    assert newest_pod([old, new])["metadata"]["name"] == "b"
    assert newest_pod([]) is None
    assert container_state(new, "node") == "running"
    assert container_state(old, "node") == ""
    assert container_state({"status": {"phase": "Succeeded"}}, "node") == "terminated"


def test_parse_timestamp_nanoseconds():
    ts, text = parse_timestamp("2026-11-29T10:00:00.123456789Z hello world")
    assert text == "hello world"
    ts2, _ = parse_timestamp("2026-11-29T10:00:00.1234568Z x")
    assert ts2 - ts == 11  # nanosecond ordering, not string ordering
    assert parse_timestamp("no timestamp") == (None, "no timestamp")


def test_last_report_line_wins_per_metric():
    lines = [
        "epoch 1",
        'TRAINFLOW_REPORT {"metrics": {"loss": 0.9, "acc": "0.5"}, "progress": 10}',
        "TRAINFLOW_REPORT {not json",
        'TRAINFLOW_REPORT {"metrics": {"loss": 0.1}, "progress": 100}',
        "done",
    ]
    metrics, progress = last_report(lines)
    assert metrics == {"loss": 0.1, "acc": 0.5}
    assert progress == 100
    assert parse_report_line('2026-11-29T10:00:00Z TRAINFLOW_REPORT {"metrics": {}}') == {"metrics": {}}
    assert last_report(["nothing"]) == ({}, None)


def _terminated(code: int, policy: str = "OnFailure", phase: str = "Running") -> dict:
    return {
        "spec": {"restartPolicy": policy},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": code}}}],
        },
    }


def test_will_restart_follows_the_restart_policy() -> None:
    assert will_restart(_terminated(2), "node")  # OnFailure after a failure: restarted in place
    assert not will_restart(_terminated(0), "node")  # OnFailure after success: done
    assert not will_restart(_terminated(2, policy="Never"), "node")
    assert not will_restart(_terminated(2, phase="Failed"), "node")
    assert will_restart(_terminated(0, policy="Always"), "node")


def test_a_restored_position_copies_only_what_came_after_it() -> None:
    """A log read again from a little before the saved position (sinceSeconds rounds up, with margin) gives each
    line once: older timestamps are skipped, and at the last one only lines not copied yet pass."""
    from trainflow.core.kube.logs import Resume

    log = [
        "2026-12-06T02:00:00.100000000Z step 1",
        "2026-12-06T02:00:00.200000000Z step 2",
        "2026-12-06T02:00:00.200000000Z step 2b",  # two lines at one timestamp: one copied before the stop
        "2026-12-06T02:00:00.200000000Z step 3",
        "2026-12-06T02:00:01.000000000Z step 4",
    ]
    first = Resume()
    copied = [first.fresh(line) for line in log[:3]]
    saved = first.position("pod-a")
    assert saved["pod"] == "pod-a" and len(saved["at"]) == 2, saved
    again = Resume()
    again.restore(saved, "pod-a")
    assert again.since_seconds() is not None  # the first read asks only for the recent part of the log
    copied += [again.fresh(line) for line in log]
    assert [c for c in copied if c is not None] == ["step 1", "step 2", "step 2b", "step 3", "step 4"]
    other = Resume()
    other.restore(saved, "pod-b")  # another pod (the step's pod was replaced): its log from the start
    assert other.since_seconds() is None and other.fresh(log[0]) == "step 1"
