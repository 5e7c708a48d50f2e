"""The local engine's metrics history: every report() reaches the waiter's history however fast it comes, a
waiter that attaches after the job ended sees the same history, and the sync and async waits agree."""

from __future__ import annotations

import asyncio
import json

import pytest

from bounds import HANG
from trainflow.core import JobState
from trainflow.core.history import MAX_POINTS, History
from trainflow.core.local.engine import LocalBackend
from trainflow.core.local.reports import REPORTS_FILE

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

REPORTS = 600
TRAIN = f"""
import time
from trainflow.core import report
for i in range({REPORTS}):
    report(metrics={{"loss": 1.0 / (i + 1), "step": i, "phase": "train"}}, progress=i * 100 // {REPORTS - 1})
    if i == 0:
        time.sleep(0.3)  # a waiter that started with the job sees it running
"""


@pytest.fixture
def backend(tests_backend: LocalBackend) -> LocalBackend:
    return tests_backend


def steps(history: History) -> list[int]:
    return [int(p.metrics["step"]) for p in history]


def expected_steps() -> list[int]:
    """core/history.py's rule for REPORTS reports: 600 > 256, so one in 4 (the smallest power of two that
    keeps at most 256), and the latest."""
    return sorted({*range(0, REPORTS, 4), REPORTS - 1})


def test_every_report_reaches_the_history_sync_async_and_late(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "hist", "command": ["python3", "-c", TRAIN], "num_nodes": 2})
    updates: list[History] = []
    result = backend.wait(ref, timeout=HANG, on_update=lambda r: updates.append(r.history))
    assert result.state is JobState.COMPLETE
    history = result.history
    assert history.seen == REPORTS  # rank 0's reports only, none lost to the 50 ms polling
    assert steps(history) == expected_steps() and len(history) <= MAX_POINTS + 1
    assert history.names() == ["loss", "step"]  # "phase" is not a number: metrics only
    assert result.metrics["phase"] == "train" and result.progress == 100
    # the ETA is extrapolated once progress moved past the first report's, and is 0 at 100 %
    assert all((p.eta_seconds is None) == (p.progress == 0) for p in history)
    assert history.latest is not None and history.latest.eta_seconds == 0
    times = history.times()
    assert times == sorted(times)
    assert len(updates) >= 2 and [h.seen for h in updates] == sorted(h.seen for h in updates)

    late = backend.wait(ref, timeout=HANG)  # attaches after the end: the same reports from the job's file
    assert late.history == history
    later = asyncio.run(backend.wait_async(ref, timeout=HANG))
    assert later.history == history
    back = type(result).from_dict(json.loads(json.dumps(result.to_dict(), allow_nan=False)))
    assert steps(back.history) == expected_steps()
    lines = (backend.job_dir(ref) / REPORTS_FILE).read_text().splitlines()
    assert len(lines) == REPORTS
