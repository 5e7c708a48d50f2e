"""Step -> pod selection, log timestamps, and TRAINFLOW_REPORT parsing."""

from __future__ import annotations

import pytest

from trainflow.core.errors import InvalidRequest
from trainflow.core.kube.diagnostics import newest as newest_pod
from trainflow.core.kube.logs import container_state, parse_timestamp, step_target
from trainflow.core.kube.reportlog import last_report, parse_report_line
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
