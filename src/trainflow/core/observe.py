"""The one wait state machine: what each new look at a TrainJob means for a waiter. Pure, no I/O.

Every waiter drives it the same way (the sync watch, the shared async watch, the local engine's polling):
feed each version of the TrainJob (or ``None`` when a quiet period passed) to ``observe`` and act on the
``Outcome``. The rules for reading status live here and in ``result.state_of``, nowhere else:

* terminal: Complete or Failed (``state_of``);
* a job that ran never goes back to Created: Trainer v2.3 publishes an all-zero ``jobsStatus`` between a pod
  failing and the Failed condition;
* stuck in Created: no JobSet progress ``submit_timeout`` after creation means the waiter should look for
  creation-failure events, at most every ``recheck`` seconds;
* pods not ready (the Trainer's ``jobsStatus`` counts fewer ready than active pods): the waiter looks at the pods
  every ``POD_CHECK_SECONDS`` - a pod that cannot be scheduled or pull its image never fails the TrainJob (a
  crashed container is handed to the waiter by the pod watch, kube/pod_watch.py, as it happens);
* the deadline: an absolute time, so a wait resumed elsewhere (a triggerer) keeps the task's deadline;
* Kueue (``core/kueue.py``): a queued or preempted job is waiting, never failing; the waiter asks its driver to
  read the job's Workload (``check_queue``) when the job turns Queued or changes while queued, again at a
  growing pace until Kueue has decided, and (a waiter of its own, ``queue_recheck``) every 30 s while queued;
  ``observe_queue`` folds the answer in. A job queued longer than its queue budget (the
  ``trainflow.dev/max-queue-seconds`` annotation, counted from the start of its current wait for admission as
  the Trainer and Kueue time it, ``kueue.queue_clock``) fails the wait (``budget_expired``); the run budget is
  the Trainer's own ``spec.activeDeadlineSeconds``;
* the metrics history: each distinct ``trainerStatus`` (a report of the training code) is recorded once, at
  its ``lastUpdatedTime``, bounded and downsampled as ``core/history.py`` says; each look's result carries it
  (``result.history``) with the ETA, and a new report is a change (``on_update``). Nothing is read for it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainflow.core import kueue
from trainflow.core.errors import InvalidRequest
from trainflow.core.history import EMPTY, Recorder
from trainflow.core.kueue import QueueStatus
from trainflow.core.naming import MAX_QUEUE_ANNOTATION
from trainflow.core.result import JobState, TrainerReport, TrainJobResult, report_point, result_from_trainjob

CREATION_RECHECK_SECONDS = 30.0
POD_CHECK_SECONDS = 5.0
QUEUE_RECHECK_SECONDS = 30.0  # a waiter of its own re-reads a queued job's Workload this often
QUEUE_FIRST_LOOK = 1.0  # until Kueue has decided about a new Workload: 1, 2, 4, ... seconds, then the recheck
QUEUE_QUIET_UNTIL = 8.0  # an undecided Workload (or none yet) is news only after the reads 1, 2, 4 s apart
QUEUE_BUDGET_EXPIRED = "QueueBudgetExceeded"
UpdateCallback = Callable[[TrainJobResult], None]
log = logging.getLogger(__name__)


def tell(on_update: UpdateCallback | None, result: TrainJobResult | None) -> None:
    """A waiter's update callback, the one guard of both engines: its failure is logged and never ends the
    wait."""
    if on_update is None or result is None:
        return
    try:
        on_update(result)
    except Exception:
        log.exception("the on_update callback failed for TrainJob %s/%s", result.namespace, result.name)


def resolve_deadline(timeout: float | None, deadline: float | None) -> float | None:
    """A relative timeout and/or an absolute deadline (epoch seconds) as one absolute deadline.

    A non-finite value (``nan`` never compares, ``inf`` never comes) or a negative timeout is a mistake:
    refused rather than waiting forever.
    """
    for name, value in (("timeout", timeout), ("deadline", deadline)):
        if value is not None and (not math.isfinite(value) or (name == "timeout" and value < 0)):
            raise InvalidRequest.one(
                name,
                f"{value!r} is not a finite number of seconds" + (" >= 0" if name == "timeout" else ""),
                "give a finite number of seconds, or None to wait without a limit",
            )
    candidates = [d for d in (deadline, time.time() + timeout if timeout is not None else None) if d]
    return min(candidates) if candidates else None


@dataclass(frozen=True)
class Outcome:
    """What a look means: report ``result`` when ``changed``; stop when ``done`` or ``timed_out``."""

    result: TrainJobResult | None
    changed: bool = False
    done: bool = False
    timed_out: bool = False
    check_creation: bool = False
    check_pods: bool = False
    check_queue: bool = False  # read the job's Kueue Workload and fold it in with ``observe_queue``
    budget_expired: bool = False  # queued past its queue budget: ``result`` is the failure to report


@dataclass
class Waiter:
    """The state of one wait. ``deadline`` is epoch seconds; ``submit_timeout`` None disables the stuck check,
    ``pod_checks`` False the pod checks (the local engine has no pods)."""

    deadline: float | None = None
    submit_timeout: float | None = None
    pod_checks: bool = False
    pods_checked_at: float | None = None
    recheck: float = CREATION_RECHECK_SECONDS
    queue_reads: bool = False  # the driver reads a Kueue-managed job's Workload when ``check_queue`` says so
    queue_recheck: float | None = None  # and again this often while queued (None: when the job changes)
    queue: QueueStatus | None = None
    queue_looked: bool = False  # ``queue`` is what a read found (None: no Workload), not just unread
    queue_due: float | None = None  # when the next Workload read is wanted
    queue_backoff: float = QUEUE_FIRST_LOOK
    result: TrainJobResult | None = None
    obj: Mapping[str, Any] | None = None
    ran: bool = False
    admitted_seen: float | None = None  # the latest look that found ``spec.suspend`` clear
    suspended_seen: float | None = None  # the first look that found it set, since
    checked_at: float | None = None
    history: Recorder | None = field(default=None, repr=False)  # made at the first report
    _seen: TrainJobResult | None = field(default=None, repr=False)  # the TrainJob alone, before Kueue's word
    _key: tuple[Any, ...] | None = field(default=None, repr=False)
    _report: Mapping[str, Any] | None = field(default=None, repr=False)

    def remaining(self, now: float) -> float:
        """Seconds until the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - now

    def next_check(self, now: float, window: float) -> float:
        """How long a driver may wait for the next event before it must look again (deadline, stuck check)."""
        pause = min(window, self.remaining(now))
        if self.pods_not_ready():
            pause = min(pause, POD_CHECK_SECONDS)
        if self._may_be_stuck() and self.result is not None and self.submit_timeout is not None:
            created = self.result.created_at.timestamp() if self.result.created_at else now
            due = max(created + self.submit_timeout, (self.checked_at or -math.inf) + self.recheck)
            pause = min(pause, due - now)
        if self.queued():
            if self.queue_due is not None:
                pause = min(pause, self.queue_due - now)
            expires = self.queue_budget_expires()
            if expires is not None:
                pause = min(pause, expires - now)
        return max(0.0, pause)

    def queued(self) -> bool:
        return self.result is not None and self.result.state is JobState.QUEUED

    def queue_budget(self) -> float | None:
        """The job's queue budget in seconds (its annotation; None without one or when unreadable)."""
        annotations = ((self.obj or {}).get("metadata") or {}).get("annotations") or {}
        text = annotations.get(MAX_QUEUE_ANNOTATION) if isinstance(annotations, Mapping) else None
        try:
            value = float(text) if text is not None else None
        except ValueError:
            return None
        return value if value is not None and math.isfinite(value) and value > 0 else None

    def queue_budget_expires(self) -> float | None:
        """When the current wait for admission exceeds the queue budget (epoch seconds), if the job has one."""
        budget = self.queue_budget()
        if budget is None or self.obj is None:
            return None
        seen = kueue.Sightings(_utc(self.admitted_seen), _utc(self.suspended_seen), self.ran)
        since = kueue.queue_clock(self.obj, self.queue, seen)
        return since.timestamp() + budget if since is not None else None

    def has_pods(self) -> bool:
        """A job not yet terminal whose JobSet reports jobs (its pods exist or are coming)."""
        if not self.pod_checks or self.obj is None or self.result is None or self.result.state.terminal:
            return False
        return bool((self.obj.get("status") or {}).get("jobsStatus"))

    def pods_not_ready(self) -> bool:
        """A Created or Running job with fewer ready than active pods (pending, pulling, crashed)."""
        if not self.has_pods():
            return False
        assert self.obj is not None
        jobs = (self.obj.get("status") or {}).get("jobsStatus") or []
        return any(
            int(j.get("active") or 0) > int(j.get("ready") or 0) for j in jobs if isinstance(j, Mapping)
        )

    def _may_be_stuck(self) -> bool:
        if self.result is None or self.result.state is not JobState.CREATED or self.obj is None:
            return False
        return not (self.obj.get("status") or {}).get("jobsStatus")


