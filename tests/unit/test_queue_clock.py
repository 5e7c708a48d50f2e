"""The queue budget's clock (``kueue.queue_clock``) over the orders in which a waiter can learn of a suspension:
Kueue's ``spec.suspend`` before the Trainer's condition, the condition before Kueue's word, a preemption before
any pod exists, a resume. The rule is pure; the waiter tests feed the same events through ``observe``.

Each wait starts at the latest suspension the Trainer or Kueue times, never at a time from before an admission:
so never at the creation of a job that was admitted.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainflow.core.kueue import QueueStatus, Sightings, queue_clock, queue_status
from trainflow.core.observe import QUEUE_BUDGET_EXPIRED, Waiter, observe, observe_queue
from trainflow.core.result import JobState

CREATED = datetime(2026, 11, 29, 10, tzinfo=UTC)
BUDGET = 600


def at(minutes: float) -> datetime:
    return CREATED + timedelta(minutes=minutes)


def iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def suspended(status: str, when: datetime) -> dict[str, Any]:
    """The Trainer's condition: True (reason Suspended) or False (reason Resumed), as Trainer v2.3.0 writes it."""
    reason = "Suspended" if status == "True" else "Resumed"
    return {"type": "Suspended", "status": status, "reason": reason, "lastTransitionTime": iso(when)}


def trainjob(
    *conditions: dict[str, Any], suspend: bool, active: int = 0, ran: bool = False
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if ran or active:  # the Trainer's count of the JobSet's pods (it writes the entry once the JobSet exists)
        status["jobsStatus"] = [
            {"name": "node", "active": active, "ready": active, "succeeded": 0, "failed": 0}
        ]
    return {
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": "uid-job",
            "creationTimestamp": iso(CREATED),
            "labels": {"kueue.x-k8s.io/queue-name": "team"},
            "annotations": {"trainflow.dev/max-queue-seconds": str(BUDGET)},
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
        "status": status,
    }


def wl_cond(kind: str, status: str, reason: str, when: datetime) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": reason,
        "lastTransitionTime": iso(when),
    }


def workload(*conditions: dict[str, Any], evictions: int = 0, **status: Any) -> QueueStatus:
    stats = {"evictions": [{"reason": "Preempted", "count": evictions}]} if evictions else {}
    return queue_status(
        {
            "metadata": {"name": "trainjob-job-1"},
            "spec": {"queueName": "team"},
            "status": {"conditions": list(conditions), "schedulingStats": stats, **status},
        }
    )


def pending(when: datetime) -> QueueStatus:
    return workload(wl_cond("QuotaReserved", "False", "Pending", when))


def admitted(when: datetime) -> QueueStatus:
    return workload(
        wl_cond("QuotaReserved", "True", "QuotaReserved", when),
        wl_cond("Admitted", "True", "Admitted", when),
        admission={"clusterQueue": "cq"},
    )


def evicting(admitted_at: datetime, evicted_at: datetime) -> QueueStatus:
    """Kueue preempting it: Evicted=True, still Admitted until its pods stop (as on the testbed)."""
    return workload(
        wl_cond("QuotaReserved", "True", "QuotaReserved", admitted_at),
        wl_cond("Admitted", "True", "Admitted", admitted_at),
        wl_cond("Evicted", "True", "Preempted", evicted_at),
        admission={"clusterQueue": "cq"},
        evictions=1,
    )


def requeued(evicted_at: datetime) -> QueueStatus:
    """Kueue after the preempted pods stopped: quota released, still Evicted until it admits the job again."""
    return workload(
        wl_cond("QuotaReserved", "False", "Pending", evicted_at + timedelta(seconds=2)),
        wl_cond("Admitted", "False", "NoReservation", evicted_at + timedelta(seconds=2)),
        wl_cond("Evicted", "True", "Preempted", evicted_at),
        evictions=1,
        accumulatedPastExecutionTimeSeconds=3000,
    )


# --- the rule, pure ---------------------------------------------------------------------------------------------


def test_a_job_never_admitted_waits_from_its_creation_then_from_the_trainers_condition() -> None:
    assert queue_clock(trainjob(suspend=True)) == CREATED  # Kueue's webhook created it suspended
    assert queue_clock(trainjob(suspend=True), pending(at(0.1))) == CREATED
    condition = suspended("True", CREATED + timedelta(seconds=1))
    assert queue_clock(trainjob(condition, suspend=True), pending(at(0.1))) == CREATED + timedelta(seconds=1)


def test_an_admitted_job_is_not_waiting_whatever_the_trainers_condition_still_says() -> None:
    """Resumed: Kueue cleared ``spec.suspend``; the Trainer's Suspended=True lags behind it."""
    assert queue_clock(trainjob(suspended("True", CREATED), suspend=False), admitted(at(9))) is None
    assert queue_clock(trainjob(suspended("False", at(9)), suspend=False, active=2)) is None


