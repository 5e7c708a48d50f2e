"""TrainJobOperator in a real deployment against the kwok testbed (kubernetes backend, real Trainer and JobSet):
one deferred TrainJob through the cncf.kubernetes ``kubernetes_default`` connection users already have, and a
mapped sweep of 20 deferred TrainJobs (``kubeflow_trainer`` connection) held by the one triggerer.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow_deployment import Deployment, Testbed
from airflow_rest import Airflow, wait_for

pytestmark = pytest.mark.e2e

AIRFLOW_LABEL = "airflow.apache.org/"
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
# waits the one triggerer must hold together before the test lets the pods finish (AIRFLOW__CORE__PARALLELISM is 8)
HELD_AT_ONCE = 12
SETTLE = 20.0


def trainjobs_of(testbed: Testbed, namespace: str, run_id: str) -> list[dict[str, Any]]:
    from trainflow.core.naming import label_value

    wanted = label_value(run_id)
    return [
        j
        for j in testbed.trainjobs(namespace)
        if j["metadata"]["labels"].get(f"{AIRFLOW_LABEL}run-id") == wanted
    ]


def test_deferred_trainjob_on_the_cluster(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str
) -> None:
    """``conn_id="kubernetes_default"`` (conn type ``kubernetes``, extra ``kube_config_path``) reaches the
    cluster from the worker and from the triggerer."""
    assert "kube_config_path" in deployment.state["env"]["AIRFLOW_CONN_KUBERNETES_DEFAULT"]
    api.trigger("tf_deploy_kube", run_id, {"namespace": namespace, "delay": "15s"})
    ti = api.wait_ti_state("tf_deploy_kube", run_id, "train", {"deferred", "success", "failed"}, timeout=240)
    assert ti["state"] == "deferred", (ti, api.log("tf_deploy_kube", run_id, "train", 1)[-3000:])
    run = api.wait_run("tf_deploy_kube", run_id, timeout=300)
    log = api.log("tf_deploy_kube", run_id, "train", 1)
    assert run["state"] == "success", log[-4000:]
    jobs = trainjobs_of(testbed, namespace, run_id)
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    result = api.xcom("tf_deploy_kube", run_id, "train")
    assert result["state"] == "Complete" and result["name"] == jobs[0]["metadata"]["name"], result
    assert result["namespace"] == namespace and result["uid"] == jobs[0]["metadata"]["uid"], result
    conditions = {c["type"]: c["status"] for c in jobs[0]["status"]["conditions"]}
    assert conditions.get("Complete") == "True", jobs[0]["status"]


def test_mapped_sweep_of_20(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str
) -> None:
    """20 mapped tasks, each its own TrainJob (map index in its identity), all waiting in the triggerer.

    kwok holds every pod running until the test releases it, so how many waits the one triggerer holds at once
    depends on Airflow's concurrency limits, not on how fast a loaded machine starts tasks.
    """
    api.trigger("tf_deploy_sweep", run_id, {"namespace": namespace, "delay": "900s"})
    deferred_since: dict[int, float] = {}
    most_at_once = 0
    released: set[str] = set()

    def release_held_pods() -> None:
        """Let the pods of tasks deferred for SETTLE seconds finish (a task not yet seen keeps its pod held).

        A trigger that fires while the deferring worker is still exiting races Airflow's own bookkeeping: the
        scheduler takes the old workload's exit for the resumed task's and fails it (LocalExecutor, loaded)."""
        settled = {i for i, t in deferred_since.items() if time.monotonic() - t >= SETTLE}
        index_of = {
            j["metadata"]["name"]: int(j["metadata"]["labels"][f"{AIRFLOW_LABEL}map-index"])
            for j in trainjobs_of(testbed, namespace, run_id)
        }
        for pod in testbed.core.list_namespaced_pod(namespace).items:
            job = (pod.metadata.labels or {}).get("jobset.sigs.k8s.io/jobset-name")
            if pod.metadata.name not in released and index_of.get(job) in settled:
                patch = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "0s"}}}
                testbed.core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
                released.add(pod.metadata.name)

    def finished() -> dict[str, Any] | None:
        nonlocal most_at_once
        deferred = {
            t["map_index"] for t in api.task_instances("tf_deploy_sweep", run_id) if t["state"] == "deferred"
        }
        for i in deferred:
            deferred_since.setdefault(i, time.monotonic())
        most_at_once = max(most_at_once, len(deferred))
        if most_at_once >= HELD_AT_ONCE:  # the triggerer holds a batch of waits together: let them all finish
            release_held_pods()
        run = api.run("tf_deploy_sweep", run_id)
        return run if run["state"] in ("success", "failed") else None

    run = wait_for(
        finished, 600, f"the sweep to finish ({most_at_once} deferred at once so far)", interval=1.0
    )
    print(f"sweep: {most_at_once} of 20 tasks deferred at once")
    tis = api.task_instances("tf_deploy_sweep", run_id)
    states = sorted((t["map_index"], t["state"], t["try_number"]) for t in tis)
    assert run["state"] == "success", states
    assert states == [(i, "success", 1) for i in range(20)], states
    jobs = trainjobs_of(testbed, namespace, run_id)
    indexes = sorted(int(j["metadata"]["labels"][f"{AIRFLOW_LABEL}map-index"]) for j in jobs)
    assert indexes == list(range(20)), indexes
    args = set()
    for i in range(20):
        result = api.xcom("tf_deploy_sweep", run_id, "train", map_index=i)
        assert result["state"] == "Complete", result
        job = next(j for j in jobs if j["metadata"]["name"] == result["name"])
        assert job["metadata"]["labels"][f"{AIRFLOW_LABEL}map-index"] == str(i)
        args.add(tuple(job["spec"]["trainer"]["args"]))
    assert len(args) == 20, args
    # every wait went to the triggerer: no task waited in a worker
    assert set(deferred_since) == set(range(20)), sorted(deferred_since)
