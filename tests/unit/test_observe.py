"""One table of TrainJob status sequences, run through every waiter: the pure state machine, the sync watch, the
shared async watch (both over HTTP to the loopback fake API server) and the local engine's polling.

Each row is what a waiter sees (statuses in the Trainer's shape, in order) and what it must report: the states
passed to ``on_update`` and how the wait ends. The drivers differ only in how versions reach ``observe``.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, kubeconfig

from bounds import HANG
from trainflow.core.errors import TrainJobFailed, WaitTimeout
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.local import store
from trainflow.core.local.engine import LocalBackend
from trainflow.core.observe import POD_CHECK_SECONDS, Waiter, observe
from trainflow.core.result import JobState

T0 = "2026-11-29T10:00:00Z"
CREATED: dict[str, Any] = {}
RUNNING = {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}
ZEROS = {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 0}]}  # Trainer v2.3 transient
SUSPENDED = {
    "conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended", "lastTransitionTime": T0}]
}


def cond(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": f"{kind} {reason}",
        "lastTransitionTime": T0,
    }


def progress(pct: int, **metrics: str) -> dict[str, Any]:
    trainer = {"progressPercentage": pct, "metrics": [{"name": k, "value": v} for k, v in metrics.items()]}
    return {**RUNNING, "trainerStatus": trainer}


def report(pct: int, eta: int, at: str, **metrics: str) -> dict[str, Any]:
    """A trainerStatus as the Trainer's status server stores a report (``lastUpdatedTime`` always set)."""
    trainer: dict[str, Any] = {
        "progressPercentage": pct,
        "estimatedRemainingSeconds": eta,
        "lastUpdatedTime": at,
    }
    trainer["metrics"] = [{"name": k, "value": v} for k, v in metrics.items()]
    return {**RUNNING, "trainerStatus": trainer}


COMPLETE = {
    "conditions": [cond("Complete", "AllJobsCompleted")],
    "trainerStatus": {"metrics": [{"name": "loss", "value": "0.1"}]},
}
FAILED = {"conditions": [cond("Failed", "FailedJobs")]}

# (row id, statuses in order, states reported to on_update, ending: "Complete" | "Failed" | "timeout")
TABLE = [
    (
        "created-running-complete",
        [CREATED, RUNNING, COMPLETE],
        ["Created", "Running", "Complete"],
        "Complete",
    ),
    ("no-step-back-to-created", [RUNNING, ZEROS, FAILED], ["Running", "Failed"], "Failed"),
    ("queued-then-runs", [SUSPENDED, RUNNING, COMPLETE], ["Queued", "Running", "Complete"], "Complete"),
    (
        "progress-is-news",
        [RUNNING, progress(10), progress(50, loss="0.5"), COMPLETE],
        ["Running", "Running", "Running", "Complete"],
        "Complete",
    ),
    ("same-status-is-not-news", [RUNNING, RUNNING, COMPLETE], ["Running", "Complete"], "Complete"),
    (
        "each-report-once",
        [
            RUNNING,
            report(10, 90, "2026-11-29T10:00:01Z", loss="2.5"),
            report(10, 90, "2026-11-29T10:00:01Z", loss="2.5"),  # the same report in another event
            report(40, 60, "2026-11-29T10:00:02Z", loss="1.25", acc="0.5"),
            report(40, 60, "2026-11-29T10:00:03Z", loss="1.25", acc="0.5"),  # reported again: a point
            COMPLETE,
        ],
        ["Running", "Running", "Running", "Running", "Complete"],
        "Complete",
    ),
    ("deadline", [CREATED, RUNNING], ["Created", "Running"], "timeout"),
]
IDS = [row[0] for row in TABLE]
DEADLINE = 4.0  # for the "deadline" row: the statuses stop, the wait must end on its own


def timeout_of(row: tuple[Any, ...]) -> float:
    """The wait's timeout: short for the deadline row, a hang detector for the others (they end on their own)."""
    return DEADLINE if row[3] == "timeout" else HANG