def test_suspend_before_the_trainers_condition_is_queued_not_over_budget() -> None:
    """The issue's order: a job created an hour ago ran 50 min; Kueue sets ``spec.suspend`` and the watch brings
    it before the Trainer turns its condition (still Resumed) and before any word from Kueue; no pod is active."""
    job = trainjob(suspended("False", at(10)), suspend=True, ran=True)
    first_seen = at(60) + timedelta(seconds=0.3)
    assert queue_clock(job, None, Sightings(suspended_at=first_seen)) == first_seen  # never the creation
    assert queue_clock(job, None, Sightings(admitted_at=at(59.9), suspended_at=first_seen)) == first_seen
    assert queue_clock(job, evicting(at(10), at(60))) == at(60)  # Kueue's word: when it began to evict
    assert queue_clock(job, requeued(at(60))) == at(60)
    # with neither a time nor a sight of its own, nothing starts the clock: never the creation
    assert queue_clock(job) is None
    # then the Trainer says so
    assert queue_clock(
        trainjob(suspended("True", at(60) + timedelta(seconds=1)), suspend=True, ran=True)
    ) == at(60) + timedelta(seconds=1)


def test_a_suspension_the_trainer_never_saw_admitted_is_timed_by_kueue() -> None:
    """Kueue admitted the job and suspended it again before the Trainer's first reconcile: no Suspended condition
    ever, so only Kueue (or the waiter) says it was admitted."""
    job = trainjob(suspend=True)
    assert queue_clock(job, evicting(at(9), at(9))) == at(9)
    assert queue_clock(job, requeued(at(9))) == at(9)
    assert queue_clock(job, None, Sightings(admitted_at=at(9), suspended_at=at(9.1))) == at(9.1)


def test_preempted_before_pods_exist_counts_from_the_preemption() -> None:
    """Created 10:00 and queued 9 min (the Trainer's Suspended=True since 10:00:01), admitted at 10:09 and
    preempted in the same second, before any pod and before the Trainer turned its condition: the wait began
    again at 10:09, not at 10:00:01."""
    job = trainjob(suspended("True", CREATED + timedelta(seconds=1)), suspend=True)
    assert queue_clock(job, evicting(at(9), at(9))) == at(9)  # a tie: evicted right after its admission
    assert queue_clock(job, requeued(at(9))) == at(9)
    # Kueue's word not read, but this waiter saw the job admitted: its first sight of the suspension since
    seen = Sightings(admitted_at=at(9) + timedelta(seconds=0.2), suspended_at=at(9) + timedelta(seconds=0.9))
    assert queue_clock(job, None, seen) == at(9) + timedelta(seconds=0.9)
    # nothing anyone saw says it was ever admitted: the Trainer's time stands (as it would for a job never admitted)
    assert queue_clock(job) == CREATED + timedelta(seconds=1)


def test_the_trainers_condition_before_kueues_word_counts_from_the_condition() -> None:
    """The TrainJob watch brings Suspended=True (the Trainer's) while the Workload read still shows the admission."""
    job = trainjob(suspended("True", at(60)), suspend=True, ran=True)
    assert queue_clock(job, admitted(at(10))) == at(60)
    assert queue_clock(job, evicting(at(10), at(59.99))) == at(60)


def test_kueues_admission_newer_than_every_suspension_means_not_waiting() -> None:
    """The Workload says admitted after the only suspension anyone timed; the TrainJob's copy is older."""
    job = trainjob(suspended("True", CREATED + timedelta(seconds=1)), suspend=True)
    assert queue_clock(job, admitted(at(9)), Sightings(suspended_at=CREATED + timedelta(seconds=2))) is None


def test_times_from_an_earlier_wait_never_start_this_one() -> None:
    """A second preemption: Kueue's Workload still shows the first eviction (10:20), the Trainer resumed at 10:30;
    Kueue suspends it again at 11:00 and nobody has timed it yet."""
    job = trainjob(suspended("False", at(30)), suspend=True, ran=True)
    seen = Sightings(admitted_at=at(59), suspended_at=at(60))
    assert queue_clock(job, requeued(at(20)), seen) == at(60)
    assert queue_clock(job, requeued(at(20)), Sightings(suspended_at=at(25))) == at(30)  # a stale sight too


# --- the waiter: the same events in every order, through observe ------------------------------------------------

