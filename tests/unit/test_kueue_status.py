"""Kueue's word on a TrainJob: reading Workloads (core/kueue.py), the waiter's queue rules (core/observe.py) and
both drivers reading the Workload through the loopback fake API server. The real Kueue is tests/e2e_kueue."""

from __future__ import annotations

import asyncio
import importlib
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, kubeconfig

from bounds import HANG
from trainflow.core.errors import TrainJobFailed, WaitTimeout
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.kueue import queue_status, with_queue, workload_of
from trainflow.core.observe import QUEUE_BUDGET_EXPIRED, QUEUE_FIRST_LOOK, Waiter, observe, observe_queue
from trainflow.core.result import JobState, result_from_trainjob

T0 = "2026-11-29T10:00:00Z"
PENDING_MSG = "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default, 4 more needed"


def cond(kind: str, status: str, reason: str, message: str = "", at: str = T0) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def workload(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "trainjob-job-3f2a1",
            "namespace": "ns",
            "labels": {"kueue.x-k8s.io/job-uid": "uid-job"},
            "creationTimestamp": T0,
            "ownerReferences": [
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "name": "job",
                    "uid": "uid-job",
                }
            ],
        },
        "spec": {"queueName": "team-a", "podSets": [{"name": "node", "count": 2}]},
        "status": {"conditions": list(conditions), **status},
    }


PENDING = workload(cond("QuotaReserved", "False", "Pending", PENDING_MSG))
ADMITTED = workload(
    cond("QuotaReserved", "True", "QuotaReserved"),
    cond("Admitted", "True", "Admitted"),
    admission={"clusterQueue": "cq"},
)
PREEMPTED_MSG = (
    "Preempted to accommodate a workload (UID: a, JobUID: b) due to prioritization in the ClusterQueue"
)
PREEMPTED = workload(
    cond("QuotaReserved", "False", "Preempted", PREEMPTED_MSG, "2026-11-29T10:05:00Z"),
    cond("Evicted", "True", "Preempted", PREEMPTED_MSG, "2026-11-29T10:05:00Z"),
    cond("Admitted", "False", "NoReservation", at="2026-11-29T10:05:00Z"),
    schedulingStats={"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]},
    accumulatedPastExecutionTimeSeconds=240,
)
REQUEUED_PENDING = workload(
    cond("QuotaReserved", "False", "Pending", PENDING_MSG, "2026-11-29T10:05:02Z"),
    cond("Evicted", "True", "Preempted", PREEMPTED_MSG, "2026-11-29T10:05:00Z"),
    schedulingStats={
        "evictions": [{"reason": "Preempted", "count": 2}, {"reason": "PodsReadyTimeout", "count": 1}]
    },
)


def test_pending_workload_says_why() -> None:
    q = queue_status(PENDING)
    assert (q.reason, q.message, q.local_queue, q.admitted, q.decided) == (
        "Pending",
        PENDING_MSG,
        "team-a",
        False,
        True,
    )


def test_admitted_workload_names_its_cluster_queue() -> None:
    q = queue_status(ADMITTED)
    assert q.admitted and q.cluster_queue == "cq" and q.reason == "Admitted"


def test_preempted_workload_counts_preemptions_only() -> None:
    q = queue_status(PREEMPTED)
    assert (q.reason, q.preemptions, q.evictions, q.admitted_before) == ("Preempted", 1, 1, 240.0)
    assert q.message == PREEMPTED_MSG  # said once, though two conditions say it
    again = queue_status(REQUEUED_PENDING)  # the newest condition speaks: waiting for quota again
    assert (again.reason, again.preemptions, again.evictions) == ("Pending", 2, 3)
    assert (
        again.message == f"{PENDING_MSG}; evicted before: {PREEMPTED_MSG}"
    )  # why it left, not only why it waits


def test_a_workload_kueue_has_not_looked_at_is_undecided() -> None:
    assert not queue_status(workload()).decided
    junk = {"metadata": None, "status": {"conditions": [None, "x", {"type": None}], "schedulingStats": {}}}
    assert not queue_status(junk).decided  # never raises on a shape it does not know


def test_workload_of_prefers_the_newest_live_one() -> None:
    old, new = (
        dict(PENDING, metadata={**PENDING["metadata"]}),
        dict(ADMITTED, metadata={**ADMITTED["metadata"]}),
    )
    new["metadata"]["creationTimestamp"] = "2026-11-29T10:09:00Z"
    status = workload_of([old, new])
    assert status is not None and status.admitted
    assert workload_of([]) is None


def trainjob(status: dict[str, Any], *, suspend: bool = True, budget: int | None = None) -> dict[str, Any]:
    annotations = {"trainflow.dev/max-queue-seconds": str(budget)} if budget else {}
    return {
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": "uid-job",
            "creationTimestamp": T0,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
            "annotations": annotations,
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
        "status": status,
    }


SUSPENDED = {"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended")]}
RESUMED = {
    "conditions": [cond("Suspended", "False", "Resumed", at="2026-11-29T10:03:00Z")],
    "jobsStatus": [{"name": "node", "active": 2, "ready": 2}],
}
T0_EPOCH = datetime(2026, 11, 29, 10, tzinfo=UTC).timestamp()


