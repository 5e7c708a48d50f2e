"""One TrainJob as a self-contained HTML page: state, progress and ETA, summary, latest metrics, the history's
charts (``core/charts.py``), and where the caller has them, per-node state and rank 0's log tail.

Self-contained: inline style and inline SVG, no script, and a Content-Security-Policy that lets the browser
fetch nothing, so it renders the same in an air-gapped KFP UI (the ``train_job`` step's HTML artifact), the
Airflow TrainJob page and a file. Every value from the job (names, metric names, messages, log lines) is
escaped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from trainflow.core.charts import duration, number, panels
from trainflow.core.result import JobState, TrainJobResult

STATE_COLORS = {
    JobState.QUEUED: "#9a6700",
    JobState.CREATED: "#57606a",
    JobState.RUNNING: "#1f6feb",
    JobState.COMPLETE: "#1a7f37",
    JobState.FAILED: "#d1242f",
}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;color:#1f2328;margin:16px 20px;background:#f6f8fa}
h1{font-size:18px;margin:0 0 10px}h2{font-size:15px;margin:18px 0 8px}
.state{display:inline-block;padding:1px 9px;border-radius:10px;color:#fff;font-size:13px;vertical-align:2px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;margin:0 0 10px}
.bar{height:14px;background:#eaeef2;border-radius:7px;overflow:hidden;margin:6px 0}
.bar>div{height:100%;background:#1f6feb}
table{border-collapse:collapse}td,th{padding:3px 12px 3px 0;text-align:left;vertical-align:top}
th{color:#656d76;font-weight:500}td.num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:flex;flex-wrap:wrap;gap:10px}.charts svg{border:1px solid #d0d7de;border-radius:6px}
pre{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px;overflow:auto;max-height:420px;
font:12px/1.4 ui-monospace,monospace;white-space:pre-wrap}.muted{color:#656d76}
"""


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def _rows(rows: Sequence[tuple[str, str]], css: str = "") -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows if v)
    return f'<table class="{css}">{body}</table>'


def progress_line(result: TrainJobResult, now: float | None = None) -> str:
    """``42 % · ETA 3m 20s · last report 12s ago`` while it runs (the parts that are known); ``100 %`` after."""
    now = time.time() if now is None else now
    parts = []
    if result.progress is not None:
        parts.append(f"{result.progress} %")
    if not result.state.terminal:
        if result.eta_seconds is not None:
            parts.append(f"ETA {duration(result.eta_seconds)}")
        if result.reported_at is not None:
            parts.append(f"last report {duration(now - result.reported_at.timestamp())} ago")
    return " · ".join(parts)


def _summary(result: TrainJobResult) -> list[tuple[str, str]]:
    history = result.history
    kept = ""
    if history.seen:
        kept = f"{len(history)} points of {history.seen} reports" + (
            f" (1 in {history.stride} kept, and the latest)" if history.stride > 1 else ""
        )
    return [
        ("runtime", result.runtime or ""),
        ("attempt", str(result.attempt or "")),
        ("created", _when(result.created_at)),
        ("started", _when(result.started_at)),
        ("finished", _when(result.finished_at)),
        ("duration", duration(result.duration_seconds) if result.duration_seconds is not None else ""),
        ("Kueue LocalQueue", result.queue or ""),
        ("queued", duration(result.queued_seconds) if result.queued_seconds is not None else ""),
        ("preemptions", str(result.preemptions) if result.preemptions else ""),
        ("output", result.output_uri or ""),
        ("message", result.message or "" if not result.succeeded else ""),
        ("history", kept),
    ]


def _nodes(nodes: Sequence[Mapping[str, Any]]) -> str:
    cols = ("name", "step", "phase", "ready", "restarts", "exit_code", "reason")
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{escape(str(n.get(c) if n.get(c) is not None else ''))}</td>" for c in cols)
        + "</tr>"
        for n in nodes
    )
    return f'<table class="nodes"><tr>{head}</tr>{body}</table>'


def render(
    result: TrainJobResult,
    *,
    heading: str = "",
    nodes: Sequence[Mapping[str, Any]] | None = None,
    log_tail: Sequence[str] | None = None,
    notes: Sequence[str] = (),
    refresh_seconds: int | None = None,
    now: float | None = None,
) -> str:
    """The page. ``nodes``: one mapping per pod (name, step, phase, ready, restarts, exit_code, reason);
    ``notes``: lines shown under the title (where the data came from, what could not be read);
    ``refresh_seconds``: the browser reloads the page that often (a running job), without any script."""
    job = f"{result.namespace}/{result.name}"
    color = STATE_COLORS.get(result.state, "#57606a")
    state = result.state.value + (f" ({result.reason})" if result.reason else "")
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_seconds)}">' if refresh_seconds else ""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        refresh,
        f"<title>TrainJob {escape(job)}: {escape(result.state.value)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(heading or 'TrainJob')} <code>{escape(job)}</code> "
        f'<span class="state" id="tf-state" style="background:{color}">{escape(state)}</span></h1>',
    ]
    out += [f'<p class="muted tf-note">{escape(n)}</p>' for n in notes]
    pct = result.progress if result.progress is not None else (100 if result.succeeded else 0)
    out.append(
        f'<div class="card"><div class="bar" id="tf-progress" data-progress="{pct}"><div style="width:{pct}%">'
        f'</div></div><span id="tf-progress-text">{escape(progress_line(result, now) or "no progress reported")}'
        "</span></div>"
    )
    out.append(f'<div class="card">{_rows(_summary(result), "summary")}</div>')
    if result.metrics:
        rows = "".join(
            f'<tr><th>{escape(k)}</th><td class="num">{escape(number(v) if isinstance(v, float) else str(v))}</td></tr>'
            for k, v in sorted(result.metrics.items())
        )
        out.append(f'<h2>Latest metrics</h2><div class="card"><table class="metrics">{rows}</table></div>')
    charts = panels(result.history)
    out.append("<h2>History</h2>")
    if charts:
        out.append('<div class="charts" id="tf-charts">' + "".join(svg for _, svg in charts) + "</div>")
    else:
        out.append('<p class="muted">No reports were seen while waiting (docs/history.md says when).</p>')
    if nodes is not None:
        out.append(f'<h2>Nodes</h2><div class="card">{_nodes(nodes) if nodes else "no pods"}</div>')
    if log_tail is not None:
        text = "\n".join(line.rstrip("\n") for line in log_tail) or "(empty)"
        out.append(f'<h2>Rank 0 log, last {len(log_tail)} lines</h2><pre id="tf-log">{escape(text)}</pre>')
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out.append(f'<p class="muted">Rendered by trainflow at {stamp}.</p></body></html>')
    return "\n".join(part for part in out if part)