T_ADMIT, T_PREEMPT, T_TRAINER = at(10), at(60), at(60) + timedelta(seconds=1)
NOW = T_PREEMPT.timestamp()  # the waiter's clock: the events arrive from 1 s after the preemption
RUNNING = trainjob(suspended("False", T_ADMIT), suspend=False, active=2)
# the TrainJob after Kueue suspended it: still Resumed with pods, then pods gone, then the Trainer's condition
SUSPENDED_WITH_PODS = trainjob(suspended("False", T_ADMIT), suspend=True, active=2)
SUSPENDED_NO_PODS = trainjob(suspended("False", T_ADMIT), suspend=True, ran=True)
CONFIRMED = trainjob(suspended("True", T_TRAINER), suspend=True, ran=True)
CONFIRMED_WITH_PODS = trainjob(suspended("True", T_TRAINER), suspend=True, active=2)
EVICTING, REQUEUED = evicting(T_ADMIT, T_PREEMPT), requeued(T_PREEMPT)

# the TrainJob versions in the orders the Trainer and the JobSet can write them
JOB_ORDERS = {
    "suspend, pods gone, condition": (SUSPENDED_WITH_PODS, SUSPENDED_NO_PODS, CONFIRMED),
    "suspend before pods exist, condition": (SUSPENDED_NO_PODS, CONFIRMED),
    "suspend, condition, pods gone": (SUSPENDED_WITH_PODS, CONFIRMED_WITH_PODS, CONFIRMED),
    "condition only (suspend missed)": (CONFIRMED,),
}


def _interleavings(jobs: tuple[Any, ...], kueue: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every merge of the two sequences, each kept in its own order."""
    n = len(jobs) + len(kueue)
    out = []
    for places in itertools.combinations(range(n), len(kueue)):
        it_j, it_k, seq = iter(jobs), iter(kueue), []
        for i in range(n):
            seq.append(("kueue", next(it_k)) if i in places else ("job", next(it_j)))
        out.append(tuple(seq))
    return out


CASES = [
    (name, seq)
    for name, jobs in JOB_ORDERS.items()
    for kueue in ((), (EVICTING,), (EVICTING, REQUEUED), (REQUEUED,))
    for seq in _interleavings(jobs, kueue)
]


@pytest.mark.parametrize(("name", "events"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_a_preempted_waiter_never_spends_its_budget_on_the_time_before(name: str, events: Any) -> None:
    """A job created at 10:00, admitted at 10:10, preempted at 11:00 with a 600 s queue budget, waited on since it
    ran: whatever the order the TrainJob's versions and Kueue's word arrive in, the wait is Queued (never
    QueueBudgetExceeded) until 600 s after the preemption, and over budget within 600 s of the waiter's last
    look (a preemption nobody times counts from the waiter's own first sight of it)."""
    waiter = Waiter(deadline=None, queue_reads=True)
    assert observe(waiter, RUNNING, NOW - 60).result.state is JobState.RUNNING  # type: ignore[union-attr]
    observe_queue(waiter, admitted(T_ADMIT), NOW - 60)
    now = NOW + 1
    for kind, item in events:
        now += 0.5
        out = observe(waiter, item, now) if kind == "job" else observe_queue(waiter, item, now)
        assert not out.budget_expired, (name, kind)
        assert out.result is not None and out.result.state is not JobState.FAILED
        expires = waiter.queue_budget_expires()  # between two events: what a driver would wake for
        assert expires is None or expires >= NOW + BUDGET, (name, kind, expires - NOW)
        assert not observe(waiter, None, now + 0.1).budget_expired, (name, kind)
    assert waiter.result is not None and waiter.result.state in (JobState.QUEUED, JobState.RUNNING)
    if waiter.result.state is JobState.RUNNING:  # the last version still counts active pods
        return
    expires = waiter.queue_budget_expires()
    assert expires is not None and NOW + BUDGET <= expires <= now + BUDGET, (name, expires - NOW)
    for t in (NOW + 1, NOW + BUDGET - 1):
        assert not observe(waiter, None, t).budget_expired, name
    out = observe(waiter, None, now + BUDGET)
    assert out.budget_expired and out.result is not None and out.result.reason == QUEUE_BUDGET_EXPIRED, name


def test_the_issues_order_before_the_fix_would_have_spent_the_budget_at_once() -> None:
    """The order the issue reports, step by step: an hour-old job, ``spec.suspend`` without the Trainer's word and
    without active pods; the wait is Queued and its budget runs from that moment (not from 10:00)."""
    waiter = Waiter(deadline=None, queue_reads=True)
    observe(waiter, RUNNING, NOW - 60)
    out = observe(waiter, SUSPENDED_NO_PODS, NOW)
    assert out.result is not None and out.result.state is JobState.QUEUED and not out.budget_expired
    assert out.check_queue  # Kueue's word is asked for before any verdict
    observe_queue(waiter, None, NOW)  # no word yet
    assert not observe(waiter, None, NOW + 1).budget_expired
    assert waiter.queue_budget_expires() == pytest.approx(NOW + BUDGET)