def test_a_queued_result_carries_kueues_reason_and_time_queued() -> None:
    now = datetime(2026, 11, 29, 10, 10, tzinfo=UTC)
    result = with_queue(result_from_trainjob(trainjob(SUSPENDED)), queue_status(PENDING), now)
    assert result.state is JobState.QUEUED and result.reason == "Pending"
    assert result.message == f"waiting in LocalQueue team-a: {PENDING_MSG}"
    assert result.queued_seconds == 600.0 and result.queue == "team-a"
    bare = with_queue(result_from_trainjob(trainjob(SUSPENDED)), None, now)
    assert bare.message == "waiting in LocalQueue team-a: Kueue has no Workload for it yet"
    undecided = with_queue(result_from_trainjob(trainjob(SUSPENDED)), queue_status(workload()), now)
    assert undecided.message == "waiting in LocalQueue team-a: Kueue has not considered its Workload yet"


def test_queued_time_excludes_the_time_admitted_before_a_preemption() -> None:
    """Created 10:00, ran 4 min before a preemption, latest start 10:10: queued 6 min in all."""
    resumed = trainjob(
        {**RESUMED, "conditions": [cond("Suspended", "False", "Resumed", at="2026-11-29T10:10:00Z")]}
    )
    result = with_queue(result_from_trainjob(resumed), queue_status(PREEMPTED))
    assert result.state is JobState.RUNNING and result.preemptions == 1 and result.queued_seconds == 360.0
    assert (
        result_from_trainjob(trainjob(RESUMED, suspend=False)).queued_seconds == 180.0
    )  # without Kueue's word


def test_a_run_budget_failure_names_the_budget() -> None:
    failed = trainjob(
        {"conditions": [cond("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its deadline")]}
    )
    failed["spec"]["activeDeadlineSeconds"] = 600
    message = result_from_trainjob(failed).message or ""
    assert "run budget, deadline_seconds=600" in message and "exceeded its deadline" in message


