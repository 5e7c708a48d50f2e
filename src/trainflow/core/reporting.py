"""Reporting from training code: ``report(metrics=..., progress=...)`` and ``output_dir()``.

Where a report goes, in order: the Trainer's status server (``KUBEFLOW_TRAINER_SERVER_URL``, as
``trainerStatus``), the local engine's job state (``TRAINFLOW_LOCAL_JOB_DIR``: ``metrics.json``, and every
report appended to ``reports.jsonl``), else one structured ``TRAINFLOW_REPORT {json}`` line on stdout that
backends parse from rank 0's log. Only rank 0 reports. ``report`` never raises into training code; a failed
delivery logs a warning. A report with progress and no ETA gets one extrapolated from this process's first
progress report (the Trainer's ``estimatedRemainingSeconds``).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

log = logging.getLogger("trainflow.report")

SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
SERVER_TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
SERVER_CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
LOCAL_JOB_ENV = "TRAINFLOW_LOCAL_JOB_DIR"
OUTPUT_ENV = "TRAINFLOW_OUTPUT_URI"
STAGING_ENV = "TRAINFLOW_OUTPUT_STAGING"
REPORT_PREFIX = "TRAINFLOW_REPORT "
RETURN_PREFIX = "TRAINFLOW_RETURN "  # a function trainer's return value (function_trainer prints it)
MAX_RETURN_BYTES = 64 * 1024
MAX_METRIC_CHARS = 64
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID", "DMLC_TASK_ID", "PET_NODE_RANK")

MAX_ETA_SECONDS = 2**31 - 1  # the CRD's int32

# Everything reported so far by this process: the status server replaces trainerStatus wholesale.
_sent: dict[str, float | str] = {}
_sent_progress: list[int] = []
_first_progress: list[tuple[float, int]] = []  # (monotonic time, progress) of the first progress report


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: float | str) -> str:
    text = (
        repr(float(value)) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)
    )
    return text[:MAX_METRIC_CHARS]


def is_rank0() -> bool:
    """True in the process whose reports count: global rank 0 (``RANK`` unset or "0", likewise per launcher)."""
    for name in RANK_VARS:
        value = os.environ.get(name)
        if value is not None and value.strip() != "":
            return value.strip() == "0"
    return True


def _clean(metrics: Mapping[str, float | str] | None) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for key, value in (metrics or {}).items():
        name = str(key)[:MAX_METRIC_CHARS]
        if isinstance(value, int | float):  # bool is an int
            out[name] = float(value)
        else:
            out[name] = str(value)[:MAX_METRIC_CHARS]
    return out


def numeric_metrics(values: Mapping[str, Any] | None) -> dict[str, float]:
    """The finite numbers of a framework's log record (a 0-d tensor counts), as report() metrics."""
    import math

    out: dict[str, float] = {}
    for key, value in (values or {}).items():
        if hasattr(value, "item"):  # a 0-d tensor (TorchTune's grad_norm)
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


def _progress(progress: int | None) -> int | None:
    return None if progress is None else max(0, min(100, int(progress)))


def _eta(progress: int | None, given: float | None) -> int | None:
    """Seconds remaining: as given, else the rate since the first progress report carried to 100 %."""
    if given is not None:
        return max(0, min(MAX_ETA_SECONDS, round(given)))
    if progress is None:
        return None
    now = time.monotonic()
    if not _first_progress:
        _first_progress.append((now, progress))
    started, first = _first_progress[0]
    if progress >= 100:
        return 0
    if progress <= first or now <= started:
        return None
    return min(MAX_ETA_SECONDS, round((now - started) * (100 - progress) / (progress - first)))


def _post(url: str, metrics: dict[str, float | str], progress: int | None, eta: int | None) -> None:
    body: dict[str, Any] = {"lastUpdatedTime": _now()}
    if metrics:
        body["metrics"] = [{"name": k, "value": _text(v)} for k, v in metrics.items()]
    if progress is not None:
        body["progressPercentage"] = progress
    if eta is not None:
        body["estimatedRemainingSeconds"] = eta
    data = json.dumps({"trainerStatus": body}).encode()
    headers = {"Content-Type": "application/json"}
    token_file = os.environ.get(SERVER_TOKEN_ENV)
    if token_file:
        headers["Authorization"] = "Bearer " + Path(token_file).read_text(encoding="utf-8").strip()
    ca = os.environ.get(SERVER_CA_ENV)
    context = ssl.create_default_context(cafile=ca) if ca else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        response.read()


def _write_local(
    jobdir: Path, metrics: dict[str, float | str], progress: int | None, eta: int | None
) -> None:
    """Merge into ``metrics.json`` (what a read shows) and append the merged state to ``reports.jsonl``
    (every report, in order, for the history), as the status server would replace trainerStatus."""
    from trainflow.core.local import store

    with store.locked(jobdir / store.METRICS_LOCK):
        current = store.read_json(jobdir / store.METRICS_FILE)
        state: dict[str, Any] = current if isinstance(current, dict) else {}
        merged = dict(state.get("metrics") or {})
        merged.update(metrics)
        state["metrics"] = merged
        if progress is not None:
            state["progressPercentage"] = progress
        state.pop("estimatedRemainingSeconds", None)  # an ETA is only as fresh as its report
        if eta is not None:
            state["estimatedRemainingSeconds"] = eta
        state["lastUpdatedTime"] = store.now_iso()
        store.append_line(jobdir / store.REPORTS_FILE, state)
        store.write_json(jobdir / store.METRICS_FILE, state)


