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
  every ``POD_CHECK_SECONDS`` - a pod that cannot be scheduled or pull its image never fails the TrainJob, and a
  crashed container's exit code and log are gone once the Job deletes its pods (before the TrainJob turns
  Failed). The Trainer's counts lag behind the pods, so a waiter of its own (``pod_check_every``) also looks
  at that pace while the job has pods, ready or not; waiters sharing one watch rely on the counts alone;
* the deadline: an absolute time, so a wait resumed elsewhere (a triggerer) keeps the task's deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainflow.core.errors import InvalidRequest
from trainflow.core.result import JobState, TrainJobResult, result_from_trainjob

CREATION_RECHECK_SECONDS = 30.0
POD_CHECK_SECONDS = 5.0
UpdateCallback = Callable[[TrainJobResult], None]


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


@dataclass
class Waiter:
    """The state of one wait. ``deadline`` is epoch seconds; ``submit_timeout`` None disables the stuck check,
    ``pod_checks`` False the pod checks (the local engine has no pods)."""

    deadline: float | None = None
    submit_timeout: float | None = None
    pod_checks: bool = False
    pod_check_every: float | None = None  # also look at the pods this often while the job has any
    pods_checked_at: float | None = None
    recheck: float = CREATION_RECHECK_SECONDS
    result: TrainJobResult | None = None
    obj: Mapping[str, Any] | None = None
    ran: bool = False
    checked_at: float | None = None
    _key: tuple[Any, ...] | None = field(default=None, repr=False)

    def remaining(self, now: float) -> float:
        """Seconds until the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - now

    def next_check(self, now: float, window: float) -> float:
        """How long a driver may wait for the next event before it must look again (deadline, stuck check)."""
        pause = min(window, self.remaining(now))
        if self.pods_not_ready():
            pause = min(pause, POD_CHECK_SECONDS)
        if self.pod_check_every is not None and self.has_pods():
            pause = min(pause, self.pod_check_every)
        if self._may_be_stuck() and self.result is not None and self.submit_timeout is not None:
            created = self.result.created_at.timestamp() if self.result.created_at else now
            due = max(created + self.submit_timeout, (self.checked_at or -math.inf) + self.recheck)
            pause = min(pause, due - now)
        return max(0.0, pause)

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


def observe(waiter: Waiter, obj: Mapping[str, Any] | None, now: float) -> Outcome:
    """Fold one look into the waiter; ``obj`` None means no news (a window passed quietly)."""
    if obj is not None:
        seen = result_from_trainjob(obj)
        if seen.state is JobState.RUNNING:
            waiter.ran = True
        elif seen.state is JobState.CREATED and waiter.ran:
            seen = seen.replace(state=JobState.RUNNING)
        waiter.obj, waiter.result = obj, seen
    if waiter.result is None:
        return Outcome(None, timed_out=waiter.remaining(now) <= 0)
    result = waiter.result
    key = (result.state, result.reason, result.progress, tuple(sorted(result.metrics.items())))
    changed = obj is not None and key != waiter._key
    if changed:
        waiter._key = key
    if result.state.terminal:
        return Outcome(result, changed=changed, done=True)
    if waiter.remaining(now) <= 0:
        return Outcome(result, changed=changed, timed_out=True)
    return Outcome(
        result,
        changed=changed,
        check_creation=_creation_check_due(waiter, now),
        check_pods=_pod_check_due(waiter, now),
    )


def _pod_check_due(waiter: Waiter, now: float) -> bool:
    if waiter.pods_not_ready():
        every = 1.0  # news of pods not ready: look now, at most once a second
    elif waiter.pod_check_every is not None and waiter.has_pods():
        every = waiter.pod_check_every
    else:
        return False
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
