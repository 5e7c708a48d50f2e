"""Debian's Chromium, driven by Playwright, reading the HTML pages and SVG charts trainflow renders: what a
browser parsed (``polyline.points``), what it fetched, and screenshots for the docs.

Never a downloaded browser build: a missing ``/usr/bin/chromium`` fails the test with the install command.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT_DIR_ENV = "TRAINFLOW_UI_SCREENSHOT_DIR"

# per chart: the series name, the count it claims, and the points the browser parsed from its polylines
CHART_POINTS_JS = """() => [...document.querySelectorAll("g.tf-series")].map(g => ({
    series: g.dataset.series,
    claimed: Number(g.dataset.points),
    parsed: [...g.querySelectorAll("polyline")].reduce((n, p) => n + p.points.numberOfItems, 0),
    width: g.ownerSVGElement.getBoundingClientRect().width,
}))"""


@contextmanager
def chromium() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: bash tests/airflow_deploy/system_deps.sh installs it", pytrace=False
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def chart_points(page: Any) -> dict[str, int]:
    """Points drawn per series, as the browser parsed them; each chart also says so and is laid out."""
    charts = page.evaluate(CHART_POINTS_JS)
    for chart in charts:
        assert chart["claimed"] == chart["parsed"], chart
        assert chart["width"] > 100, chart
    return {c["series"]: c["parsed"] for c in charts}


def record_requests(page: Any) -> list[str]:
    """Every URL the page asks for from now on (a self-contained page asks for itself only)."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    return seen


def screenshot(page: Any, name: str, default_dir: Path) -> Path:
    """Full-page PNG into ``$TRAINFLOW_UI_SCREENSHOT_DIR`` (the docs' images) or ``default_dir``."""
    out = Path(os.environ.get(SCREENSHOT_DIR_ENV) or default_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def history_points(history: dict[str, Any]) -> dict[str, int]:
    """What the charts of an XCom history must draw: one point per history point that has the series."""
    out = {"progress": sum(p is not None for p in history["progress"])}
    out.update({name: sum(v is not None for v in values) for name, values in history["metrics"].items()})
    return out


def task_page_points(result: dict[str, Any], dag_id: str, task_id: str, tmp_path: Path) -> dict[str, int]:
    """The points Chromium finds drawn on the Airflow TrainJob page of a task whose XCom result is ``result``
    (rendered as the provider's plugin serves it)."""
    from trainflow.airflow.job_view import render_page
    from trainflow.airflow.task_job import Definition, TaskKey

    status, html = render_page(
        TaskKey(dag_id, "run", task_id, -1), {"return_value": result}, Definition(True, None)
    )
    assert status == 200, html[:2000]
    (tmp_path / "page.html").write_text(html)
    with chromium() as browser:
        page = browser.new_page()
        page.goto((tmp_path / "page.html").as_uri())
        return chart_points(page)


def cli_chart_points(result: dict[str, Any], tmp_path: Path) -> dict[str, int]:
    """The points Chromium finds drawn in the SVG that ``trainflow chart --result`` writes from a saved result
    (here an XCom result, as a user saves one)."""
    import json
    import subprocess
    import sys

    saved, svg = tmp_path / "result.json", tmp_path / "chart.svg"
    saved.write_text(json.dumps(result))
    exe = Path(sys.executable).parent / "trainflow"
    done = subprocess.run(
        [str(exe), "chart", "--result", str(saved), "-o", str(svg)],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert done.returncode == 0, done.stderr
    with chromium() as browser:
        page = browser.new_page()
        page.goto(svg.as_uri())
        return chart_points(page)