def record(
    waiter: Waiter,
    trainer_status: Mapping[str, Any] | None,
    now: float,
    read: TrainerReport | None = None,
) -> bool:
    """Add a ``trainerStatus`` to the waiter's history unless it is the one recorded last; True when added.

    ``observe`` calls it for each look (with what it already read from it, ``read``); a driver that learns of
    reports between looks (the local engine keeps every ``report()``) calls it for each of them, in order.
    The same report seen again is an equal mapping; the waiter keeps a reference to the newest, no copy.
    """
    if not trainer_status:
        return False
    same = trainer_status == waiter._report
    waiter._report = trainer_status
    point = None if same else report_point(read if read is not None else TrainerReport(trainer_status), now)
    if point is None:
        return False
    if waiter.history is None:
        waiter.history = Recorder()
    waiter.history.add(point)
    return True


def observe(waiter: Waiter, obj: Mapping[str, Any] | None, now: float) -> Outcome:
    """Fold one look into the waiter; ``obj`` None means no news (a window passed quietly)."""
    if obj is not None:
        trainer_status = (obj.get("status") or {}).get("trainerStatus")
        report = TrainerReport(trainer_status)
        record(waiter, trainer_status, now, report)
        history = waiter.history.view() if waiter.history is not None else EMPTY
        seen = result_from_trainjob(obj, report=report, history=history)
        if seen.state is JobState.RUNNING:
            waiter.ran = True
        elif seen.state is JobState.CREATED and waiter.ran:
            seen = seen.replace(state=JobState.RUNNING)
        waiter.obj, waiter._seen = obj, seen
        if (obj.get("spec") or {}).get("suspend"):
            waiter.suspended_seen = now if waiter.suspended_seen is None else waiter.suspended_seen
        else:
            waiter.admitted_seen, waiter.suspended_seen = now, None
        if seen.state is JobState.QUEUED and waiter.queue_reads and kueue.managed(obj):
            waiter.queue_due = now  # turned Queued, or changed while queued: ask Kueue why
    if waiter._seen is None:
        return Outcome(None, timed_out=waiter.remaining(now) <= 0)
    result = _merged(waiter, now)
    ask = not result.state.terminal and waiter.remaining(now) > 0 and _queue_check_due(waiter, now)
    # a job that turned Queued is news once Kueue said why (``observe_queue`` reports it)
    changed = obj is not None and not ask and _changed(waiter, result)
    if result.state.terminal:
        return Outcome(result, changed=changed, done=True)
    expires = waiter.queue_budget_expires() if result.state is JobState.QUEUED else None
    if expires is not None and now >= expires and not ask:  # (Kueue's last word first: the failure names it)
        return Outcome(_budget_failure(waiter, result, now), changed=changed, budget_expired=True)
    if waiter.remaining(now) <= 0:
        return Outcome(result, changed=changed, timed_out=True)
    return Outcome(
        result,
        changed=changed,
        check_creation=_creation_check_due(waiter, now),
        check_pods=_pod_check_due(waiter, now),
        check_queue=ask,
    )


