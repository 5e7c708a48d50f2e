"""What a TrainJob is doing and how it ended, read from its status the same way for every backend."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainflow.core.history import EMPTY, History, HistoryPoint, finite
from trainflow.core.naming import ATTEMPT_LABEL, QUEUE_LABEL
from trainflow.core.naming import OUTPUT_URI_ANNOTATION as OUTPUT_URI_ANNOTATION
from trainflow.core.naming import RETURNS_ANNOTATION as RETURNS_ANNOTATION


class JobState(enum.StrEnum):
    """Lifecycle of a TrainJob as trainflow reports it.

    Trainer v2.3 has only Suspended/Complete/Failed conditions; Created and Running are derived
    from jobsStatus, and Suspended is reported as Queued (Kueue holds the job), never as a failure.
    """

    QUEUED = "Queued"
    CREATED = "Created"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETE, JobState.FAILED)


@dataclass(frozen=True)
class JobRef:
    """Identifies one TrainJob: enough for any process to wait on it, read its logs or cancel it."""

    name: str
    namespace: str
    uid: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, ref: JobRef | str, namespace: str) -> JobRef:
        """Accept ``name``, ``namespace/name`` or a JobRef (``namespace`` fills in a bare name)."""
        if isinstance(ref, JobRef):
            return ref
        if "/" in ref:
            ns, _, name = ref.partition("/")
            return cls(name=name, namespace=ns)
        return cls(name=ref, namespace=namespace)


@dataclass(frozen=True)
class TrainJobResult:
    """The state and outcome of a TrainJob; serialises to plain JSON for XCom and KFP outputs.

    A plain dataclass, not a pydantic model: every waiter builds these, and a waiter in the Airflow triggerer
    should not have to load pydantic for them (see docs/benchmarks.md, waiter memory).
    """

    name: str
    namespace: str
    state: JobState
    uid: str | None = None
    reason: str | None = None
    message: str | None = None
    runtime: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_seconds: float | None = None
    progress: int | None = None
    metrics: dict[str, float | str] = field(default_factory=dict)
    output_uri: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    attempt: int | None = None
    return_value: Any = None  # a function trainer's return value (JSON), read when a wait ends Complete
    queue: str | None = None  # Kueue's LocalQueue
    preemptions: int = 0  # times Kueue preempted the job (its Workload's evictions for Preempted)
    queued_seconds: float | None = None  # time spent waiting for admission (None: never suspended)
    eta_seconds: float | None = None  # trainerStatus.estimatedRemainingSeconds, as last reported
    reported_at: datetime | None = None  # trainerStatus.lastUpdatedTime: when the trainer last reported
    history: History = EMPTY  # every distinct report a waiter saw, bounded (core/history.py)

    def __post_init__(self) -> None:
        if self.progress is not None and not 0 <= self.progress <= 100:
            raise ValueError(f"progress {self.progress} is not a percentage")

    @property
    def ref(self) -> JobRef:
        return JobRef(name=self.name, namespace=self.namespace, uid=self.uid)

    @property
    def succeeded(self) -> bool:
        return self.state is JobState.COMPLETE

    @property
    def status_text(self) -> str:
        """The state in one line for a log: a queued job says why it waits (Kueue's word), and preemptions."""
        text = self.state.value
        if self.state is JobState.QUEUED and self.message:
            text += f": {self.message}"
        if self.preemptions:
            text += f" (preempted {self.preemptions} time{'s' if self.preemptions > 1 else ''})"
        return text

    def replace(self, **changes: Any) -> TrainJobResult:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible dict (ISO timestamps, string state, the history as columns)."""
        out = dataclasses.asdict(dataclasses.replace(self, history=EMPTY))
        out["state"] = self.state.value
        for key in _TIMES:
            value = out[key]
            out[key] = value.isoformat().replace("+00:00", "Z") if value is not None else None
        out["history"] = self.history.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainJobResult:
        """The inverse of ``to_dict`` (unknown keys are ignored, as from a newer version)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["state"] = JobState(values["state"])
        for key in _TIMES:
            values[key] = parse_time(values.get(key))
        values["history"] = History.from_dict(values.get("history"))
        return cls(**values)


_TIMES = ("created_at", "started_at", "finished_at", "reported_at")


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


DEADLINE_EXCEEDED = "DeadlineExceeded"  # the Trainer's reason when spec.activeDeadlineSeconds passes


def _condition(conditions: list[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == kind and str(cond.get("status")) == "True":
            return cond
    return None


def metric_value(value: Any) -> float | str:
    """trainerStatus carries metric values as strings; numbers come back as floats."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return str(value)


class TrainerReport:
    """What ``status.trainerStatus`` says: the training code's latest report, as the Trainer stores it."""

    __slots__ = ("eta_seconds", "metrics", "progress", "reported_at")

    def __init__(self, trainer_status: Mapping[str, Any] | None) -> None:
        ts = trainer_status if isinstance(trainer_status, Mapping) else {}
        self.metrics: dict[str, float | str] = {}
        for item in ts.get("metrics") or []:
            if isinstance(item, Mapping) and item.get("name"):
                self.metrics[str(item["name"])] = metric_value(item.get("value"))
        progress, eta = finite(ts.get("progressPercentage")), finite(ts.get("estimatedRemainingSeconds"))
        self.progress = int(progress) if progress is not None and 0 <= progress <= 100 else None
        self.eta_seconds = eta if eta is not None and eta >= 0 else None
        self.reported_at = parse_time(ts.get("lastUpdatedTime"))


def report_point(source: TrainerReport, now: float) -> HistoryPoint | None:
    """A report as a history point at its own time (``now`` when it carries none); None when it says nothing."""
    numbers = {k: float(v) for k, v in source.metrics.items() if finite(v) is not None}
    if not numbers and source.progress is None and source.eta_seconds is None and source.reported_at is None:
        return None
    when = source.reported_at.timestamp() if source.reported_at is not None else now
    return HistoryPoint(when, source.progress, source.eta_seconds, numbers)


def state_of(status: Mapping[str, Any]) -> tuple[JobState, Mapping[str, Any] | None]:
    """Derive the state (and the deciding condition) from a TrainJob status; unknown fields are ignored."""
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    for kind, state in (("Failed", JobState.FAILED), ("Complete", JobState.COMPLETE)):
        cond = _condition(conditions, kind)
        if cond is not None:
            return state, cond
    suspended = _condition(conditions, "Suspended")
    if suspended is not None:
        return JobState.QUEUED, suspended
    for job in status.get("jobsStatus") or []:
        if isinstance(job, Mapping) and (job.get("active") or job.get("ready") or job.get("succeeded")):
            return JobState.RUNNING, None
    return JobState.CREATED, None


def result_from_trainjob(
    obj: Mapping[str, Any], *, report: TrainerReport | None = None, history: History = EMPTY
) -> TrainJobResult:
    """Read a TrainJob object (dict as the API returns it) into a TrainJobResult.

    Tolerant of fields it does not know: a newer server never makes a status read fail. A waiter passes the
    ``trainerStatus`` it already read (``report``) and its history.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    state, deciding = state_of(status)
    if state is JobState.CREATED and spec.get("suspend"):
        state = JobState.QUEUED
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]

    created = parse_time(meta.get("creationTimestamp"))
    started, queued_seconds = created, None
    for cond in conditions:
        if cond.get("type") == "Suspended" and str(cond.get("status")) == "False":
            started = parse_time(cond.get("lastTransitionTime")) or started
            if started and created:  # resumed: queued from creation to its latest start (see kueue.py)
                queued_seconds = max((started - created).total_seconds(), 0.0)
    finished = parse_time(deciding.get("lastTransitionTime")) if state.terminal and deciding else None
    duration = (finished - started).total_seconds() if finished and started else None

    if report is None:
        report = TrainerReport(status.get("trainerStatus"))

    annotations = meta.get("annotations") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    attempt_text = labels.get(ATTEMPT_LABEL, "")
    runtime_ref = spec.get("runtimeRef") or {}
    reason = (deciding or {}).get("reason") if deciding else None
    message = (deciding or {}).get("message") if deciding else None
    deadline = spec.get("activeDeadlineSeconds")
    if state is JobState.FAILED and reason == DEADLINE_EXCEEDED and deadline:
        message = (
            f"ran longer than its run budget, deadline_seconds={deadline} (spec.activeDeadlineSeconds, counted "
            f"from its latest start): {message or 'deadline exceeded'}"
        )
    return TrainJobResult(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=meta.get("uid"),
        state=state,
        reason=reason,
        message=message,
        runtime=runtime_ref.get("name"),
        created_at=created,
        started_at=started,
        finished_at=finished,
        duration_seconds=max(duration, 0.0) if duration is not None else None,
        progress=report.progress,
        metrics=report.metrics,
        eta_seconds=report.eta_seconds,
        reported_at=report.reported_at,
        history=history,
        output_uri=annotations.get(OUTPUT_URI_ANNOTATION),
        labels=labels,
        attempt=int(attempt_text) if attempt_text.isdigit() else None,
        queue=labels.get(QUEUE_LABEL),
        queued_seconds=queued_seconds,
    )
