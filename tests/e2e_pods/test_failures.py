"""Issue 10 item 6: failures the real kubelet reports become a clear ``TrainJobFailed`` within a bounded time:
a non-zero exit (node, exit code, log tail), OOMKilled under a memory limit, an image that is not on the node
and cannot be pulled (a pull failure, not a hang), and resources no node has (unschedulable).

The trainers here are plain ``sh``/``python3`` commands in the runtime's image: no torch import, so each case
costs seconds of container time, not minutes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from conftest import TORCH_IMAGE, make_backend, record
from trainflow.core import JobState, TrainJobFailed, TrainJobRequest

pytestmark = pytest.mark.e2e

# Bounds: a failure must surface this fast (seconds from submit), on a loaded 2-core machine. Pods that cannot
# pull or be scheduled fail the wait after the backend's pod_stuck_timeout: 30 s here (default 120 s).
BOUND = {"exit": 180, "oom": 180, "image": 100, "unschedulable": 100}
STUCK_TIMEOUT = 30.0
KILLED_BY_TEARDOWN = (137, 143)  # ranks the failed JobSet's deletion stopped (SIGKILL, SIGTERM)


@pytest.fixture
def stuck_backend(testbed: Any, namespace: str) -> Any:
    return make_backend(testbed, namespace, pod_stuck_timeout=STUCK_TIMEOUT)


def fail_fast(
    backend: Any, request: TrainJobRequest, bound: float, waiting: str = "sync"
) -> tuple[TrainJobFailed, float]:
    t0 = time.monotonic()
    ref = backend.submit(request)
    with pytest.raises(TrainJobFailed) as info:
        if waiting == "async":  # the shared watches of triggerers (the pod watch tells of the crash)
            asyncio.run(backend.wait_async(ref, timeout=bound + 60))
        else:
            backend.wait(ref, timeout=bound + 60)
    elapsed = time.monotonic() - t0
    assert elapsed < bound, f"took {elapsed:.0f}s (bound {bound}s): {info.value}"
    return info.value, elapsed


@pytest.mark.parametrize("waiting", ["sync", "async"])
def test_non_zero_exit_names_the_node_exit_code_and_log_tail(
    backend: Any, backoff_runtime: str, waiting: str
) -> None:
    fail_on_node_1 = (
        'if [ "$PET_NODE_RANK" = 1 ]; then echo step 1 of training; echo "loss exploded at step 7" >&2; exit 3; fi; '
        "sleep 600"
    )
    request = TrainJobRequest(
        runtime=backoff_runtime,
        runtime_kind="TrainingRuntime",
        image=TORCH_IMAGE,
        command=["sh", "-c", fail_on_node_1],
        num_nodes=2,
    )
    err, elapsed = fail_fast(backend, request, BOUND["exit"], waiting)
    assert err.result.state == JobState.FAILED
    text = str(err)
    ranks = err.diagnostics.failed_ranks
    assert ranks and (ranks[0]["rank"], ranks[0]["exit_code"], ranks[0]["container"]) == ("1", 3, "node"), (
        text
    )
    assert ranks[0]["pod"].startswith(f"{err.result.name}-node-0-1-"), ranks
    assert all(r["exit_code"] in KILLED_BY_TEARDOWN for r in ranks[1:]), text
    assert "exit_code=3" in text and "rank=1" in text, text
    assert "loss exploded at step 7" in err.diagnostics.log_tail, text
    record(f"failure_exit_code_{waiting}", {"seconds": round(elapsed, 1)})


def test_a_crash_after_every_rank_was_ready_is_named_by_async_waits(
    backend: Any, no_retry_runtime: str
) -> None:
    """The Trainer's counts say every pod is ready; then rank 1 exits and its Job, JobSet and TrainJob fail at
    once and the pods are deleted. Only the pod watch tells the shared-watch waiter in time."""
    request = TrainJobRequest(
        runtime=no_retry_runtime,
        runtime_kind="TrainingRuntime",
        image=TORCH_IMAGE,
        command=[
            "sh",
            "-c",
            'sleep 15; if [ "$PET_NODE_RANK" = 1 ]; then echo "diverged at step 12" >&2; exit 5; fi; sleep 600',
        ],
        num_nodes=2,
    )
    ref = backend.submit(request)
    with pytest.raises(TrainJobFailed) as info:
        asyncio.run(backend.wait_async(ref, timeout=240))
    text = str(info.value)
    ranks = info.value.diagnostics.failed_ranks
    assert ranks and (ranks[0]["rank"], ranks[0]["exit_code"]) == ("1", 5), text  # the cause, named first
    assert all(r["exit_code"] in KILLED_BY_TEARDOWN for r in ranks[1:]), text
    # the pod watch hands the waiter the crashed pod, and its log tail is read before anything else
    assert "diverged at step 12" in info.value.diagnostics.log_tail, text
    record("failure_exit_code_after_ready_async", {"log_tail_read": True})


def test_oom_killed_under_a_memory_limit(backend: Any, backoff_runtime: str) -> None:
    request = TrainJobRequest(
        runtime=backoff_runtime,
        runtime_kind="TrainingRuntime",
        image=TORCH_IMAGE,
        command=["python3", "-c", "print('allocating', flush=True); b = bytearray(600 * 2**20)"],
        resources={"memory": "128Mi"},
    )
    err, elapsed = fail_fast(backend, request, BOUND["oom"])
    text = str(err)
    assert "OOMKilled" in text, text
    assert any(r["reason"] == "OOMKilled" and r["exit_code"] == 137 for r in err.diagnostics.failed_ranks), (
        text
    )
    record("failure_oom", {"seconds": round(elapsed, 1)})


def test_image_not_on_the_node_is_a_pull_failure_not_a_hang(stuck_backend: Any) -> None:
    request = TrainJobRequest(
        runtime="torch-distributed",
        image="registry.invalid/trainflow/not-built-here:1.0",
        command=["python3", "-c", "print('never runs')"],
    )
    err, elapsed = fail_fast(stuck_backend, request, BOUND["image"])
    text = str(err)
    assert "ErrImagePull" in text or "ImagePullBackOff" in text, text
    assert "registry.invalid/trainflow/not-built-here:1.0" in text, text
    record("failure_image", {"seconds": round(elapsed, 1)})


def test_resources_no_node_has_are_unschedulable(stuck_backend: Any) -> None:
    request = TrainJobRequest(
        runtime="torch-distributed",
        image=TORCH_IMAGE,
        command=["python3", "-c", "print('never runs')"],
        resources={"cpu": 64, "memory": "1Gi"},
    )
    err, elapsed = fail_fast(stuck_backend, request, BOUND["unschedulable"])
    text = str(err)
    assert "Unschedulable" in text and "Insufficient cpu" in text, text
    record("failure_unschedulable", {"seconds": round(elapsed, 1)})