def test_waiter_asks_kueue_when_queued_then_backs_off_until_kueue_decides() -> None:
    now = T0_EPOCH + 5
    waiter = Waiter(deadline=now + 3600, queue_reads=True)
    out = observe(waiter, trainjob(SUSPENDED), now)
    assert out.check_queue and out.result is not None and out.result.state is JobState.QUEUED
    assert not observe(waiter, None, now).check_queue  # one read at a time
    observe_queue(waiter, None, now)  # no Workload yet
    assert waiter.queue_due == now + QUEUE_FIRST_LOOK
    assert waiter.next_check(now, 300) == pytest.approx(QUEUE_FIRST_LOOK)
    assert observe(waiter, None, now + 1).check_queue
    observe_queue(waiter, queue_status(workload()), now + 1)  # Kueue has not looked at it yet
    assert waiter.queue_due == now + 1 + 2 * QUEUE_FIRST_LOOK
    assert observe(waiter, None, now + 3).check_queue
    told = observe_queue(waiter, queue_status(PENDING), now + 3)
    assert told.changed and told.result is not None and told.result.reason == "Pending"
    assert waiter.queue_due is None  # decided; a waiter on a shared watch asks again when the job changes
    assert not observe(waiter, None, now + 600).check_queue
    assert observe(
        waiter, trainjob(SUSPENDED, budget=None) | {"status": dict(SUSPENDED)}, now + 601
    ).check_queue


def test_a_waiter_of_its_own_rereads_a_queued_jobs_workload() -> None:
    now = T0_EPOCH + 5
    waiter = Waiter(deadline=now + 3600, queue_reads=True, queue_recheck=30.0)
    assert observe(waiter, trainjob(SUSPENDED), now).check_queue
    observe_queue(waiter, queue_status(PENDING), now)
    assert waiter.next_check(now, 300) == pytest.approx(30.0)
    assert not observe(waiter, None, now + 29).check_queue
    assert observe(waiter, None, now + 30).check_queue


def test_running_jobs_and_jobs_kueue_does_not_manage_are_not_read() -> None:
    now = T0_EPOCH + 5
    waiter = Waiter(deadline=now + 3600, queue_reads=True)
    assert not observe(waiter, trainjob(RESUMED, suspend=False), now).check_queue
    plain = trainjob(SUSPENDED)
    plain["metadata"]["labels"] = {}
    assert not observe(Waiter(deadline=now + 3600, queue_reads=True), plain, now).check_queue


def test_preemption_is_not_failure() -> None:
    """Running, then suspended by Kueue, then running again: the wait goes on, and the preemption is counted."""
    now = T0_EPOCH + 5
    waiter = Waiter(deadline=now + 3600, queue_reads=True)
    states = []
    for step, status in enumerate((RESUMED, SUSPENDED, RESUMED)):
        out = observe(waiter, trainjob(status, suspend=status is SUSPENDED), now + step)
        assert not (out.done or out.timed_out or out.budget_expired)
        if out.check_queue:
            observe_queue(waiter, queue_status(PREEMPTED), now + step)
        states.append(out.result.state if out.result else None)
    assert states == [JobState.RUNNING, JobState.QUEUED, JobState.RUNNING]
    assert waiter.result is not None and waiter.result.preemptions == 1


def test_queue_budget_expires_for_a_job_never_admitted() -> None:
    start = T0_EPOCH
    waiter = Waiter(deadline=start + 3600, queue_reads=True)
    job = trainjob(SUSPENDED, budget=120)
    assert not observe(waiter, job, start + 60).budget_expired
    observe_queue(waiter, queue_status(PENDING), start + 60)
    assert waiter.next_check(start + 60, 300) == pytest.approx(60.0)
    out = observe(waiter, None, start + 120)
    assert out.budget_expired and out.result is not None
    assert (out.result.state, out.result.reason) == (JobState.FAILED, QUEUE_BUDGET_EXPIRED)
    assert out.result.message == (
        f"not admitted by LocalQueue team-a within its queue budget, max_queue_seconds=120 "
        f"(waiting in LocalQueue team-a: {PENDING_MSG})"
    )


