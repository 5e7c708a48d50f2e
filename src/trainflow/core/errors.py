"""Exceptions raised by trainflow; every one carries enough to act on without a traceback."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Every error text trainflow builds stays readable: a value echoed in it is cut (a huge or expanded input
# must not turn into megabytes of stderr or of an Airflow task log).
MAX_ERROR_CHARS = 4000
MAX_FIELD_CHARS = 200
MAX_PROBLEM_CHARS = 1000
MAX_FIX_CHARS = 500


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"... [{len(text) - limit} more characters]"
    return text[: max(limit - len(note), 0)] + note


def field_path(data: Any, loc: Sequence[int | str]) -> str:
    """The user's field path (``env.A``, ``volumes[0].mount_path``) for a pydantic error location, without
    pydantic's union and type tags."""
    path, node = "", data
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            path += f".{part}" if path else str(part)
            node = node[part]
        elif isinstance(node, list | tuple) and isinstance(part, int) and part < len(node):
            path += f"[{part}]"
            node = node[part]
        elif not path:
            path = str(part)
            node = None
        else:
            break
    return path or "request"


class TrainflowError(Exception):
    """Base class of every error trainflow raises on purpose."""


@dataclass(frozen=True)
class FieldIssue:
    """One problem with one request field: where, what, and how to fix it."""

    field: str
    problem: str
    fix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "field", clip(str(self.field), MAX_FIELD_CHARS))
        object.__setattr__(self, "problem", clip(str(self.problem), MAX_PROBLEM_CHARS))
        object.__setattr__(self, "fix", clip(str(self.fix), MAX_FIX_CHARS))

    def __str__(self) -> str:
        text = f"{self.field}: {self.problem}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class InvalidRequest(TrainflowError, ValueError):
    """The request cannot become a valid TrainJob; nothing was submitted or started."""

    def __init__(self, issues: Sequence[FieldIssue], *, subject: str = "TrainJob request") -> None:
        self.issues: tuple[FieldIssue, ...] = tuple(issues)
        text, shown = f"invalid {subject}: ", 0
        for issue in self.issues:
            line = ("; " if shown else "") + str(issue)
            if len(text) + len(line) > MAX_ERROR_CHARS - 40:
                break
            text, shown = text + line, shown + 1
        if shown < len(self.issues):
            text += f"{'; ' if shown else ''}... and {len(self.issues) - shown} more problem(s)"
        super().__init__(text)

    @property
    def fields(self) -> list[str]:
        return [issue.field for issue in self.issues]

    @classmethod
    def one(cls, field: str, problem: str, fix: str = "") -> InvalidRequest:
        return cls([FieldIssue(field, problem, fix)])


class RuntimeNotFound(InvalidRequest):
    """The runtime named by the request does not exist where the job would run."""

    def __init__(self, name: str, kind: str, available: Sequence[str]) -> None:
        choices = ", ".join(sorted(available)) or "none"
        super().__init__([FieldIssue("runtime", f"{kind} {name!r} not found", f"use one of: {choices}")])
        self.runtime_name = name


class TrainJobNotFound(TrainflowError, LookupError):
    """The TrainJob does not exist (never created, or deleted)."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"TrainJob {namespace}/{name} not found")
        self.namespace = namespace
        self.name = name


class TrainJobConflict(TrainflowError):
    """A TrainJob with the wanted name exists but belongs to someone else."""


class BackendError(TrainflowError):
    """The backend (API server, local engine) could not do what was asked."""


class Transient(BackendError):
    """The API server was unreachable, throttling (429) or failing (5xx) through every retry; a long wait keeps
    trying, a single call gives up."""


class StateUnknown(Transient):
    """A wait ended (its deadline passed) while the API server could not be reached: the job's state is unknown,
    so it is neither reported as timed out nor cleaned up."""


class NotFound(BackendError, LookupError):
    """An object other than the TrainJob itself (a runtime, a pod) does not exist."""


class Unauthorized(BackendError):
    """HTTP 401: the API server rejected the credentials (expired or wrong)."""


class PermissionDenied(BackendError):
    """The identity in use may not do this; the message names the verb and resource to grant."""


class CorruptState(BackendError):
    """A local job's state file is unreadable (truncated, not JSON, wrong shape); cancelling removes the job."""

    reason = "StateCorrupted"


class AlreadyExists(BackendError):
    """A create found the name taken (HTTP 409): the caller looks at what exists before doing anything."""


class OutcomeUnknown(BackendError):
    """A create's answer was lost (connection error): it may or may not have happened."""


class WaitTimeout(TrainflowError, TimeoutError):
    """The deadline passed before the TrainJob reached a terminal state; the job was left as it is."""

    def __init__(
        self, namespace: str, name: str, state: str, timeout: float, diagnostics: Diagnostics | None = None
    ) -> None:
        text = f"TrainJob {namespace}/{name} still {state} after {timeout:.0f}s; it was not cancelled"
        if diagnostics is not None and diagnostics.lines():
            text += "\n  " + "\n  ".join(diagnostics.lines())
        super().__init__(text)
        self.namespace = namespace
        self.name = name
        self.state = state
        self.diagnostics = diagnostics


@dataclass
class Diagnostics:
    """What the backend found out about why a job failed (pods, events, exit codes, log tails)."""

    pod_problems: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    failed_ranks: list[dict[str, Any]] = field(default_factory=list)
    log_tail: str = ""

    def lines(self) -> list[str]:
        out = [*self.pod_problems, *self.events]
        for rank in self.failed_ranks:
            out.append(", ".join(f"{k}={v}" for k, v in rank.items() if k != "log_tail"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod_problems": list(self.pod_problems),
            "events": list(self.events),
            "failed_ranks": [dict(r) for r in self.failed_ranks],
            "log_tail": self.log_tail,
        }


class TrainJobFailed(TrainflowError):
    """The TrainJob ended Failed; carries the condition's reason and message and diagnostics."""

    def __init__(self, result: Any, diagnostics: Diagnostics | None = None) -> None:
        self.result = result
        self.diagnostics = diagnostics or Diagnostics()
        parts = [f"TrainJob {result.namespace}/{result.name} failed"]
        if result.reason:
            parts.append(f"reason={clip(str(result.reason), MAX_FIELD_CHARS)}")
        if result.message:
            parts.append(f"message={clip(str(result.message), MAX_PROBLEM_CHARS)}")
        text = ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]
        details = [clip(line, MAX_FIX_CHARS) for line in self.diagnostics.lines()[:20]]
        if details:
            text += "\n  " + "\n  ".join(details)
        if self.diagnostics.log_tail:  # its end says most: keep that
            tail = self.diagnostics.log_tail
            text += "\n--- log tail ---\n" + (
                tail if len(tail) <= MAX_ERROR_CHARS else "..." + tail[-MAX_ERROR_CHARS:]
            )
        super().__init__(text)


class QueueBudgetExceeded(TrainJobFailed):
    """The job waited for admission (Kueue) longer than its queue budget (``max_queue_seconds``); it never
    started this time and is still queued: the adapter deletes it or keeps it as its cancel setting says."""
