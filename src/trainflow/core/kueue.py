"""What Kueue says about a TrainJob, read from its Workload, and how that reads into a result. Pure, no I/O.

Kueue integrates TrainJobs through ``spec.suspend``: its webhook creates them suspended, it admits them by
clearing it and preempts them by setting it again. The TrainJob then only says Suspended; why it waits, and
how often it was preempted, live in its Workload (``kueue.x-k8s.io``, labelled ``kueue.x-k8s.io/job-uid``):

* the verdict: ``Evicted=True`` while Kueue evicts it (``Preempted``: "Preempted to accommodate a workload ...
  due to prioritization in the ClusterQueue"; it stays ``Admitted`` until its pods stop), ``QuotaReserved=False``
  with Kueue's reason (``Pending``: "couldn't assign flavors to pod set
  node: insufficient unused quota for cpu in flavor default, 4 more needed"; ``Inadmissible``: "LocalQueue x
  doesn't exist", "ClusterQueue y is inactive"), or ``Admitted=True`` (with its ClusterQueue);
* ``status.schedulingStats.evictions``: Kueue's own count of evictions by reason, so preemptions survive any
  waiter's restart;
* ``status.accumulatedPastExecutionTimeSeconds``: time admitted in earlier admit-evict cycles, so the time a
  job spent queued is its life up to its latest start minus that;
* the transition times of ``Admitted=True`` and ``Evicted=True``: when Kueue last admitted the job and when it
  began to evict it (Kueue turns ``Evicted`` False at the next admission): with the Trainer's own
  ``Suspended`` condition, they time each wait for admission (``queue_clock``: what the queue budget counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainflow.core.naming import GROUP as TRAINER_GROUP
from trainflow.core.naming import QUEUE_LABEL
from trainflow.core.result import JobState, TrainJobResult, parse_time

INTEGRATION = f"{TRAINER_GROUP}/trainjob"  # the Kueue integration that manages TrainJobs
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # Kueue labels a job's Workload with the job's uid
GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # v1beta2 since Kueue 0.15 (stored); v1beta1 on older releases
PREEMPTED = "Preempted"
ADMITTED = "Admitted"
MAX_MESSAGE = 600


@dataclass(frozen=True)
class QueueStatus:
    """Kueue's view of one job: its verdict (``reason``/``message``), admission, preemptions."""

    workload: str
    local_queue: str | None = None
    cluster_queue: str | None = None
    admitted: bool = False
    finished: bool = False
    reason: str | None = None  # None: Kueue has not looked at the Workload yet
    message: str | None = None
    preemptions: int = 0
    evictions: int = 0
    admitted_before: float = 0.0  # seconds admitted in earlier admit-evict cycles
    admitted_at: datetime | None = None  # while Admitted=True: when Kueue admitted it
    evicted_at: datetime | None = None  # while Evicted=True: when Kueue began to evict it
    was_admitted: bool = False  # Kueue admitted it at some time (now, or before an eviction)

    @property
    def decided(self) -> bool:
        """Kueue has said something about the Workload (admitted it, or why not)."""
        return self.admitted or self.finished or self.reason is not None


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {
        str(c.get("type")): c
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type")
    }


def _is(cond: Mapping[str, Any] | None, value: str) -> bool:
    return cond is not None and str(cond.get("status")) == value


def _short(text: Any) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= MAX_MESSAGE else s[: MAX_MESSAGE - 3] + "..."