def expected_history(statuses: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each distinct trainerStatus in the order seen, as (progress, eta, numeric metrics)."""
    out, last = [], None
    for status in statuses:
        ts = status.get("trainerStatus")
        if ts and ts != last:
            metrics = {m["name"]: float(m["value"]) for m in ts.get("metrics") or []}
            out.append((ts.get("progressPercentage"), ts.get("estimatedRemainingSeconds"), metrics))
        last = ts or last
    return out


def expect(reported: list[JobState], ending: Any, row: tuple[Any, ...]) -> None:
    _, statuses, states, end = row
    assert [s.value for s in reported] == states
    if end == "timeout":
        assert isinstance(ending, WaitTimeout), ending
        return
    if end == "Failed":
        assert isinstance(ending, TrainJobFailed) and ending.result.reason == "FailedJobs", ending
        ending = ending.result
    else:
        assert ending.state.value == end and ending.metrics == {"loss": 0.1}, ending
    got = [(p.progress, p.eta_seconds, p.metrics) for p in ending.history]
    assert got == expected_history(statuses)
    assert ending.history.seen == len(got)


def obj(status: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": "job", "namespace": "ns", "uid": "u", "creationTimestamp": T0}
    return {"metadata": meta, "spec": {"runtimeRef": {"name": "torch-distributed"}}, "status": status}


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_pure_state_machine(row: tuple[Any, ...]) -> None:
    waiter = Waiter(deadline=time.time() + 3600)
    reported: list[JobState] = []
    ending: Any = None
    for status in row[1]:
        out = observe(waiter, obj(status), time.time())
        if out.changed and out.result is not None:
            reported.append(out.result.state)
        if out.done:
            ending = out.result if out.result and out.result.succeeded else TrainJobFailed(out.result)
    if ending is None:
        waiter.deadline = time.time() - 1
        assert observe(waiter, None, time.time()).timed_out
        ending = WaitTimeout("ns", "job", "Running", 1)
    expect(reported, ending, row)


def reports_after(statuses: list[dict[str, Any]]) -> int:
    """How many updates the pure state machine reports for these statuses, in order."""
    waiter = Waiter(deadline=time.time() + 3600)
    return sum(1 for st in statuses if (out := observe(waiter, obj(st), time.time())).changed and out.result)


def feed(
    statuses: list[dict[str, Any]], write: Callable[[dict[str, Any]], None], reported: list[JobState]
) -> threading.Thread:
    """The rest of a row (the first status is written before the wait starts): each next status once the waiter
    has reported what the statuses so far make news (its own pace, loaded CI or not), then a short pause."""

    def run() -> None:
        for i in range(1, len(statuses)):
            due, deadline = reports_after(statuses[:i]), time.monotonic() + HANG
            while len(reported) < due and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # a status that is not news (no report to wait for) still gets read alone
            write(statuses[i])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def fake() -> Any:
    server = FakeApiServer()
    server.add("job")
    yield server
    server.close()


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_sync_watch(fake: FakeApiServer, row: tuple[Any, ...]) -> None:
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))
    backend.get("job")  # the client library loads on first use: not inside the measured deadline
    reported: list[JobState] = []
    fake.set_status("job", row[1][0])
    feed(row[1], lambda s: fake.set_status("job", s), reported)
    try:
        ending: Any = backend.wait(
            "job", timeout=timeout_of(row), on_update=lambda r: reported.append(r.state)
        )
    except (TrainJobFailed, WaitTimeout) as exc:
        ending = exc
    expect(reported, ending, row)


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_shared_async_watch(fake: FakeApiServer, row: tuple[Any, ...]) -> None:
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))
    reported: list[JobState] = []

    async def wait() -> Any:
        await asyncio.to_thread(importlib.import_module, "httpx")  # loads once per process
        waiting = asyncio.ensure_future(
            backend.wait_async("job", timeout=timeout_of(row), on_update=lambda r: reported.append(r.state))
        )
        # the shared watch is open: every later status is an event, not a re-list
        end = time.monotonic() + HANG
        while not fake.open_watches and not waiting.done() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        feed(row[1], lambda s: fake.set_status("job", s), reported)
        try:
            return await waiting
        except (TrainJobFailed, WaitTimeout) as exc:
            return exc

    fake.set_status("job", row[1][0])
    expect(reported, asyncio.run(wait()), row)


def test_local_engine(tmp_path: Path) -> None:
    """The local engine reads the same shapes from its job directory (supervisor lock held by this test)."""
    for row in TABLE:
        backend = LocalBackend(home=tmp_path, namespace="ns", poll_interval=0.01)
        job = store.JobDir(tmp_path / "jobs" / "ns" / row[0])
        (job.root / store.LOGS_DIR).mkdir(parents=True)
        store.write_json(job.plan, {"step": "node", "launched_nodes": 1})
        manifest = obj(CREATED)
        manifest["metadata"].update(name=row[0], creationTimestamp=store.now_iso())
        store.write_json(job.trainjob, manifest)
        fd = os.open(job.supervisor_lock, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a live supervisor holds
        reported: list[JobState] = []

        def write(status: dict[str, Any], job: store.JobDir = job) -> None:
            with job.update() as current:
                current["status"] = json.loads(json.dumps(status))

        try:
            write(row[1][0])
            feed(row[1], write, reported)
            try:
                ending: Any = backend.wait(
                    row[0], timeout=timeout_of(row), on_update=lambda r, seen=reported: seen.append(r.state)
                )
            except (TrainJobFailed, WaitTimeout) as exc:
                ending = exc
        finally:
            os.close(fd)
        expect(reported, ending, row)


def test_a_waiter_looks_at_pods_only_when_the_counts_say_not_ready() -> None:
    """Crashed containers reach a waiter from the pod watch (kube/pod_watch.py); the status alone asks for a
    look at the pods (a stuck pull or schedule) when the Trainer counts fewer ready than active pods."""
    now = time.time()
    waiter = Waiter(deadline=now + 3600, pod_checks=True)
    assert not observe(waiter, obj(CREATED), now).check_pods  # no jobsStatus: no pods yet
    assert not observe(waiter, obj(RUNNING), now).check_pods  # 2 active, 2 ready
    assert waiter.next_check(now + 1, 300) == pytest.approx(300, abs=1)
    crashed = {"jobsStatus": [{"name": "node", "active": 2, "ready": 1}]}
    assert observe(waiter, obj(crashed), now + 2).check_pods
    assert not observe(waiter, None, now + 2.5).check_pods  # looked half a second ago
    assert waiter.next_check(now + 2.5, 300) <= POD_CHECK_SECONDS
    assert not observe(waiter, obj(FAILED), now + 20).check_pods  # terminal: the pods are gone


def test_recording_the_history_adds_no_request(fake: FakeApiServer) -> None:
    """The same number of watch events with and without reports in them: the same requests, and the history
    holds each report (the loopback server counts what the waiter asks for)."""
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))

    def run(name: str, with_reports: bool) -> tuple[tuple[int, ...], Any]:
        fake.add(name)
        fake.set_status(name, RUNNING)
        before = counts()
        read = [-2]  # the newest report the waiter has recorded, -1 before any (on_update runs on its loop)

        def on_update(r: Any) -> None:
            read[0] = max(read[0], -1)
            if r.metrics.get("loss"):
                read[0] = max(read[0], round(1 / float(r.metrics["loss"])) - 1)

        def write() -> None:
            # the waiter has its job (a report before that is not its to see)
            deadline = time.monotonic() + HANG
            while with_reports and read[0] < -1 and time.monotonic() < deadline:
                time.sleep(0.005)
            for i in range(60):
                # a mailbox keeps the newest MAX_VERSIONS unread versions; the writer stays 8 ahead at most,
                # so a loaded machine slows the test down instead of dropping reports
                deadline = time.monotonic() + HANG
                while with_reports and read[0] < i - 8 and time.monotonic() < deadline:
                    time.sleep(0.005)
                if with_reports:
                    status = report(
                        i * 100 // 60,
                        60 - i,
                        f"2026-11-29T10:{i // 60:02d}:{i % 60:02d}Z",
                        loss=str(1 / (i + 1)),
                    )
                else:
                    status = {
                        "jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": i}]
                    }
                fake.set_status(name, status)
                time.sleep(0.01)
            fake.set_status(name, COMPLETE)

        async def wait() -> Any:
            waiting = asyncio.ensure_future(backend.wait_async(name, timeout=HANG, on_update=on_update))
            end = time.monotonic() + HANG
            while not fake.open_watches and time.monotonic() < end:
                await asyncio.sleep(0.05)
            threading.Thread(target=write, daemon=True).start()
            return await waiting

        result = asyncio.run(wait())
        return tuple(a - b for a, b in zip(counts(), before, strict=True)), result

    def counts() -> tuple[int, ...]:
        return (
            fake.list_requests,
            fake.watch_requests,
            fake.pod_list_requests,
            fake.pod_watch_requests,
            len(fake.log_requests),
        )

    plain_requests, plain = run("plain", with_reports=False)
    report_requests, reported = run("reported", with_reports=True)
    assert report_requests == plain_requests
    assert len(plain.history) == 1 and len(reported.history) == 61  # 60 reports, then COMPLETE's own