def test_queue_budget_counts_from_the_latest_suspension_and_stops_at_admission() -> None:
    preempted_at = T0_EPOCH + 3600
    again = {"conditions": [cond("Suspended", "True", "Suspended", at="2026-11-29T11:00:00Z")]}
    waiter = Waiter(deadline=None, queue_reads=True)
    assert not observe(waiter, trainjob(again, budget=120), preempted_at + 119).budget_expired
    assert observe(waiter, None, preempted_at + 120).budget_expired
    admitted = Waiter(deadline=None)  # spec.suspend cleared: admitted, the condition lags behind
    assert not observe(
        admitted, trainjob(again, suspend=False, budget=120), preempted_at + 500
    ).budget_expired


# --- both drivers, over HTTP to the loopback fake API server --------------------------------------------------


@pytest.fixture
def fake() -> Any:
    server = FakeApiServer()
    server.add("job")
    server.put_workload(PENDING)
    yield server
    server.close()


def queued(fake: FakeApiServer, budget: int) -> None:
    """The job as Kueue leaves it, suspended just now (after the client libraries loaded: not in the budget)."""
    fake.set_object(
        "job",
        labels={"kueue.x-k8s.io/queue-name": "team-a"},
        annotations={"trainflow.dev/max-queue-seconds": str(budget)},
        spec={"suspend": True},
        status={"conditions": [cond("Suspended", "True", "Suspended", at=_iso(time.time()))]},
    )


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _expect_budget_failure(ending: Any, updates: list[Any]) -> None:
    assert isinstance(ending, TrainJobFailed), ending
    assert ending.result.reason == QUEUE_BUDGET_EXPIRED and "max_queue_seconds=3" in str(ending)
    assert PENDING_MSG in str(ending)  # Kueue's word, read from the Workload
    assert [u.reason for u in updates if u.state is JobState.QUEUED][-1] == "Pending"


def test_sync_wait_shows_kueues_reason_and_ends_at_the_queue_budget(fake: FakeApiServer) -> None:
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))
    backend.get("job")  # loads the client library
    queued(fake, 3)
    updates: list[Any] = []
    t0 = time.monotonic()
    with pytest.raises(TrainJobFailed) as failed:
        backend.wait("job", timeout=HANG, on_update=updates.append)
    assert time.monotonic() - t0 < 15
    _expect_budget_failure(failed.value, updates)
    # a waiter of its own reads its job's Workload (by Kueue's job-uid label)
    assert fake.workload_lists and set(fake.workload_lists) == {"kueue.x-k8s.io/job-uid=uid-job"}
    assert fake.workload_watches == 0


def test_async_wait_shows_kueues_reason_and_ends_at_the_queue_budget(fake: FakeApiServer) -> None:
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))
    updates: list[Any] = []

    async def wait() -> Any:
        await asyncio.to_thread(importlib.import_module, "aiohttp")
        queued(fake, 3)
        try:
            return await backend.wait_async("job", timeout=HANG, on_update=updates.append)
        except (TrainJobFailed, WaitTimeout) as exc:
            return exc

    _expect_budget_failure(asyncio.run(wait()), updates)
    # waiters sharing the namespace watch learn it from one Workload watch of the namespace, not a read each
    assert fake.workload_watches >= 1 and "kueue.x-k8s.io/job-uid=uid-job" not in fake.workload_lists


def test_a_wait_timeout_of_a_queued_job_says_why_it_waits(fake: FakeApiServer) -> None:
    backend = KubernetesBackend(config_dict=kubeconfig(fake.url))
    queued(fake, 3600)
    with pytest.raises(WaitTimeout) as timeout:
        backend.wait("job", timeout=2)
    assert f"still Queued (waiting in LocalQueue team-a: {PENDING_MSG})" in str(timeout.value)


def test_status_of_a_queued_job_reads_its_workload(fake: FakeApiServer) -> None:
    queued(fake, 3600)
    result = KubernetesBackend(config_dict=kubeconfig(fake.url)).get("job")
    assert result.reason == "Pending" and PENDING_MSG in (result.message or "")
    created = datetime(2026, 11, 29, 10, tzinfo=UTC)  # queued since it was created
    waited = (datetime.now(UTC) - created).total_seconds()
    assert result.queued_seconds == pytest.approx(waited, abs=60)