def observe_queue(waiter: Waiter, queue: QueueStatus | None, now: float) -> Outcome:
    """Fold what the job's Workload said (None: it has none) into the waiter; schedule the next read."""
    waiter.queue, waiter.queue_looked = queue, True
    if queue is None or not queue.decided:  # Kueue has not looked yet: soon again, less and less often
        waiter.queue_due = now + waiter.queue_backoff
        waiter.queue_backoff = min(waiter.queue_backoff * 2, waiter.queue_recheck or QUEUE_RECHECK_SECONDS)
    else:
        waiter.queue_backoff = QUEUE_FIRST_LOOK
        waiter.queue_due = now + waiter.queue_recheck if waiter.queue_recheck is not None else None
    if waiter._seen is None:
        return Outcome(None)
    result = _merged(waiter, now)
    if (queue is None or not queue.decided) and waiter.queue_backoff <= QUEUE_QUIET_UNTIL:
        return Outcome(result)  # Kueue makes the Workload and decides within seconds: not news yet
    return Outcome(result, changed=_changed(waiter, result))


def ask_queue_later(waiter: Waiter, now: float, seconds: float = 0.5) -> None:
    """The answer to ``check_queue`` is not available yet (a Workload watch is starting): ask again soon."""
    waiter.queue_due = now + seconds


