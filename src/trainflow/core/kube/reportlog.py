"""Metrics/progress from rank 0's log: the last ``TRAINFLOW_REPORT {json}`` line printed by trainflow.core.report."""

from __future__ import annotations

from collections.abc import Iterable

from trainflow.core.reporting import parse_report_line
from trainflow.core.result import metric_value


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
