"""Deferred TrainJobOperator tasks in the real deployment, through the real Kueue on the testbed (``--kueue``):
40 mapped tasks through a ClusterQueue that fits 4, a deferred task whose job is preempted and re-admitted,
and a task whose job never gets quota within its queue budget. The oracle is Kueue's Workload status.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from airflow_deployment import Deployment, Testbed
from airflow_rest import Airflow, wait_for
from test_deploy_kube import trainjobs_of

from bounds import HANG
from kueue_env import (
    HELD,
    NO_QUOTA,
    admission_watch,
    evictions,
    release_once_all_wait,
    team_queue,
    unexplained_waits,
    workloads,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def queue(testbed: Testbed, namespace: str) -> Iterator[str]:
    """A ClusterQueue of 4 CPUs for this namespace (lower priority preempted in it), LocalQueue ``team``."""
    with team_queue(testbed.api_client, namespace) as name:
        yield name


def test_forty_deferred_tasks_run_four_at_a_time(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str, queue: str
) -> None:
    """Kueue never holds quota for more than 4 of the 40 jobs; every task succeeds on its first try with its
    own TrainJob; every task whose job was held says why in its log (written by the trigger while deferred)."""
    dag = "tf_deploy_kueue_sweep"
    with (
        admission_watch(testbed.api_client, namespace) as seen,
        release_once_all_wait(testbed.api_client, namespace, 40),
    ):
        api.trigger(dag, run_id, {"namespace": namespace, "queue": queue, "delay": f"{HELD}s"})
        run = api.wait_run(dag, run_id, timeout=1500)
    states = sorted((t["map_index"], t["state"], t["try_number"]) for t in api.task_instances(dag, run_id))
    assert run["state"] == "success", states
    assert states == [(i, "success", 1) for i in range(40)], states
    assert not seen["errors"], seen["errors"]
    assert seen["max"] == 4, f"Kueue held quota for {seen['max']} Workloads at once; the queue fits 4"
    jobs = trainjobs_of(testbed, namespace, run_id)
    assert sorted(int(j["metadata"]["labels"]["airflow.apache.org/map-index"]) for j in jobs) == list(
        range(40)
    )
    assert len(workloads(testbed.api_client, namespace)) == 40
    logs = {i: api.log(dag, run_id, "train", 1, map_index=i) for i in range(40)}
    unexplained = {i: lines for i, text in logs.items() if (lines := unexplained_waits(text))}
    assert not unexplained, unexplained  # every queued wait gives Kueue's reason
    held = [i for i, text in logs.items() if NO_QUOTA in text]
    assert len(held) >= 30, f"only {len(held)} of 40 tasks saw their job held back by the queue"
    for i in range(40):
        result = api.xcom(dag, run_id, "train", map_index=i)
        assert result["state"] == "Complete" and result["queue"] == queue, result
        assert result["preemptions"] == 0 and result["queued_seconds"] is not None, result


def test_a_deferred_task_waits_through_preemption(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str, queue: str
) -> None:
    """A high-priority job preempts the task's low-priority one: the task stays deferred while Kueue suspends
    and re-admits its job, then succeeds; its result counts the one preemption Kueue counted."""
    from trainflow.core import TrainJobRequest
    from trainflow.core.kube.backend import KubernetesBackend
    from trainflow.core.lifecycle import launch
    from trainflow.core.result import JobState

    dag = "tf_deploy_kueue_low"
    api.trigger(dag, run_id, {"namespace": namespace, "queue": queue, "delay": "45s"})
    be = KubernetesBackend(kubeconfig=testbed.state["kubeconfig"], namespace=namespace)

    def low_running() -> Any:
        jobs = trainjobs_of(testbed, namespace, run_id)
        return jobs and be.get(jobs[0]["metadata"]["name"]).state is JobState.RUNNING and jobs[0]

    low = wait_for(low_running, 300, "the low-priority job to run")["metadata"]["name"]
    assert api.ti(dag, run_id, "train")["state"] == "deferred"
    urgent = TrainJobRequest(
        name="urgent", image="busybox", command=["true"], num_nodes=1, resources={"cpu": 4},
        queue=queue, priority_class="trainflow-high",
    )  # fmt: skip
    launch(be, urgent)
    states: set[str] = set()

    def preempted_and_back() -> bool:
        states.add(api.ti(dag, run_id, "train")["state"])
        wl = next(
            w
            for w in workloads(testbed.api_client, namespace)
            if w["metadata"]["ownerReferences"][0]["name"] == low
        )
        return evictions(wl) == 1 and be.get(low).state is JobState.RUNNING

    wait_for(preempted_and_back, 300, "the low job preempted and admitted again", interval=1.0)
    assert states == {"deferred"}, states  # the task never left the triggerer meanwhile
    run = api.wait_run(dag, run_id, timeout=600)
    log = api.log(dag, run_id, "train", 1)
    assert run["state"] == "success", f"{api.why(dag, run_id)}\n{log[-4000:]}"
    assert api.ti(dag, run_id, "train")["try_number"] == 1
    result = api.xcom(dag, run_id, "train")
    assert result["state"] == "Complete" and result["name"] == low and result["preemptions"] == 1, result
    status = "\n".join(line for line in log.splitlines() if f"TrainJob {namespace}/{low}:" in line)
    assert "Preempted to accommodate a workload" in status and "(preempted 1 time)" in status, status
    assert [j["metadata"]["name"] for j in trainjobs_of(testbed, namespace, run_id)] == [
        low
    ]  # never resubmitted


def test_the_queue_budget_fails_the_task_and_deletes_its_job(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str, queue: str
) -> None:
    """8 CPUs in a 4-CPU queue never get quota: the deferred task fails at max_queue_seconds=20 naming the
    queue, the budget and Kueue's reason, and on_kill_action (delete) removes the job and its Workload."""
    dag = "tf_deploy_kueue_budget"
    t0 = time.monotonic()
    api.trigger(dag, run_id, {"namespace": namespace, "queue": queue})
    run = api.wait_run(dag, run_id, timeout=300)
    log = api.log(dag, run_id, "train", 1)
    assert run["state"] == "failed", log[-4000:]
    assert time.monotonic() - t0 >= 20
    assert "not admitted by LocalQueue team within its queue budget, max_queue_seconds=20" in log, log[-4000:]
    assert "insufficient quota for cpu" in log and "(on_kill_action=delete): True" in log, log[-4000:]
    wait_for(lambda: not trainjobs_of(testbed, namespace, run_id), HANG, "the TrainJob deleted")
    wait_for(lambda: not workloads(testbed.api_client, namespace), HANG, "its Workload deleted")