def queue_status(workload: Mapping[str, Any]) -> QueueStatus:
    """Read a Workload (a dict as the API returns it, either version) into a QueueStatus; tolerant of unknowns."""
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    conds = _conditions(status)
    admission = status.get("admission") or {}
    evictions = [
        e for e in (status.get("schedulingStats") or {}).get("evictions") or [] if isinstance(e, Mapping)
    ]
    admitted = _is(conds.get("Admitted"), "True")
    finished = _is(conds.get("Finished"), "True")
    reason = message = None
    evicted = conds.get("Evicted")
    if finished:
        reason, message = "Finished", conds["Finished"].get("message")
    elif admitted and evicted is not None and _is(evicted, "True"):  # Admitted until its pods have stopped
        reason, message = evicted.get("reason"), evicted.get("message")
    elif admitted:
        reason, message = ADMITTED, f"admitted by ClusterQueue {admission.get('clusterQueue')}"
    else:  # the newest of: why it has no quota, why it was evicted, why it is not requeued yet
        why: list[Mapping[str, Any]] = []
        for kind, value in (("QuotaReserved", "False"), ("Evicted", "True"), ("Requeued", "False")):
            cond = conds.get(kind)
            if cond is not None and _is(cond, value):
                why.append(cond)
        if why:
            newest = max(why, key=lambda c: str(c.get("lastTransitionTime") or ""))
            reason, message = newest.get("reason"), newest.get("message")
            gone = evicted.get("message") if evicted is not None and _is(evicted, "True") else None
            if gone and gone not in str(message or ""):
                # still evicted (Kueue clears it at the next admission): why it left the queue's quota is news
                # as much as why it waits now, which Kueue often writes in the same second
                message = f"{message or reason}; evicted before: {gone}"
    past = status.get("accumulatedPastExecutionTimeSeconds")
    evicted_count = sum(int(e.get("count") or 0) for e in evictions)
    before = float(past) if isinstance(past, int | float) else 0.0
    return QueueStatus(
        workload=str(meta.get("name", "")),
        local_queue=spec.get("queueName"),
        cluster_queue=admission.get("clusterQueue"),
        admitted=admitted,
        finished=finished,
        reason=str(reason) if reason else None,
        message=_short(message) if message else None,
        preemptions=sum(int(e.get("count") or 0) for e in evictions if e.get("reason") == PREEMPTED),
        evictions=evicted_count,
        admitted_before=before,
        admitted_at=_since(conds.get("Admitted"), "True"),
        evicted_at=_since(evicted, "True"),
        # Kueue writes Admitted only once it admits, and Evicted only once it evicts an admitted job
        was_admitted=admitted
        or "Admitted" in conds
        or evicted is not None
        or evicted_count > 0
        or before > 0,
    )


def _since(cond: Mapping[str, Any] | None, value: str) -> datetime | None:
    """When the condition turned ``value``, while it has that value."""
    return parse_time(cond.get("lastTransitionTime")) if cond is not None and _is(cond, value) else None


def workload_of(items: list[Mapping[str, Any]]) -> QueueStatus | None:
    """The job's Workload among those labelled with its uid (the newest, should Kueue have replaced one)."""
    live = [w for w in items if not (w.get("metadata") or {}).get("deletionTimestamp")] or items
    if not live:
        return None
    return queue_status(
        max(live, key=lambda w: str((w.get("metadata") or {}).get("creationTimestamp") or ""))
    )


def with_queue(
    result: TrainJobResult, queue: QueueStatus | None, now: datetime | None = None, *, looked: bool = True
) -> TrainJobResult:
    """The result with what Kueue says: a queued job's reason and message are Kueue's; preemptions; queue time.

    ``now`` (aware) lets a job still queued count the time it has waited so far; ``looked`` False: ``queue`` is
    None because nobody has read the Workload yet (not because there is none).
    """
    lq = result.queue or (queue.local_queue if queue else None)
    changes: dict[str, Any] = {}
    if queue is not None:
        changes["preemptions"] = queue.preemptions
        changes["queue"] = lq
    queued = _queued_seconds(result, queue, now)
    if queued is not None:
        changes["queued_seconds"] = queued
    if result.state is JobState.QUEUED and lq:
        where = f"LocalQueue {lq}" + (
            f" (ClusterQueue {queue.cluster_queue})" if queue and queue.cluster_queue else ""
        )
        if queue is None:
            changes["message"] = f"waiting in {where}" + (
                ": Kueue has no Workload for it yet" if looked else ""
            )
        elif queue.reason == ADMITTED:
            changes["message"] = f"admitted in {where}; starting"
        elif queue.reason:
            changes["reason"] = queue.reason
            changes["message"] = f"waiting in {where}: {queue.message or queue.reason}"
        else:  # Kueue made the Workload but its scheduler has not reached it (seconds under load)
            changes["message"] = f"waiting in {where}: Kueue has not considered its Workload yet"
    return result.replace(**changes) if changes else result


