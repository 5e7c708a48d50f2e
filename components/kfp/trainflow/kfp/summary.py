"""The step's Markdown summary (``Output[Markdown]``, shown by the KFP UI): job, state, metrics, model, link."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainflow.kfp.params import resolved

DASHBOARD_ENV = "TRAINFLOW_DASHBOARD_URL_TEMPLATE"
MAX_FILES_LISTED = 20


def dashboard_template(param: str | None) -> str:
    """The step parameter, else ``$TRAINFLOW_DASHBOARD_URL_TEMPLATE`` (e.g. set on every step by a TaskConfig)."""
    return resolved(param) or os.environ.get(DASHBOARD_ENV, "").strip()


def _text(value: Any) -> str:
    """A table cell: one line, no column breaks, no raw HTML."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(value: Any) -> str:
    return "`" + _text(value).replace("`", "'") + "`"


def _url(url: str) -> str:
    return url.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else _text(value)


def render(
    result: Any,
    *,
    link: str = "",
    launched: str | None = None,
    framework: str | None = None,
    model: Mapping[str, Any] | None = None,
) -> str:
    """Markdown for one TrainJob result; ``launched`` is the launch line, ``model`` the Model's metadata."""
    job = f"{result.namespace}/{result.name}"
    rows: list[tuple[str, str]] = [("TrainJob", f"[{_code(job)}]({_url(link)})" if link else _code(job))]
    state = result.state.value + (f" ({_text(result.reason)})" if result.reason else "")
    rows.append(("state", state))
    if result.runtime:
        rows.append(("runtime", _code(result.runtime) + (f" ({_text(framework)})" if framework else "")))
    if result.attempt:
        rows.append(("attempt", str(result.attempt)))
    if launched:
        rows.append(("launch", _text(launched)))
    if result.duration_seconds is not None:
        rows.append(("duration", f"{result.duration_seconds:.1f} s"))
    if result.queue:
        rows.append(("Kueue LocalQueue", _code(result.queue)))
    if result.queued_seconds is not None:
        rows.append(("queued", f"{result.queued_seconds:.1f} s"))
    if result.preemptions:
        rows.append(("preemptions", str(result.preemptions)))
    if result.message and not result.succeeded:
        rows.append(("message", _text(result.message)))
    rows.extend(_model_rows(model, result.output_uri))
    lines = [f"## TrainJob {_code(job)}: {result.state.value}", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    if result.metrics:
        lines += ["", "### Metrics", "", "| metric | value |", "|---|---:|"]
        lines += [f"| {_text(k)} | {_number(v)} |" for k, v in sorted(result.metrics.items())]
    return "\n".join(lines) + "\n"


def _model_rows(model: Mapping[str, Any] | None, output_uri: str | None) -> list[tuple[str, str]]:
    meta = model or {}
    files = list(meta.get("files") or [])
    location = meta.get("model_uri") or output_uri
    rows = []
    if location:
        rows.append(("trainer output", _code(location)))
    if files:
        shown = ", ".join(_code(f) for f in files[:MAX_FILES_LISTED])
        more = f" and {len(files) - MAX_FILES_LISTED} more" if len(files) > MAX_FILES_LISTED else ""
        rows.append(("Model artifact", f"{len(files)} file(s): {shown}{more}"))
    elif "files" in meta:
        rows.append(("Model artifact", "empty: the trainer wrote no files"))
    elif model is not None and location:
        rows.append(("Model artifact", "metadata only (the files stay at the trainer output)"))
    return rows


def write(artifact: Any | None, text: str) -> None:
    """Write the Markdown into the artifact's local path (KFP uploads it after the step)."""
    if artifact is None:
        return
    path = Path(artifact.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
