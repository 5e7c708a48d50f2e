"""How a wait ended, as one value: both engines produce it, ``wait`` raises from it in one place, and every
adapter (Airflow's trigger, operator and sensor, the KFP step, the CLI) maps it once.

Its dict form is the Airflow trigger's event payload (``status`` is the kind), so a task resumes from what
the trigger saw without a backend, and events written by earlier releases still read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from trainflow.core.errors import (
    Diagnostics,
    QueueBudgetExceeded,
    StateUnknown,
    TrainflowError,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
)
from trainflow.core.result import JobRef, TrainJobResult


class EndKind(enum.Enum):
    """Each way a wait ends; the value is the trigger event's ``status``."""

    COMPLETE = "success"  # the job completed: the result holds its metrics, history and return value
    FAILED = "failed"  # the job failed (or a pod was stuck): the result and the diagnostics say why
    QUEUE_BUDGET = "queue_budget"  # never admitted within max_queue_seconds; still queued
    TIMED_OUT = "timeout"  # the deadline passed; the job was left as it is, still ``state``
    NOT_FOUND = "not_found"  # the job does not exist (deleted while waited for, or never created)
    CANCELLED = "cancelled"  # the waiter's own side gave up on it (a cancelled step, a killed task)
    STATE_UNKNOWN = "state_unknown"  # the deadline passed while the API server was unreachable
    ERROR = "error"  # anything else that ended the wait: ``message`` says what


@dataclass(frozen=True)
class Ending:
    """How the wait for TrainJob ``namespace/name`` ended."""

    kind: EndKind
    namespace: str
    name: str
    result: TrainJobResult | None = None
    message: str = ""
    diagnostics: Diagnostics | None = None
    state: str | None = None  # TIMED_OUT: the state the job was still in

    @property
    def ref(self) -> JobRef:
        uid = self.result.uid if self.result is not None else None
        return JobRef(name=self.name, namespace=self.namespace, uid=uid)

    @property
    def succeeded(self) -> bool:
        return self.kind is EndKind.COMPLETE

    @classmethod
    def complete(cls, result: TrainJobResult) -> Ending:
        """A job that reached a terminal state and is reported as such (Complete, or Failed unraised)."""
        kind = EndKind.COMPLETE if result.succeeded else EndKind.FAILED
        return cls(kind, result.namespace, result.name, result=result)

    @classmethod
    def of_error(cls, ref: JobRef, exc: BaseException) -> Ending:
        """The ending an error of a wait stands for (``ERROR`` with its text for any other)."""
        if isinstance(exc, QueueBudgetExceeded):
            return cls(EndKind.QUEUE_BUDGET, ref.namespace, ref.name, exc.result, str(exc), exc.diagnostics)
        if isinstance(exc, TrainJobFailed):
            return cls(EndKind.FAILED, ref.namespace, ref.name, exc.result, str(exc), exc.diagnostics)
        if isinstance(exc, WaitTimeout):
            kind = EndKind.TIMED_OUT
            return cls(kind, exc.namespace, exc.name, None, str(exc), exc.diagnostics, exc.state)
        if isinstance(exc, TrainJobNotFound):
            return cls(EndKind.NOT_FOUND, exc.namespace, exc.name, message=str(exc))
        if isinstance(exc, StateUnknown):
            return cls(EndKind.STATE_UNKNOWN, ref.namespace, ref.name, message=str(exc))
        return cls(EndKind.ERROR, ref.namespace, ref.name, message=f"{type(exc).__name__}: {exc}")

    def error(self) -> TrainflowError | None:
        """The typed error a caller of ``wait`` gets for this ending; None for a result it returns."""
        result = self.result
        if self.kind is EndKind.COMPLETE:
            return None
        if self.kind is EndKind.FAILED and result is not None:
            return TrainJobFailed(result, self.diagnostics)
        if self.kind is EndKind.QUEUE_BUDGET and result is not None:
            return QueueBudgetExceeded(result, self.diagnostics)
        if self.kind is EndKind.TIMED_OUT:
            return _timeout(self)
        if self.kind is EndKind.NOT_FOUND:
            return TrainJobNotFound(self.namespace, self.name)
        if self.kind is EndKind.STATE_UNKNOWN:
            return StateUnknown(self.message)
        return TrainflowError(self.message or f"the wait for TrainJob {self.ref} ended: {self.kind.value}")

    def outcome(self, raise_on_failure: bool = True) -> TrainJobResult:
        """What ``wait`` returns: the result, or the typed error raised (a Failed result is returned when
        ``raise_on_failure`` is False, as is a job given up on for its queue budget)."""
        if self.result is not None and not raise_on_failure and self.kind in _RESULT_KINDS:
            return self.result
        error = self.error()
        if error is None and self.result is not None:
            return self.result
        raise error if error is not None else TrainflowError(f"TrainJob {self.ref}: no result")

    def to_event(self) -> dict[str, Any]:
        """JSON-able form (the trigger's event): ``status``, ``name``, ``namespace`` and what else is known."""
        payload: dict[str, Any] = {"status": self.kind.value, "name": self.name, "namespace": self.namespace}
        if self.result is not None:
            payload["result"] = self.result.to_dict()
        if self.message:
            payload["message"] = self.message
        if self.diagnostics is not None:
            payload["diagnostics"] = self.diagnostics.to_dict()
        if self.state is not None:
            payload["state"] = self.state
        return payload

    @classmethod
    def from_event(cls, payload: dict[str, Any]) -> Ending:
        """The ending a trigger event carries (an unknown status reads as ``ERROR``)."""
        try:
            kind = EndKind(payload.get("status"))
        except ValueError:
            kind = EndKind.ERROR
        raw = payload.get("result")
        diag = payload.get("diagnostics")
        return cls(
            kind,
            str(payload.get("namespace") or ""),
            str(payload.get("name") or ""),
            TrainJobResult.from_dict(raw) if isinstance(raw, dict) and raw else None,
            str(payload.get("message") or ""),
            Diagnostics(**diag) if isinstance(diag, dict) else None,
            payload.get("state"),
        )


_RESULT_KINDS = (EndKind.FAILED, EndKind.QUEUE_BUDGET)


def _timeout(ending: Ending) -> WaitTimeout:
    """The WaitTimeout of a timed-out ending, with the text its producer wrote."""
    error = WaitTimeout(ending.namespace, ending.name, ending.state or "unknown", 0.0, ending.diagnostics)
    if ending.message:
        error.args = (ending.message,)
    return error
