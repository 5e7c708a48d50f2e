"""The HTML page and SVG charts of a TrainJob, read by a real browser (Debian's Chromium): the points each chart
draws, gaps, the log scale, escaping of everything that comes from the job, and that nothing is fetched."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from browser import chart_points, chromium, record_requests
from trainflow.core import charts, job_page
from trainflow.core.history import History, HistoryPoint, Recorder
from trainflow.core.result import JobState, TrainJobResult

T0 = 1_800_000_000.0
HOSTILE = '<img src=x onerror="document.title=1">'


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    p = context.new_page()
    yield p
    context.close()


def history(reports: int) -> History:
    """A loss falling over four decades, an eval metric every 10th report, progress, an ETA."""
    rec = Recorder()
    for i in range(reports):
        metrics = {"loss": 10 * math.exp(-i / 25) + 1e-3}
        if i % 10 == 0:
            metrics["eval_acc"] = min(1.0, i / reports)
        rec.add(HistoryPoint(T0 + 2.5 * i, i * 100 // (reports - 1), 2.5 * (reports - i), metrics))
    return rec.view()


def expected(h: History) -> dict[str, int]:
    out = {"progress": sum(p is not None for p in h.progress())}
    out.update({name: sum(v is not None for v in h.series(name)) for name in h.names()})
    return out


def open_html(page: Any, tmp_path: Path, html: str, name: str = "page.html") -> list[str]:
    path = tmp_path / name
    path.write_text(html, encoding="utf-8")
    requests = record_requests(page)
    page.goto(path.as_uri())
    return [u for u in requests if u != path.as_uri()]


def test_the_page_draws_every_point_of_the_history(page: Any, tmp_path: Path) -> None:
    h = history(300)  # over the bound: 1 in 2 kept, and the latest
    assert len(h) == 151
    result = TrainJobResult(
        name="demo",
        namespace="ml",
        state=JobState.RUNNING,
        progress=60,
        eta_seconds=200,
        reported_at=datetime.fromtimestamp(T0 + 700, UTC),
        metrics={"loss": 0.5, "phase": "train"},
        history=h,
    )
    fetched = open_html(page, tmp_path, job_page.render(result, refresh_seconds=30, now=T0 + 712))
    assert fetched == []  # nothing outside the page: no script, style, font or image
    drawn = chart_points(page)
    assert drawn == expected(h) == {"progress": 151, "loss": 151, "eval_acc": 30}
    assert page.locator("g[data-series=eval_acc] polyline").count() == 30  # every gap breaks the line
    assert page.locator("svg[aria-label^='loss'] text", has_text="log scale").count() == 1
    assert page.locator("#tf-progress").get_attribute("data-progress") == "60"
    assert page.locator("#tf-progress-text").inner_text() == "60 % · ETA 3m 20s · last report 12s ago"
    assert page.locator("meta[http-equiv=refresh]").get_attribute("content") == "30"
    assert (
        "151 points of 300 reports (1 in 2 kept, and the latest)"
        in page.locator("table.summary").inner_text()
    )


def test_what_comes_from_the_job_is_text_never_markup(page: Any, tmp_path: Path) -> None:
    rec = Recorder()
    rec.add(HistoryPoint(T0, 5, None, {HOSTILE: 1.0}))
    result = TrainJobResult(
        name="j",
        namespace="n",
        state=JobState.FAILED,
        reason=HOSTILE,
        message=HOSTILE,
        metrics={HOSTILE: HOSTILE},
        history=rec.view(),
    )
    nodes = [{"name": HOSTILE, "step": "node", "phase": "Failed", "exit_code": 3, "reason": HOSTILE}]
    html = job_page.render(
        result, nodes=nodes, log_tail=["</pre><script>document.title=2</script>"], notes=[HOSTILE]
    )
    assert open_html(page, tmp_path, html) == []
    assert page.locator("img").count() == 0 and page.locator("script").count() == 0
    assert page.title().startswith("TrainJob n/j")
    assert HOSTILE in page.locator("#tf-state").inner_text()
    assert "</pre><script>" in page.locator("#tf-log").inner_text()
    assert chart_points(page) == {"progress": 1, HOSTILE: 1}


def test_a_job_without_reports(page: Any, tmp_path: Path) -> None:
    result = TrainJobResult(name="j", namespace="n", state=JobState.CREATED)
    open_html(page, tmp_path, job_page.render(result))
    assert chart_points(page) == {}
    assert page.get_by_text("No reports were seen while waiting").is_visible()


def test_a_queued_job_shows_kueues_word(page: Any, tmp_path: Path) -> None:
    result = TrainJobResult(
        name="j",
        namespace="n",
        state=JobState.QUEUED,
        reason="Pending",
        message="waiting in LocalQueue team (ClusterQueue cq): insufficient unused quota for cpu",
        queue="team",
        queued_seconds=200.0,
        preemptions=1,
    )
    open_html(page, tmp_path, job_page.render(result))
    summary = page.locator("table.summary").inner_text()
    assert "Kueue LocalQueue\tteam" in summary and "queued\t3m 20s" in summary
    assert "preemptions\t1" in summary and "insufficient unused quota for cpu" in summary
    assert page.locator("#tf-state").inner_text() == "Queued (Pending)"


def test_the_svg_file_is_one_document_of_every_chart(page: Any, tmp_path: Path) -> None:
    h = history(40)
    fetched = open_html(page, tmp_path, charts.document(h, "ml/demo"), "chart.svg")
    assert fetched == []
    assert chart_points(page) == expected(h) == {"progress": 40, "loss": 40, "eval_acc": 4}
    only = charts.document(h, "ml/demo", metrics=["loss"])
    open_html(page, tmp_path, only, "loss.svg")
    assert chart_points(page) == {"loss": 40}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.4, "59s"), (60, "1m"), (200, "3m 20s"), (3600, "1h"), (3900, "1h 5m"), (90000, "1d 1h")],
)
def test_durations(seconds: float, text: str) -> None:
    assert charts.duration(seconds) == text


def test_ticks_are_round_and_cover_the_values() -> None:
    low, high, ticks = charts.linear_ticks(0.13, 0.87)
    assert (low, high) == (0.0, 1.0) and ticks[0] == low and ticks[-1] == high
    end, xticks = charts.time_ticks(700)
    assert end >= 700 and xticks[0] == 0 and len(xticks) <= 6
