"""The Kubernetes backend against the real testbed (kube-apiserver + etcd + kwok + JobSet + Trainer v2.3.0).

This is the real proof of trainflow.core.kube: real HTTP to a real API server, the real Trainer controller
turning TrainJobs into JobSets, kwok running the pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from conftest import KWOK_COMPLETE_DELAY, KWOK_FAIL_LABEL, TRAINER_GROUP, TRAINER_VERSION, wait_until
from trainflow.core import TrainJobRequest
from trainflow.core.errors import (
    InvalidRequest,
    TrainJobConflict,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.kube.shared_watch import registry
from trainflow.core.naming import KEY_LABEL, MANAGED_BY_LABEL
from trainflow.core.result import JobState

pytestmark = pytest.mark.e2e


TIMEOUT = 120
KWOK_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"


@pytest.fixture
def backend(testbed, namespace):
    b = KubernetesBackend(kubeconfig=str(testbed.kubeconfig), context=testbed.context, namespace=namespace)
    yield b
    b.close()


def request(key: str, **kw) -> TrainJobRequest:
    base = dict(
        runtime="torch-distributed",
        idempotency_key=key,
        num_nodes=2,
        image="pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
        command=["torchrun", "--nnodes=2", "train.py"],
        output_uri="s3://bucket/models/run-1",
    )
    base.update(kw)
    return TrainJobRequest(**base)


def trainjobs(k8s, ns: str) -> list[dict]:
    return k8s.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs")["items"]


def test_runtimes_from_the_cluster(backend, namespace, k8s):
    names = {r.name for r in backend.runtimes() if r.kind == "ClusterTrainingRuntime"}
    assert {"torch-distributed", "deepspeed-distributed"} <= names
    rt = backend.get_runtime("torch-distributed")
    assert rt.framework == "torch" and rt.replicated_job_names == ["node"]
    assert backend.get_runtime("deepspeed-distributed").rank0_job_name == "launcher"
    with pytest.raises(InvalidRequest, match=r"no-such-runtime.*not found"):
        backend.get_runtime("no-such-runtime")


def test_submit_and_wait_complete(backend, namespace, k8s):
    updates = []
    # a dry run is the server's full validation (schema, CEL, webhooks) and creates nothing
    dry = backend.submit(request("e2e/complete"), dry_run=True)
    assert trainjobs(k8s, namespace) == [] and dry.uid is None
    t0 = time.time()
    ref = backend.submit(request("e2e/complete"))
    assert ref.name == dry.name
    result = backend.wait(ref, timeout=TIMEOUT, on_update=lambda r: updates.append(r.state))
    elapsed = time.time() - t0

    server = trainjobs(k8s, namespace)
    assert len(server) == 1
    obj = server[0]
    assert (result.name, result.namespace, result.uid) == (ref.name, namespace, obj["metadata"]["uid"])
    assert ref.uid == obj["metadata"]["uid"]
    assert obj["metadata"]["labels"][MANAGED_BY_LABEL] == "trainflow"
    assert KEY_LABEL in obj["metadata"]["labels"]
    assert result.state is JobState.COMPLETE and result.reason == "AllJobsCompleted"
    assert result.runtime == "torch-distributed"
    assert result.output_uri == "s3://bucket/models/run-1"
    assert result.created_at is not None and result.finished_at is not None
    assert result.created_at <= result.finished_at
    assert 0 <= result.duration_seconds <= elapsed + 2
    assert updates[-1] is JobState.COMPLETE and updates.count(JobState.COMPLETE) == 1
    stats = backend.last_wait_stats
    assert stats.lists == 1 and stats.watches <= 2, stats  # watch-based, not polling
    # the result serialises to plain JSON and the same read through get()
    assert backend.get(ref).to_dict() == result.to_dict()
    print(f"\nsubmit->Complete {elapsed:.1f}s, updates={[u.value for u in updates]}, {stats}")


def test_failed_pod_raises_with_reason_and_diagnostics(backend, namespace, no_retry_runtime):
    runtime = no_retry_runtime
    req = request(
        "e2e/fail",
        runtime=runtime,
        runtime_kind="TrainingRuntime",
        num_nodes=1,
        labels={KWOK_FAIL_LABEL: "true"},
        annotations={KWOK_EXIT_CODE: "3"},
    )
    ref = backend.submit(req)
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=TIMEOUT)
    err = info.value
    assert err.result.state is JobState.FAILED
    assert err.result.reason == "FailedJobs"
    assert "reason=FailedJobs" in str(err)
    ranks = err.diagnostics.failed_ranks
    assert (
        ranks and ranks[0]["exit_code"] == 3 and ranks[0]["container"] == "node" and ranks[0]["rank"] == "0"
    )
    assert "exit_code=3" in str(err)
    # raise_on_failure=False returns the failed result instead
    assert backend.wait(ref, timeout=10, raise_on_failure=False).state is JobState.FAILED


def test_deterministic_name_adopts_and_conflicts(backend, namespace, k8s):
    req = request("e2e/adopt")
    first = backend.submit(req)
    # concurrent retries of the same request (e.g. an Airflow retry racing a zombie): one TrainJob
    refs = []
    threads = [threading.Thread(target=lambda: refs.append(backend.submit(req))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {(r.name, r.uid) for r in refs} == {(first.name, first.uid)}
    assert [o["metadata"]["name"] for o in trainjobs(k8s, namespace)] == [first.name]
    # same name, different trainer: refused with the differing immutable field
    other = request("e2e/adopt", image="pytorch/pytorch:other")
    with pytest.raises(TrainJobConflict, match=r"spec\.trainer"):
        backend.submit(other)
    # same name, someone else's job (other identity label)
    with pytest.raises(TrainJobConflict, match=r"not this request.s .*trainflow\.dev/key"):
        backend.submit(request("e2e/adopt-2", name=first.name))
    assert len(trainjobs(k8s, namespace)) == 1
    backend.wait(first, timeout=TIMEOUT)


def test_410_gone_relists_and_returns_one_terminal_result(backend, namespace):
    """The real API server answers a watch from a compacted version with 410: the list-watch loop lists again
    and reaches the job's end. The first 'list' hands the loop the stale version "1", as a watch resumed long
    after its last event would have."""
    from trainflow.core.kube import calls
    from trainflow.core.kube.aio import AsyncKubeApi
    from trainflow.core.kube.http import open_transport
    from trainflow.core.kube.listwatch import WatchStats, list_and_watch, read_events

    ref = backend.submit(request("e2e/gone"))
    states: list[str] = []
    stats = WatchStats()

    async def main() -> None:
        async with open_transport(backend.cluster) as transport:
            api = AsyncKubeApi(transport)
            stale = ["1"]

            async def list_fn() -> str:
                if stale:
                    return stale.pop()
                listed = await api.run(
                    calls.list_trainjobs(namespace, field_selector=f"metadata.name={ref.name}")
                )
                return str(listed["metadata"]["resourceVersion"])

            def apply(kind: str, obj: dict) -> None:
                conditions = {
                    c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []
                }
                if conditions.get("Complete") == "True":
                    states.append("Complete")
                    raise asyncio.CancelledError

            async def watch_fn(rv: str) -> tuple[str, bool]:
                resp = await api.run(
                    calls.watch_trainjobs(namespace, rv, 60, field_selector=f"metadata.name={ref.name}")
                )
                return await read_events(resp, rv, stats, apply)

            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(list_and_watch(list_fn, watch_fn, "e2e", stats, pytest.fail), TIMEOUT)

    asyncio.run(main())
    assert stats.relists_410 >= 1, stats
    assert states == ["Complete"]
    assert backend.wait(ref, timeout=TIMEOUT).state is JobState.COMPLETE
    print(f"\n410 path: {stats}")


def test_server_rejections_map_to_request_fields(backend, namespace):
    manifest = backend.render(request("e2e/invalid"))
    bad = {**manifest, "metadata": {**manifest["metadata"], "name": "1-starts-with-digit"}}
    with pytest.raises(InvalidRequest) as info:
        backend.create(bad)
    assert "name" in info.value.fields
    env = {
        **manifest,
        "spec": {
            **manifest["spec"],
            "trainer": {**manifest["spec"]["trainer"], "env": [{"name": "PET_NNODES", "value": "5"}]},
        },
    }
    with pytest.raises(InvalidRequest) as info:
        backend.create(env)
    # the webhook names spec.trainer.env[0]; the manifest sent says which entry that is (as the offline check does)
    assert info.value.fields == ["env.PET_NNODES"], info.value
    assert "PET_NNODES" in str(info.value)


def test_wait_async_many_waiters_share_one_watch(backend, namespace, k8s):
    jobs = 12
    # pods stay Running a while, so every waiter is attached before its job ends
    refs = [
        backend.submit(request(f"e2e/async-{i}", num_nodes=1, annotations={KWOK_COMPLETE_DELAY: "15s"}))
        for i in range(jobs)
    ]

    async def main():
        reg = registry()
        # two waiters per job (e.g. a trigger and a sensor), all in one event loop
        tasks = [asyncio.create_task(backend.wait_async(r, timeout=TIMEOUT)) for r in refs for _ in range(2)]
        peak = 0
        while not all(t.done() for t in tasks):
            peak = max(peak, reg.active_watches)
            await asyncio.sleep(0.05)
        stats = reg.stats(backend.watch_key(namespace))
        return await asyncio.gather(*tasks), peak, reg.active_watches, reg.started, stats

    t0 = time.time()
    results, peak, after, started, stats = asyncio.run(main())
    assert len(results) == 2 * jobs
    assert {r.state for r in results} == {JobState.COMPLETE}
    assert {r.name for r in results} == {r.name for r in refs}
    assert peak == 1, "all waiters must share one namespace watch"
    assert started == 1
    assert after == 0, "the watch stops with its last waiter"
    assert stats.lists == 1 and stats.watches == 1, stats  # one list, one watch connection for everyone
    assert stats.events >= jobs and stats.gets == 0, stats  # every Complete came through the shared watch
    print(f"\n{2 * jobs} async waiters on {jobs} jobs: one watch, {time.time() - t0:.1f}s, {stats}")


def test_cancel_is_idempotent(backend, namespace, k8s):
    req = request("e2e/cancel", annotations={KWOK_COMPLETE_DELAY: "300s"})
    ref = backend.submit(req)
    wait_until(lambda: backend.get(ref).state is JobState.RUNNING, TIMEOUT, "Running")
    assert backend.cancel(ref) is True
    wait_until(lambda: not trainjobs(k8s, namespace), TIMEOUT, "TrainJob gone")
    assert backend.cancel(ref) is False
    with pytest.raises(TrainJobNotFound):
        backend.get(ref)


def test_deleted_while_waiting_raises_not_found(backend, namespace):
    ref = backend.submit(request("e2e/deleted", annotations={KWOK_COMPLETE_DELAY: "300s"}))
    threading.Timer(2.0, backend.cancel, (ref,)).start()
    with pytest.raises(TrainJobNotFound):
        backend.wait(ref, timeout=TIMEOUT)


def test_deadline_leaves_job_running(backend, namespace):
    ref = backend.submit(request("e2e/deadline", annotations={KWOK_COMPLETE_DELAY: "300s"}))
    t0 = time.time()
    with pytest.raises(WaitTimeout) as info:
        backend.wait(ref, timeout=4)
    assert 3.5 <= time.time() - t0 < 10
    assert info.value.state in ("Created", "Running")
    assert backend.get(ref).state in (JobState.CREATED, JobState.RUNNING)  # not cancelled


def test_suspend_queued_then_resume_completes(backend, namespace, k8s):
    ref = backend.submit(request("e2e/suspend", suspend=True))
    with pytest.raises(WaitTimeout, match="still Queued"):
        backend.wait(ref, timeout=5)
    assert backend.get(ref).state is JobState.QUEUED
    assert k8s.core.list_namespaced_pod(namespace).items == []
    resumed = backend.resume(ref)
    assert resumed.state is not JobState.FAILED
    result = backend.wait(ref, timeout=TIMEOUT)
    assert result.state is JobState.COMPLETE
    # suspend on a finished job is a plain patch; it stays Complete
    assert backend.suspend(ref).state is JobState.COMPLETE


def test_list_filters_by_labels(backend, namespace):
    a = backend.submit(request("e2e/list-a", labels={"team": "a"}, suspend=True))
    backend.submit(request("e2e/list-b", labels={"team": "b"}, suspend=True))
    assert [r.name for r in backend.list({"team": "a"})] == [a.name]
    assert len(backend.list()) == 2


def test_logs_of_rank0_through_the_api_server(backend, testbed):
    """logs() picks rank 0's pod and container and reads it through the API server (kwok serves the kubelet API)."""
    ref = backend.submit(
        request(
            "logs",
            runtime_patches=[
                {
                    "manager": "example.com/e2e",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "metadata": {"annotations": {KWOK_COMPLETE_DELAY: "20s"}}
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        )
    )
    wait_until(lambda: backend.get(ref).state is JobState.RUNNING, TIMEOUT, "the job to run")
    lines = wait_until(lambda: list(backend.logs(ref, step="node-0")), TIMEOUT, "rank 0's log")
    text = "\n".join(lines)
    assert "step=2 loss=0.45" in text and "training finished" in text
    assert list(backend.logs(ref, step="node-0", tail_lines=1))[-1].endswith("training finished")
    assert backend.wait(ref, timeout=TIMEOUT).state is JobState.COMPLETE
