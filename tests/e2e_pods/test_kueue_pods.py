"""Issue 23 on real pods: Kueue (v0.17.0, on the pods testbed with ``up.sh --pods --kueue``) preempts a running
low-priority torch TrainJob for a high-priority one. The low job's pods really stop (their containers leave the
node), its wait keeps going through the suspension, and after re-admission it runs again, in new pods, to
Complete with one preemption counted; Kueue's own eviction count agrees."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import pod_logs, poll
from kueue_env import evictions, team_queue, workloads
from trainflow.core import JobState, TrainJobRequest, TrainJobResult
from trainflow.core.lifecycle import launch

pytestmark = pytest.mark.e2e

# Exits at once on SIGTERM (PID 1 ignores it by default), so a preempted pod goes without its grace period.
TRAIN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
    "for i in range({steps}):\n"
    "    print(f'{tag} step {{i}}', flush=True)\n"
    "    time.sleep(1)\n"
)


@pytest.fixture
def queue(testbed: Any, namespace: str) -> Iterator[str]:
    """One CPU of quota for this namespace: a 600m job fits, two do not."""
    with team_queue(testbed.api_client, namespace, cpu=1) as name:
        yield name


def request(name: str, steps: int, priority: str, queue: str) -> TrainJobRequest:
    return TrainJobRequest(
        name=name,
        runtime="torch-distributed",
        command=["python", "-c", TRAIN.format(steps=steps, tag=name)],
        num_nodes=1,
        resources={"cpu": "600m"},
        queue=queue,
        priority_class=priority,
    )


def pods_of(k8s: Any, ns: str, job: str) -> dict[str, str]:
    """uid -> phase of the job's pods that still exist."""
    pods = k8s.core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}").items
    return {p.metadata.uid: p.status.phase for p in pods}


def test_a_preempted_torch_job_stops_its_pods_and_runs_again(
    backend: Any, k8s: Any, namespace: str, queue: str, testbed: Any
) -> None:
    launch(backend, request("low", 45, "trainflow-low", queue))
    updates: list[TrainJobResult] = []
    results: list[TrainJobResult] = []
    waiter = threading.Thread(
        target=lambda: results.append(backend.wait("low", timeout=600, on_update=updates.append)), daemon=True
    )
    waiter.start()
    first = poll(lambda: {u for u, ph in pods_of(k8s, namespace, "low").items() if ph == "Running"} or None,
                 240, "the low job's pod Running")  # fmt: skip
    poll(lambda: "low step 2" in "".join(pod_logs(k8s, namespace, "jobset.sigs.k8s.io/jobset-name=low").values()),
         120, "the low job training")  # fmt: skip

    launch(backend, request("urgent", 10, "trainflow-high", queue))
    # Kueue suspends the low TrainJob; the Trainer suspends its JobSet; its pods go
    t0 = time.monotonic()
    poll(lambda: not (set(pods_of(k8s, namespace, "low")) & first), 120, "the preempted pod gone")
    gone = time.monotonic() - t0
    poll(lambda: any(u.state is JobState.QUEUED for u in updates), 60, "the wait to see the job queued")
    urgent = backend.wait("urgent", timeout=300)
    assert urgent.state is JobState.COMPLETE, urgent

    waiter.join(timeout=420)
    assert results, f"the low job's wait did not end: {updates[-3:]}"
    low = results[0]
    logs = pod_logs(k8s, namespace, "jobset.sigs.k8s.io/jobset-name=low")
    assert low.state is JobState.COMPLETE and low.preemptions == 1, (low, logs)
    states = [u.state for u in updates]
    assert JobState.QUEUED in states and states[-1] is JobState.COMPLETE, states
    # Kueue creates the job suspended (Queued), admits it (Running), preempts it (Queued again)
    first_run = states.index(JobState.RUNNING)
    assert JobState.QUEUED in states[first_run:], states
    queued = [u for u in updates if u.state is JobState.QUEUED]
    assert any("Preempted to accommodate" in (u.message or "") for u in queued), queued
    # it ran again in a new pod, from the start, to its last step
    again = set(pods_of(k8s, namespace, "low"))
    assert again and not (again & first), (again, first)
    assert any("low step 44" in text for text in logs.values()), logs
    by_job = {
        w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads(testbed.api_client, namespace)
    }
    assert {n: evictions(by_job[n]) for n in ("low", "urgent")} == {"low": 1, "urgent": 0}
    assert gone < 60, gone
