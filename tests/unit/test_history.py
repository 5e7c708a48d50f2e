"""The metrics history: which reports a bounded history keeps, that views never change under a waiter, and
what it costs in JSON (XCom, KFP outputs) and memory at the bound."""

from __future__ import annotations

import json
import math
import time
import tracemalloc
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainflow.core.history import EMPTY, MAX_POINTS, MAX_SERIES, History, HistoryPoint, Recorder
from trainflow.core.observe import Waiter, observe
from trainflow.core.result import JobState, TrainJobResult


def point(i: int, **metrics: float) -> HistoryPoint:
    return HistoryPoint(1_800_000_000.0 + i, min(100, i), float(1000 - i), {"loss": 1.0 / (i + 1), **metrics})


def kept_reports(count: int) -> list[int]:
    """The report numbers a history of ``count`` reports keeps, from the documented rule: the smallest
    power-of-two stride s with at most MAX_POINTS multiples of s below ``count``, those multiples, and the
    latest report."""
    stride = 1
    while (count - 1) // stride + 1 > MAX_POINTS:
        stride *= 2
    return sorted({*range(0, count, stride), count - 1})


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=5000))
def test_keeps_evenly_spaced_reports_and_the_latest(count: int) -> None:
    rec = Recorder()
    for i in range(count):
        rec.add(point(i))
    view = rec.view()
    assert [int(p.time - 1_800_000_000) for p in view] == kept_reports(count)
    assert view.seen == count
    assert len(view) <= MAX_POINTS + 1
    if count > MAX_POINTS:
        assert len(view) >= MAX_POINTS // 2 + 1


def test_a_view_never_changes_after_it_was_handed_out() -> None:
    rec = Recorder()
    views: list[tuple[History, list[HistoryPoint]]] = []
    for i in range(3 * MAX_POINTS):
        extra = {f"m{i}": float(i)} if i % 50 == 0 else {}  # new series appear along the way
        rec.add(point(i, **extra))
        if i % 37 == 0:
            view = rec.view()
            views.append((view, list(view)))
    for view, then in views:
        assert list(view) == then


def test_series_are_bounded_and_numbers_only() -> None:
    rec = Recorder()
    rec.add(HistoryPoint(1.0, None, None, {f"m{i:02}": float(i) for i in range(MAX_SERIES + 5)}))
    rec.add(HistoryPoint(2.0, 5, None, {"m00": 1.0, "late": 2.0}))
    view = rec.view()
    assert view.names() == [f"m{i:02}" for i in range(MAX_SERIES)]
    assert view.series("m01") == [1.0, None]
    assert view.progress() == [None, 5]


def test_json_round_trip_with_gaps_and_non_finite_values() -> None:
    rec = Recorder()
    rec.add(HistoryPoint(1.5, 10, 30.0, {"loss": 0.123456789}))
    rec.add(HistoryPoint(2.25, None, None, {"acc": 0.5}))
    data = json.loads(json.dumps(rec.view().to_dict(), allow_nan=False))
    assert data["time"] == [1.5, 2.25]
    assert data["metrics"] == {"loss": [0.123457, None], "acc": [None, 0.5]}
    back = History.from_dict(data)
    assert back == History.from_dict(back.to_dict())
    assert [p.metrics for p in back] == [{"loss": 0.123457}, {"acc": 0.5}]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"time": "x"},
        {"time": [1, "x"]},
        {"time": [1, 2], "metrics": {"a": [1]}, "progress": [900, 5]},
    ],
)
def test_a_malformed_payload_reads_as_far_as_it_can(bad: object) -> None:
    history = History.from_dict(bad)
    assert len(history) in (0, 2)
    if len(history) == 2:
        assert history.series("a") == [None, None] and history.progress() == [None, 5]


def test_a_huge_payload_is_downsampled_on_read() -> None:
    n = 10 * MAX_POINTS
    data = {"time": list(range(n)), "metrics": {"loss": [1.0] * n}}
    assert len(History.from_dict(data)) <= MAX_POINTS + 1


def result_at_bound(series: int) -> TrainJobResult:
    """The largest history: MAX_POINTS + 1 points of ``series`` metrics, every value 17 significant digits."""
    rec = Recorder()
    for i in range(8 * MAX_POINTS):  # stride 8: 256 kept, the latest off the stride
        rec.add(
            HistoryPoint(
                1_800_000_000.123 + i * 3.7,
                i % 101,
                float(10**6 + i),
                {
                    f"metric_name_of_sixty_four_chars_{k:02}".ljust(64, "x"): math.pi / (i + k + 1)
                    for k in range(series)
                },
            )
        )
    return TrainJobResult(name="j" * 63, namespace="n" * 63, state=JobState.COMPLETE, history=rec.view())


@pytest.mark.parametrize(("series", "limit_kib"), [(3, 16), (MAX_SERIES, 64)])
def test_serialized_size_at_the_bound(series: int, limit_kib: int) -> None:
    """XCom rows and KFP output parameters stay small: at most 64 KiB at the bound (docs/history.md)."""
    result = result_at_bound(series)
    assert len(result.history) == MAX_POINTS + 1
    size = len(json.dumps(result.to_dict(), separators=(",", ":")))
    print(f"\n{series} series at the bound: {size / 1024:.1f} KiB of JSON")
    assert size <= limit_kib * 1024
    assert TrainJobResult.from_dict(json.loads(json.dumps(result.to_dict()))).history == result.history


def test_memory_per_job_at_the_bound() -> None:
    """What a waiter holds for one job's history at the bound (3 series), recorder and latest view."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    recs = []
    for _ in range(50):
        rec = Recorder()
        for i in range(4 * MAX_POINTS):
            rec.add(point(i, acc=0.5, lr=0.1))
        rec.view()
        recs.append(rec)
    used = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "lineno")) / len(recs)
    tracemalloc.stop()
    print(f"\nhistory at the bound, 3 series: {used / 1024:.1f} KiB per job")
    assert used < 16 * 1024


def test_observe_records_each_distinct_report_at_its_own_time() -> None:
    waiter = Waiter(deadline=time.time() + 60)
    base = {"metadata": {"name": "j", "namespace": "n"}, "spec": {}}
    running = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}
    ts = {"progressPercentage": 5, "estimatedRemainingSeconds": 95, "lastUpdatedTime": "2026-11-29T10:00:07Z"}
    out = observe(waiter, {**base, "status": running}, 100.0)
    assert out.result is not None and out.result.history is EMPTY
    out = observe(waiter, {**base, "status": {**running, "trainerStatus": ts}}, 101.0)
    assert out.changed and out.result is not None
    assert out.result.eta_seconds == 95 and out.result.reported_at == datetime(
        2026, 11, 29, 10, 0, 7, tzinfo=UTC
    )
    [only] = list(out.result.history)
    assert only == HistoryPoint(datetime(2026, 11, 29, 10, 0, 7, tzinfo=UTC).timestamp(), 5, 95.0, {})
    again = observe(waiter, {**base, "status": {**running, "trainerStatus": dict(ts)}}, 102.0)
    assert not again.changed and again.result is not None and again.result.history is out.result.history
