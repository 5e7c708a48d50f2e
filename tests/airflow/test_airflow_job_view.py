"""The TrainJob page's data, without a web server: a task with no TrainJob, a running one read live from the
local engine through the task's connection (read in Chromium), and one whose connection cannot be used."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from browser import chart_points, chromium
from trainflow.airflow.job_view import page_path, render_page


def paced(reports: int = 40, seconds: float = 0.25) -> None:
    import time

    from trainflow.core.reporting import report

    for i in range(reports):
        print(f"step {i}", flush=True)
        report(metrics={"loss": 1.0 / (i + 1)}, progress=(i + 1) * 100 // reports)
        time.sleep(seconds)


def test_a_task_without_a_trainjob_is_a_404() -> None:
    status, html = render_page({}, "d.t of r")
    assert status == 404 and "has no TrainJob" in html


def test_a_connection_that_cannot_be_used_is_said_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DEFAULT_BACKEND", "kubernetes")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    status, html = render_page({"trainjob": {"name": "job-a", "namespace": "ml", "conn_id": "nope"}}, "d.t")
    assert status == 200 and "could not read the TrainJob" in html and "ml/job-a" in html


def test_a_running_job_is_read_live(
    trainflow_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainflow.core import TrainJobRequest, get_backend

    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DEFAULT_BACKEND", "local")
    monkeypatch.setenv("TRAINFLOW_HOME", str(trainflow_home))
    backend = get_backend("local", home=str(trainflow_home))
    ref = backend.submit(
        TrainJobRequest(runtime="jax-distributed", function=paced, num_nodes=1, idempotency_key="page-live")
    )
    xcoms: dict[str, Any] = {"trainjob": {"name": ref.name, "namespace": ref.namespace, "conn_id": "absent"}}
    lines = Path(backend.job_dir(ref)) / "reports.jsonl"
    for _ in range(600):
        if lines.exists() and len(lines.read_text().splitlines()) >= 5:
            break
        time.sleep(0.1)
    status, html = render_page(xcoms, "d.t")
    seen = len(lines.read_text().splitlines())
    backend.cancel(ref)
    assert status == 200 and 'http-equiv="refresh"' in html
    (tmp_path / "page.html").write_text(html)
    with chromium() as browser:
        page = browser.new_page()
        page.goto((tmp_path / "page.html").as_uri())
        drawn = chart_points(page)
        assert 5 <= drawn["loss"] <= seen and drawn["progress"] == drawn["loss"]
        assert page.locator("#tf-state").inner_text() == "Running"
        assert page.locator("table.nodes td", has_text="node-0").count() == 1
        assert "step 0" in page.locator("#tf-log").inner_text()


def test_page_paths_quote_what_a_run_id_holds() -> None:
    path = page_path("/af", "d", "scheduled__2026-01-01T00:00:00+00:00", "t", 3)
    assert path == "/af/trainflow/jobs/d/scheduled__2026-01-01T00%3A00%3A00%2B00%3A00/t?map_index=3"
