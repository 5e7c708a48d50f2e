"""Watch machinery against the loopback fake API server (fake_apiserver.py; development aid, not the real
proof, which is tests/e2e/test_kube_backend.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fake_apiserver import FakeApiServer, kubeconfig, when

from bounds import HANG
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
    yield b
    b.close()


def test_wait_sees_complete_and_reports_updates(fake, backend):
    fake.add("a")
    # after the list, while the watch streams: both changes arrive as events, in order
    when(
        lambda: fake.open_watches,
        (fake.set_running, "a"),
        (fake.set_condition, "a", "Complete", "AllJobsCompleted"),
    )
    seen: list[JobState] = []
    result = backend.wait("a", timeout=HANG, on_update=lambda r: seen.append(r.state))
    assert result.state is JobState.COMPLETE and result.reason == "AllJobsCompleted"
    assert seen == [JobState.CREATED, JobState.RUNNING, JobState.COMPLETE]
    assert backend.last_wait_stats.lists == 1 and backend.last_wait_stats.watches == 1


def test_410_gone_relists_and_returns_one_terminal_result(fake, backend):
    fake.add("a")
    fake.set_running("a")
    # once the watch streams: a newer version is compacted away and the stream is cut, so the watch resumes
    # from a version the server no longer has (410) and lists again
    when(lambda: fake.open_watches, (fake.add, "other"), (fake.compact,), (fake.drop_watches,))
    when(
        lambda: fake.list_requests >= 2 and fake.open_watches,
        (fake.set_condition, "a", "Complete", "AllJobsCompleted"),
    )
    result = backend.wait("a", timeout=HANG)
    assert result.state is JobState.COMPLETE
    assert backend.last_wait_stats.relists_410 == 1
    assert backend.last_wait_stats.lists == 2


def test_dropped_watch_reconnects_from_last_version(fake, backend):
    fake.add("a")
    when(lambda: fake.open_watches, (fake.drop_watches,))
    when(
        lambda: fake.watch_requests >= 2 and fake.open_watches,
        (fake.set_condition, "a", "Failed", "FailedJobs"),
    )
    with pytest.raises(TrainJobFailed) as info:
        backend.wait("a", timeout=HANG)
    assert info.value.result.reason == "FailedJobs"
    assert backend.last_wait_stats.reconnects >= 1
    assert backend.last_wait_stats.lists == 1  # resumed from the resourceVersion, no re-list


def test_deleted_while_waiting_and_deadline(fake, backend):
    fake.add("a")
    when(lambda: fake.open_watches, (fake.delete, "a"))
    with pytest.raises(TrainJobNotFound):
        backend.wait("a", timeout=HANG)
    with pytest.raises(TrainJobNotFound):
        backend.wait("never", timeout=HANG)
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
    tasks = [asyncio.create_task(backend.wait_async(n, timeout=HANG)) for n in names]
    # the shared watch imports its HTTP client off the loop (seconds in a fresh, loaded process), lists,
    # then streams: wait for the stream itself, or the jobs could all complete before it opens
    end = time.monotonic() + HANG
    while not fake.open_watches and time.monotonic() < end:
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
        await backend.wait_async("bad", timeout=HANG)
    with pytest.raises(TrainJobNotFound):
        await backend.wait_async("ghost", timeout=HANG)
    fake.add("slow")
    with pytest.raises(WaitTimeout):
        await backend.wait_async("slow", timeout=1)
    fake.add("gone")
    waiter = asyncio.create_task(backend.wait_async("gone", timeout=HANG))
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
        await backend.wait_async("c", timeout=HANG)
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
    result = await backend.wait_async("r", timeout=HANG)
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
        await backend.wait_async("p", timeout=HANG)
    assert fake.pod_list_requests >= 3  # 6 pods, 2 a page; then the waiter's own look
    assert [r["exit_code"] for r in err.value.diagnostics.failed_ranks] == [7]


def test_registries_are_per_event_loop(fake, backend):
    fake.add("x")
    fake.set_condition("x", "Complete", "AllJobsCompleted")

    async def one() -> tuple[int, str]:
        result = await backend.wait_async("x", timeout=HANG)
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


def client_threads() -> int:
    """Threads of this process other than the fake API server's (it serves each connection on a thread of its
    own, and a loaded machine closes them late)."""
    return sum("process_request_thread" not in t.name for t in threading.enumerate())


def running_pod(job: str) -> dict:
    return {
        "metadata": {
            "name": f"{job}-node-0-0",
            "uid": f"pod-{job}",
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": job,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": {"restartPolicy": "OnFailure"},
        "status": {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]},
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_wait_copies_rank0s_log_as_the_job_runs(fake, backend, mode):
    """The wait follows rank 0's log itself: it learns of the pod from the pod watch (no polling for it), copies
    each line once across a dropped stream, and ends with the job. No thread is started for it."""
    from trainflow.core.logsink import LogSink

    fake.add("lg")
    now = time.time()
    fake.log_lines = [(now - 5 + i * 0.5, f"line {i + 1}") for i in range(5)]
    when(
        lambda: fake.open_watches and fake.pod_watch_requests,
        (fake.set_running, "lg"),
        (fake.put_pod, running_pod("lg")),
    )
    when(lambda: len(fake.log_requests) >= 2, (fake.set_condition, "lg", "Complete", "AllJobsCompleted"))
    lines: list[str] = []
    sink = LogSink(lambda step, line: lines.append(f"[{step}] {line}"), ["node-0"], 100)
    threads = client_threads()
    if mode == "sync":
        result = backend.wait("lg", timeout=HANG, logs=sink)
    else:
        result = asyncio.run(backend.wait_async("lg", timeout=HANG, logs=sink))
    assert result.state is JobState.COMPLETE
    assert lines == [f"[node-0] line {i}" for i in range(1, 8)]
    assert client_threads() <= threads + 1  # a sync wait's loop runs on this thread
    # no polling for the pod: the pod watch's list, the feed's first look, one look at each end of stream (the
    # first one drops), and the finishing read of rank 0's log for metrics
    assert fake.pod_list_requests <= 5


def test_past_the_stream_slots_a_log_is_polled_on_the_shared_connections(fake, backend, monkeypatch):
    """With every stream slot taken (none here), the wait reads the new lines now and then, and once more at
    the end, each line once."""
    from trainflow.core.kube import follow_pace
    from trainflow.core.logsink import LogSink

    monkeypatch.setattr(follow_pace, "FOLLOW_STREAMS", 0)
    monkeypatch.setattr(follow_pace, "POLL_SECONDS", 0.3)
    fake.add("pl")
    now = time.time()
    fake.log_lines = [(now - 5 + i * 0.5, f"line {i + 1}") for i in range(3)]

    def more() -> None:
        fake.log_lines.append((time.time(), "line 4"))

    when(
        lambda: fake.open_watches and fake.pod_watch_requests,
        (fake.set_running, "pl"),
        (fake.put_pod, running_pod("pl")),
    )
    when(lambda: len(fake.log_requests) >= 2, (more,))
    when(lambda: len(fake.log_requests) >= 4, (fake.set_condition, "pl", "Complete", "AllJobsCompleted"))
    lines: list[str] = []
    result = backend.wait(
        "pl", timeout=HANG, logs=LogSink(lambda step, line: lines.append(line), ["node-0"], 100)
    )
    assert result.state is JobState.COMPLETE
    assert lines == ["line 1", "line 2", "line 3", "line 4"]
    assert not any(q.get("follow") for q in fake.log_requests)  # polled, never streamed


@pytest.mark.parametrize("started", [True, False])
def test_the_end_of_a_wait_does_not_hang_on_its_log(fake, backend, started, monkeypatch):
    """A followed stream may stay open after the job ended (kwok never closes one): the wait stops it and reads
    the log once more instead of waiting out the drain; a pod that never started is not waited for."""
    from trainflow.core.kube import wait as kube_wait
    from trainflow.core.logsink import LogSink

    # the drain as long as a hang: a wait that waited it out would not end before the bound below
    monkeypatch.setattr(kube_wait, "DRAIN_SECONDS", HANG)
    fake.hold_follows = True
    fake.add("hd")
    now = time.time()
    fake.log_lines = [(now - 5 + i * 0.5, f"line {i + 1}") for i in range(3)]

    def more() -> None:  # written while the stream is open, after the last line it delivered
        fake.log_lines.append((time.time(), "line 4"))

    steps = [(fake.set_running, "hd")] + ([(fake.put_pod, running_pod("hd"))] if started else [])
    when(lambda: fake.open_watches and fake.pod_watch_requests, *steps)
    ready = (lambda: fake.log_requests) if started else (lambda: fake.pod_list_requests >= 2)
    completed: list[float] = []
    when(ready, (time.sleep, 0.3), (more,), (completed.append, time.time()),
         (fake.set_condition, "hd", "Complete", "AllJobsCompleted"))  # fmt: skip
    lines: list[str] = []
    result = backend.wait(
        "hd", timeout=HANG, logs=LogSink(lambda step, line: lines.append(line), ["node-0"], 100)
    )
    returned = time.time()
    assert result.state is JobState.COMPLETE
    assert returned - completed[0] < HANG / 2
    if started:
        assert lines == ["line 1", "line 2", "line 3", "line 4"]
        follows = [bool(q.get("follow")) for q in fake.log_requests]
        # the stream, then the last read (and the finishing read of rank 0's log for metrics)
        assert follows[0] and not any(follows[1:]) and len(follows) <= 3
    else:
        assert lines == [] and not fake.log_requests


def test_a_polled_log_is_read_line_by_line_each_line_once(fake, backend, monkeypatch):
    """A poll reads everything written since the last line seen off the response, a line at a time (no
    limitBytes, whose cut inside a line would tear it): thousands of lines, a burst just before the end, each
    line once and whole."""
    from trainflow.core.kube import follow_pace
    from trainflow.core.logsink import LogSink

    monkeypatch.setattr(follow_pace, "FOLLOW_STREAMS", 0)
    monkeypatch.setattr(follow_pace, "POLL_SECONDS", 0.3)
    fake.add("big")
    now = time.time()
    fake.log_lines = [(now - 60 + i * 0.01, f"line {i + 1:04d} " + "x" * 200) for i in range(5000)]

    def more() -> None:  # written in the same instant, just before the job completes
        t = time.time()
        fake.log_lines.extend((t, f"late {i + 1:04d}") for i in range(2000))

    when(
        lambda: fake.open_watches and fake.pod_watch_requests,
        (fake.set_running, "big"),
        (fake.put_pod, running_pod("big")),
    )
    when(
        lambda: len(fake.log_requests) >= 3,
        (more,),
        (fake.set_condition, "big", "Complete", "AllJobsCompleted"),
    )
    lines: list[str] = []
    result = backend.wait(
        "big", timeout=HANG, logs=LogSink(lambda step, line: lines.append(line), ["node-0"], 10_000)
    )
    assert result.state is JobState.COMPLETE
    expected = [f"line {i + 1:04d} " + "x" * 200 for i in range(5000)] + [
        f"late {i + 1:04d}" for i in range(2000)
    ]
    assert lines == expected
    polls = [q for q in fake.log_requests if "tailLines" not in q]  # not the finishing read for metrics
    assert polls and not any("limitBytes" in q or q.get("follow") for q in polls)