def _queued_seconds(result: TrainJobResult, queue: QueueStatus | None, now: datetime | None) -> float | None:
    """Creation to the latest start (or to ``now`` while queued), less the time admitted in between."""
    created = result.created_at
    if created is None:
        return result.queued_seconds
    before = queue.admitted_before if queue is not None else 0.0
    if result.state is JobState.QUEUED:
        if now is None:
            return result.queued_seconds
        return max((now - created).total_seconds() - before, 0.0)
    if result.queued_seconds is None or result.started_at is None:
        return result.queued_seconds
    return max((result.started_at - created).total_seconds() - before, 0.0)


def managed(obj: Mapping[str, Any]) -> bool:
    """A TrainJob Kueue manages (it names a LocalQueue)."""
    return bool(((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL))


@dataclass(frozen=True)
class Sightings:
    """What one waiter saw of a job itself, on its own clock: the latest time it saw the job admitted
    (``spec.suspend`` clear), the first time it saw it suspended since, and whether it saw its pods run."""

    admitted_at: datetime | None = None
    suspended_at: datetime | None = None
    ran: bool = False


NOT_SEEN = Sightings()


def queue_clock(
    obj: Mapping[str, Any], queue: QueueStatus | None = None, seen: Sightings = NOT_SEEN
) -> datetime | None:
    """When the job's current wait for admission began: what its queue budget counts from (None: not waiting).

    A wait begins when the job is suspended: at its creation (Kueue's webhook creates it suspended), and at each
    preemption. Its start is the latest of the times the Trainer and Kueue give a suspension (the Trainer's
    ``Suspended=True``, Kueue's ``Evicted=True``; the creation only while nothing says the job was ever
    admitted), ignoring any from before the latest admission anyone saw (the Trainer's ``Suspended=False``,
    Kueue's ``Admitted=True``, this waiter's own sight of ``spec.suspend`` clear): such a time belongs to an
    earlier wait. With none left, Kueue suspended the job and neither has said when yet (the Trainer writes
    its condition after ``spec.suspend`` reaches the watch): the clock starts when this waiter first saw it
    suspended (never before the latest admission), unless Kueue's word is that it is admitted.
    """
    if not (obj.get("spec") or {}).get("suspend"):
        return None  # admitted (the Trainer's condition follows)
    status = obj.get("status") or {}
    trainer = _conditions(status).get("Suspended")  # the Trainer's: True "Suspended", False "Resumed"
    # when a wait for admission began, and when the job was admitted, as each source timed it
    starts = [_since(trainer, "True"), queue.evicted_at if queue else None]
    admissions = [_since(trainer, "False"), queue.admitted_at if queue else None, seen.admitted_at]
    ever_admitted = (
        _is(trainer, "False")
        or any(admissions)
        or seen.ran
        or _pods_ran(status)
        or (queue is not None and queue.was_admitted)
    )
    if not ever_admitted:
        starts.append(parse_time((obj.get("metadata") or {}).get("creationTimestamp")))
    admitted = max((t for t in admissions if t is not None), default=None)
    # a suspension in the second of the latest admission came right after it
    current = [t for t in starts if t is not None and (admitted is None or t >= admitted)]
    if current:
        return max(current)
    if queue is not None and queue.admitted and queue.evicted_at is None:
        return None  # Kueue admitted it after every suspension anyone timed: spec.suspend is about to clear
    if seen.suspended_at is None:
        return None
    return max(seen.suspended_at, admitted) if admitted is not None else seen.suspended_at


def _pods_ran(status: Mapping[str, Any]) -> bool:
    """The Trainer counts pods of the job's JobSet that ran (only an admitted job has any)."""
    return any(
        isinstance(j, Mapping) and any(j.get(k) for k in ("active", "ready", "succeeded", "failed"))
        for j in status.get("jobsStatus") or []
    )