def report(
    metrics: Mapping[str, float | str] | None = None,
    progress: int | None = None,
    eta_seconds: float | None = None,
) -> None:
    """Report metrics (last value per name wins), progress (0-100) and the estimated seconds remaining of the
    running TrainJob (extrapolated from progress when not given).

    Safe to call from every rank: only rank 0's reports are kept. Never raises.
    """
    try:
        clean = _clean(metrics)
        pct = _progress(progress)
        if not is_rank0() or (not clean and pct is None and eta_seconds is None):
            return
        eta = _eta(pct, eta_seconds)
        url = os.environ.get(SERVER_URL_ENV)
        if url:
            _sent.update(clean)
            if pct is not None:
                _sent_progress[:] = [pct]
            _post(url, dict(_sent), _sent_progress[0] if _sent_progress else None, eta)
            return
        jobdir = os.environ.get(LOCAL_JOB_ENV)
        if jobdir:
            _write_local(Path(jobdir), clean, pct, eta)
            return
        line: dict[str, Any] = {"metrics": clean}
        if pct is not None:
            line["progress"] = pct
        if eta is not None:
            line["eta_seconds"] = eta
        sys.stdout.write(REPORT_PREFIX + json.dumps(line, sort_keys=True) + "\n")
        sys.stdout.flush()
    except Exception as exc:  # training must go on whatever happens to a report
        log.warning("trainflow.report could not deliver the report: %s: %s", type(exc).__name__, exc)


def parse_report_line(line: str) -> dict[str, Any] | None:
    """The payload of one ``TRAINFLOW_REPORT {json}`` log line, or None for any other line."""
    index = line.find(REPORT_PREFIX)
    if index < 0:
        return None
    try:
        data = json.loads(line[index + len(REPORT_PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def return_value(lines: list[str]) -> Any:
    """A function trainer's return value from the tail of rank 0's log (its last ``TRAINFLOW_RETURN`` line)."""
    for line in reversed(lines):
        at = line.find(RETURN_PREFIX)
        if at >= 0:
            try:
                return json.loads(line[at + len(RETURN_PREFIX) :])
            except ValueError:
                return None
    return None


def staging_dir(create: bool = True) -> Path | None:
    """The private directory an ``s3://`` output is staged in before ``publish_output()`` uploads it.

    Per user under the temp dir (the local engine: in the job's directory), mode 0700 whatever the umask; refused when it is a symlink or another user's
    (a shared /tmp). ``create=False``: None when it does not exist."""
    import contextlib
    import stat
    import tempfile

    override = os.environ.get(STAGING_ENV)  # the local engine stages in the job's own directory
    path = Path(override) if override else Path(tempfile.gettempdir()) / f"trainflow-output-{os.getuid()}"
    if create:
        with contextlib.suppress(FileExistsError):  # ranks of one pod may race
            path.mkdir(mode=0o700)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a directory of this user: remove it, or set TMPDIR")
    os.chmod(path, 0o700)
    return path


_staged: list[Path] = []  # set once output_dir() staged an object-store output in this process


def output_staged() -> bool:
    """Whether this process wrote its output to the staging directory (a function trainer then publishes)."""
    return bool(_staged)


def output_dir() -> Path:
    """The directory the trainer must write its model to (``TRAINFLOW_OUTPUT_URI``).

    A file:// URI or an absolute path: that directory, created if missing (under the local engine, its staging
    directory, published to the path when the job completes: docs/artifacts.md). An ``s3://`` URI: a private staging
    directory whose files ``trainflow.core.publish_output()`` uploads under the URI (a function trainer does it
    on rank 0 when the function returns). Raises RuntimeError when the output URI is unset or of another kind.
    """
    uri = os.environ.get(OUTPUT_ENV)
    if not uri:
        raise RuntimeError(f"{OUTPUT_ENV} is not set: run under trainflow, or set output_uri on the request")
    if os.environ.get(STAGING_ENV) and not uri.lower().startswith("s3://"):
        staged = staging_dir()  # the local engine publishes it to the path when every node succeeded
        assert staged is not None
        return staged
    if uri.startswith("/"):
        path = Path(uri)
    else:
        parsed = urlparse(uri)
        if parsed.scheme.lower() == "s3":
            staged = staging_dir()
            assert staged is not None
            _staged[:] = [staged]
            return staged
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise RuntimeError(
                f"{OUTPUT_ENV}={uri!r} is neither a local path nor s3://; write it with your client"
            )
        path = Path(unquote(parsed.path))
    path.mkdir(parents=True, exist_ok=True)
    return path
