"""What a TrainJob is doing and how it ended, read from its status the same way for every backend."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainflow.core.naming import ATTEMPT_LABEL

OUTPUT_URI_ANNOTATION = "trainflow.dev/output-uri"
RETURNS_ANNOTATION = "trainflow.dev/returns"  # a function trainer: rank 0's log ends with its return value


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

    def __post_init__(self) -> None:
        if self.progress is not None and not 0 <= self.progress <= 100:
            raise ValueError(f"progress {self.progress} is not a percentage")

    @property
    def ref(self) -> JobRef:
        return JobRef(name=self.name, namespace=self.namespace, uid=self.uid)

    @property
    def succeeded(self) -> bool:
        return self.state is JobState.COMPLETE

    def replace(self, **changes: Any) -> TrainJobResult:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible dict (ISO timestamps, string state)."""
        out = dataclasses.asdict(self)
        out["state"] = self.state.value
        for key in ("created_at", "started_at", "finished_at"):
            value = out[key]
            out[key] = value.isoformat().replace("+00:00", "Z") if value is not None else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainJobResult:
        """The inverse of ``to_dict`` (unknown keys are ignored, as from a newer version)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["state"] = JobState(values["state"])
        for key in ("created_at", "started_at", "finished_at"):
            values[key] = _parse_time(values.get(key))
        return cls(**values)


def _parse_time(value: Any) -> datetime | None:
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


def result_from_trainjob(obj: Mapping[str, Any]) -> TrainJobResult:
    """Read a TrainJob object (dict as the API returns it) into a TrainJobResult.

    Tolerant of fields it does not know: a newer server never makes a status read fail.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    state, deciding = state_of(status)
    if state is JobState.CREATED and spec.get("suspend"):
        state = JobState.QUEUED
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]

    created = _parse_time(meta.get("creationTimestamp"))
    started = created
    for cond in conditions:
        if cond.get("type") == "Suspended" and str(cond.get("status")) == "False":
            started = _parse_time(cond.get("lastTransitionTime")) or started
    finished = _parse_time(deciding.get("lastTransitionTime")) if state.terminal and deciding else None
    duration = (finished - started).total_seconds() if finished and started else None

    trainer_status = status.get("trainerStatus") or {}
    metrics: dict[str, float | str] = {}
    for item in trainer_status.get("metrics") or []:
        if isinstance(item, Mapping) and item.get("name"):
            metrics[str(item["name"])] = metric_value(item.get("value"))
    progress = trainer_status.get("progressPercentage")

    annotations = meta.get("annotations") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    attempt_text = labels.get(ATTEMPT_LABEL, "")
    runtime_ref = spec.get("runtimeRef") or {}
    return TrainJobResult(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=meta.get("uid"),
        state=state,
        reason=(deciding or {}).get("reason") if deciding else None,
        message=(deciding or {}).get("message") if deciding else None,
        runtime=runtime_ref.get("name"),
        created_at=created,
        started_at=started,
        finished_at=finished,
        duration_seconds=max(duration, 0.0) if duration is not None else None,
        progress=int(progress) if isinstance(progress, int | float) else None,
        metrics=metrics,
        output_uri=annotations.get(OUTPUT_URI_ANNOTATION),
        labels=labels,
        attempt=int(attempt_text) if attempt_text.isdigit() else None,
    )
