"""What the tail of rank 0's log tells of a finished job, the same rule for both engines: the last
``TRAINFLOW_REPORT {json}`` line's metrics and progress (when the status carried none) and a function
trainer's return value."""

from __future__ import annotations

from collections.abc import Iterable

from trainflow.core.reporting import parse_report_line, return_value
from trainflow.core.result import JobState, TrainJobResult, metric_value

TAIL_LINES = 200  # how much of rank 0's log a finished job's result is read from


def read_tail(result: TrainJobResult, lines: list[str], returns: bool) -> TrainJobResult:
    """A finished job's result with what its log tail says: a Complete job's last report, when its status
    carried no metrics, and (``returns``) the function's return value."""
    if result.state is not JobState.COMPLETE:
        return result
    if not result.metrics:
        metrics, progress = last_report(lines)
        if metrics or progress is not None:
            result = result.replace(
                metrics=metrics, progress=progress if progress is not None else result.progress
            )
    if returns:
        result = result.replace(return_value=return_value(lines))
    return result


def last_report(lines: Iterable[str]) -> tuple[dict[str, float | str], int | None]:
    """(metrics, progress) from the last valid report line; later lines win, metrics merge over reports."""
    metrics: dict[str, float | str] = {}
    progress: int | None = None
    for line in lines:
        data = parse_report_line(line)
        if data is None:
            continue
        raw = data.get("metrics")
        if isinstance(raw, dict):
            for key, value in raw.items():
                if value is not None:
                    metrics[str(key)] = metric_value(value)
        p = data.get("progress")
        if isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 100:
            progress = int(p)
    return metrics, progress
