"""Watch machinery against the loopback fake API server (fake_apiserver.py; development aid, not the real
proof, which is tests/e2e/test_kube_backend.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fake_apiserver import FakeApiServer, kubeconfig

from trainflow.core.errors import TrainJobFailed, TrainJobNotFound, WaitTimeout
from trainflow.core.kube import pod_watch
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.kube.shared_watch import registry
from trainflow.core.result import JobState


@pytest.fixture
def fake():
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def backend(fake):
    b = KubernetesBackend(config_dict=kubeconfig(fake.url))
    b.api.api_client  # noqa: B018 - the client library loads on first use; not inside the timed steps below
    yield b
    b.close()


def when(ready, *steps) -> threading.Thread:
    """Once ``ready()`` holds (polled; the client's pace, not a guess at it), run each ``(fn, *args)`` in turn."""

    def run() -> None:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        for fn, *args in steps:
            fn(*args)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_wait_sees_complete_and_reports_updates(fake, backend):
    fake.add("a")
    # after the list, while the watch streams: both changes arrive as events, in order
    when(
        lambda: fake.open_watches,
        (fake.set_running, "a"),
        (fake.set_condition, "a", "Complete", "AllJobsCompleted"),
    )
    seen: list[JobState] = []
    result = backend.wait("a", timeout=10, on_update=lambda r: seen.append(r.state))
    assert result.state is JobState.COMPLETE and result.reason == "AllJobsCompleted"
    assert seen == [JobState.CREATED, JobState.RUNNING, JobState.COMPLETE]
    assert backend.last_wait_stats.lists == 1 and backend.last_wait_stats.watches == 1


def test_410_gone_relists_and_returns_one_terminal_result(fake, backend):
    fake.add("a")
    fake.set_running("a")
    fake.compact()
    when(lambda: fake.open_watches, (fake.set_condition, "a", "Complete", "AllJobsCompleted"))
    result = backend.wait("a", timeout=10, resource_version="1")
    assert result.state is JobState.COMPLETE
    assert backend.last_wait_stats.relists_410 == 1
    assert backend.last_wait_stats.lists == 1


def test_dropped_watch_reconnects_from_last_version(fake, backend):
    fake.add("a")
    when(lambda: fake.open_watches, (fake.drop_watches,))
    when(
        lambda: fake.watch_requests >= 2 and fake.open_watches,
        (fake.set_condition, "a", "Failed", "FailedJobs"),
    )
    with pytest.raises(TrainJobFailed) as info:
        backend.wait("a", timeout=15)
    assert info.value.result.reason == "FailedJobs"
    assert backend.last_wait_stats.reconnects >= 1
    assert backend.last_wait_stats.lists == 1  # resumed from the resourceVersion, no re-list


def test_deleted_while_waiting_and_deadline(fake, backend):
    fake.add("a")
    when(lambda: fake.open_watches, (fake.delete, "a"))
    with pytest.raises(TrainJobNotFound):
        backend.wait("a", timeout=10)
    with pytest.raises(TrainJobNotFound):
        backend.wait("never", timeout=10)
    fake.add("b")
    t0 = time.time()
    with pytest.raises(WaitTimeout, match="still Created"):
        backend.wait("b", timeout=1.5)
    assert 1.0 <= time.time() - t0 < 10  # not before its timeout; the upper bound is generous for loaded CI


async def test_many_async_waiters_share_one_watch(fake, backend):
    names = [f"j{i}" for i in range(100)]
    for n in names:
        fake.add(n)
    reg = registry()
    tasks = [asyncio.create_task(backend.wait_async(n, timeout=90)) for n in names]
    # the shared watch imports aiohttp off the loop (seconds in a fresh, loaded process), lists,
    # then streams: wait for the stream itself, or the jobs could all complete before it opens
    for _ in range(600):
        if fake.open_watches:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    assert reg.active_watches == 1 and fake.open_watches == 1
    fake.compact()
    fake.drop_watches()  # the shared watch reconnects, gets 410, re-lists
    await asyncio.sleep(1.0)
    for n in names:
        await asyncio.to_thread(fake.set_condition, n, "Complete", "AllJobsCompleted")
    results = await asyncio.gather(*tasks)
    assert {r.state for r in results} == {JobState.COMPLETE}
    assert sorted(r.name for r in results) == sorted(names)
    assert fake.max_open_watches == 1
    assert reg.active_watches == 0  # stopped with its last waiter


async def test_async_not_found_failed_and_timeout(fake, backend):
    fake.add("bad")
    fake.set_condition("bad", "Failed", "FailedJobs")
    with pytest.raises(TrainJobFailed, match="FailedJobs"):
        await backend.wait_async("bad", timeout=5)
    with pytest.raises(TrainJobNotFound):
        await backend.wait_async("ghost", timeout=10)
    fake.add("slow")
    with pytest.raises(WaitTimeout):
        await backend.wait_async("slow", timeout=1)
    fake.add("gone")
    waiter = asyncio.create_task(backend.wait_async("gone", timeout=10))
    await asyncio.sleep(0.3)
    fake.delete("gone")
    with pytest.raises(TrainJobNotFound):
        await waiter


def crashed_pod(job: str, exit_code: int) -> dict:
    return {
        "metadata": {
            "name": f"{job}-node-0-0-x1",
            "uid": f"pod-{job}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": job,
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "node",
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}},
                }
            ],
        },
    }