def _merged(waiter: Waiter, now: float) -> TrainJobResult:
    assert waiter._seen is not None
    seen = waiter._seen
    if waiter.queue is not None or (seen.queue and seen.state is JobState.QUEUED):
        seen = kueue.with_queue(
            seen, waiter.queue, datetime.fromtimestamp(now, UTC), looked=waiter.queue_looked
        )
    waiter.result = seen
    return seen


def _utc(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def _changed(waiter: Waiter, result: TrainJobResult) -> bool:
    key = (
        result.state,
        result.reason,
        result.message if result.state is JobState.QUEUED else None,
        result.progress,
        result.preemptions,
        tuple(sorted(result.metrics.items())),
        waiter.history.seen if waiter.history is not None else 0,  # each new report is news
    )
    if key == waiter._key:
        return False
    waiter._key = key
    return True


def _budget_failure(waiter: Waiter, result: TrainJobResult, now: float) -> TrainJobResult:
    """The failure a queue budget's expiry reports: the budget, the queue, Kueue's last word."""
    budget = waiter.queue_budget()
    where = f"LocalQueue {result.queue}" if result.queue else "the queue"
    why = f" ({result.message})" if result.message else ""
    message = f"not admitted by {where} within its queue budget, max_queue_seconds={budget:g}{why}"
    return result.replace(state=JobState.FAILED, reason=QUEUE_BUDGET_EXPIRED, message=message)


def _queue_check_due(waiter: Waiter, now: float) -> bool:
    if not waiter.queue_reads or not waiter.queued() or waiter.queue_due is None or now < waiter.queue_due:
        return False
    waiter.queue_due = None  # read in flight; ``observe_queue`` schedules the next
    return True


def _pod_check_due(waiter: Waiter, now: float) -> bool:
    if not waiter.pods_not_ready():
        return False
    every = 1.0  # news of pods not ready: look now, at most once a second
    if waiter.pods_checked_at is not None and now - waiter.pods_checked_at < every:
        return False
    waiter.pods_checked_at = now
    return True


def _creation_check_due(waiter: Waiter, now: float) -> bool:
    if waiter.submit_timeout is None or not waiter._may_be_stuck() or waiter.result is None:
        return False
    created = waiter.result.created_at.timestamp() if waiter.result.created_at else now
    if now - created < waiter.submit_timeout:
        return False
    if waiter.checked_at is not None and now - waiter.checked_at < waiter.recheck:
        return False
    waiter.checked_at = now
    return True