def test_a_waiter_arriving_after_the_budget_asks_kueue_before_failing() -> None:
    """A retry that reattaches to a job already over its budget still names Kueue's reason."""
    late = T0_EPOCH + 3600
    waiter = Waiter(deadline=None, queue_reads=True)
    first = observe(waiter, trainjob(SUSPENDED, budget=120), late)
    assert first.check_queue and not first.budget_expired
    observe_queue(waiter, queue_status(PENDING), late)
    assert waiter.next_check(late, 300) == 0
    out = observe(waiter, None, late)
    assert out.budget_expired and out.result is not None and PENDING_MSG in (out.result.message or "")


def test_a_workload_being_evicted_reads_as_evicted_not_admitted() -> None:
    """Kueue keeps Admitted=True until the preempted job's pods stop (seen on the testbed); the eviction speaks."""
    evicting = workload(
        cond("QuotaReserved", "True", "QuotaReserved"),
        cond("Admitted", "True", "Admitted"),
        cond("Evicted", "True", "Preempted", PREEMPTED_MSG, "2026-11-29T10:05:00Z"),
        admission={"clusterQueue": "cq"},
    )
    q = queue_status(evicting)
    assert (q.reason, q.message, q.admitted) == ("Preempted", PREEMPTED_MSG, True)
    result = with_queue(
        result_from_trainjob(trainjob(SUSPENDED)), q, datetime(2026, 11, 29, 10, 6, tzinfo=UTC)
    )
    assert result.message == f"waiting in LocalQueue team-a (ClusterQueue cq): {PREEMPTED_MSG}"


class KueueApi:
    """Stands in for KubeApi in a test of check_scheduling alone: answers Kueue's paths from a dict."""

    def __init__(
        self, objects: dict[str, list[str]], served: tuple[str, ...] = ("v1beta2", "v1beta1")
    ) -> None:
        self.objects, self.served, self.paths = objects, served, []

    def run(self, call: Any) -> Any:
        from trainflow.core.errors import NotFound

        self.paths.append(call.path)
        parts = call.path.strip("/").split("/")  # apis, group, version, [namespaces, ns], plural, [name]
        version, rest = parts[2], parts[3:]
        if rest[0] == "namespaces":
            rest = rest[2:]
        plural, name = rest[0], rest[1] if len(rest) > 1 else None
        if version not in self.served:
            raise NotFound(f"{plural} not found")
        names = self.objects.get(plural, [])
        if name is None:
            return {"items": [{"metadata": {"name": n}} for n in names]}
        if name not in names:
            raise NotFound(f"{plural}/{name} not found")
        return {"metadata": {"name": name}}


def test_scheduling_check_names_the_field_and_what_exists() -> None:
    from trainflow.core.errors import InvalidRequest
    from trainflow.core.kube.kueue_reads import check_scheduling

    api = KueueApi({"localqueues": ["team-a", "team-b"], "workloadpriorityclasses": ["high", "low"]})
    check_scheduling(api, "ns", "team-a", "high")  # both exist
    with pytest.raises(InvalidRequest) as bad:
        check_scheduling(api, "ns", "team-c", "urgent")
    assert bad.value.fields == ["queue", "priority_class"]
    text = str(bad.value)
    assert "LocalQueue 'team-c' not found in namespace 'ns' (fix: use one of: team-a, team-b)" in text
    assert "WorkloadPriorityClass 'urgent' not found (fix: use one of: high, low)" in text
    old = KueueApi({"localqueues": ["team-a"]}, served=("v1beta1",))  # a Kueue before v1beta2
    check_scheduling(old, "ns", "team-a", None)
    with pytest.raises(InvalidRequest, match="Kueue is not installed on this cluster"):
        check_scheduling(KueueApi({}, served=()), "ns", "team-a", None)