async def test_async_wait_reads_a_crash_before_the_job_deletes_the_pod(fake, backend):
    """The Trainer's counts still say all ready; only the pod watch tells of the crash, and the waiter reads
    the pod and its log before the pod is deleted and the TrainJob turns Failed."""
    fake.add("c")
    fake.set_running("c")
    fake.log_lines = [
        (time.time(), "Traceback (most recent call last):"),
        (time.time(), "ValueError: bad lr"),
    ]
    when(lambda: fake.open_watches and fake.pod_watch_requests, (fake.put_pod, crashed_pod("c", 3)))
    when(
        lambda: fake.log_requests,
        (fake.delete_pod, "c-node-0-0-x1"),
        (fake.set_condition, "c", "Failed", "FailedJobs"),
    )
    with pytest.raises(TrainJobFailed, match="FailedJobs") as err:
        await backend.wait_async("c", timeout=30)
    diag = err.value.diagnostics
    assert diag is not None
    assert [(r["pod"], r["exit_code"]) for r in diag.failed_ranks] == [("c-node-0-0-x1", 3)]
    assert diag.log_tail.endswith("ValueError: bad lr")
    assert len(fake.log_requests) == 1  # one crash, one look


async def test_async_wait_without_rbac_to_watch_pods_still_finishes(fake, backend, caplog):
    fake.forbid_pod_watch = True
    fake.add("r")
    caplog.set_level("INFO", logger="trainflow.core.kube.pod_watch")
    when(lambda: "cannot be watched" in caplog.text, (fake.set_condition, "r", "Complete", "Done"))
    result = await backend.wait_async("r", timeout=30)
    assert result.state is JobState.COMPLETE
    assert fake.pod_watch_requests == 1  # refused once, not retried


async def test_pod_watch_lists_page_by_page_and_reports_crashes_from_before_it_started(
    fake, backend, monkeypatch
):
    monkeypatch.setattr(pod_watch, "PAGE", 2)
    fake.add("p")
    fake.set_running("p")
    for i in range(5):  # 5 pods that run, then one that crashed before anyone watched
        running = crashed_pod("p", 0)
        running["metadata"].update(name=f"p-node-0-{i}", uid=f"u{i}")
        running["status"]["containerStatuses"][0]["state"] = {"running": {}}
        fake.put_pod(running)
    fake.put_pod(crashed_pod("p", 7))
    when(lambda: fake.log_requests, (fake.set_condition, "p", "Failed", "FailedJobs"))
    with pytest.raises(TrainJobFailed) as err:
        await backend.wait_async("p", timeout=30)
    assert fake.pod_list_requests >= 3  # 6 pods, 2 a page; then the waiter's own look
    assert [r["exit_code"] for r in err.value.diagnostics.failed_ranks] == [7]


def test_registries_are_per_event_loop(fake, backend):
    fake.add("x")
    fake.set_condition("x", "Complete", "AllJobsCompleted")

    async def one() -> tuple[int, str]:
        result = await backend.wait_async("x", timeout=5)
        return id(registry()), result.state.value

    first, second = asyncio.run(one()), asyncio.run(one())
    assert first[1] == second[1] == "Complete"


def test_follow_logs_reconnects_from_last_timestamp_without_replay(fake, backend):
    fake.add("a")
    fake.pods = [
        {
            "metadata": {"name": "a-node-0-0", "creationTimestamp": "2026-11-29T10:00:00Z", "labels": {}},
            "spec": {"restartPolicy": "OnFailure"},  # as the Trainer's node pods: an exit 0 is not restarted
            "status": {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]},
        }
    ]
    now = time.time()
    fake.log_lines = [(now - 5 + i * 0.5, f"line {i + 1}") for i in range(5)]
    lines = list(backend.logs("a", follow=True, tail_lines=100))
    assert lines == [f"line {i}" for i in range(1, 8)]  # each line once, in order
    first, second = fake.log_requests
    assert first["follow"].lower() == first["timestamps"].lower() == "true" and first["tailLines"] == "100"
    assert "sinceSeconds" in second and "tailLines" not in second  # resumed, not replayed
    assert second["container"] == "node"
