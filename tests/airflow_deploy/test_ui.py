"""The Airflow UI in a real browser (Debian's Chromium driven by Playwright): what a user sees of a TrainJob task.

Screenshots go to ``$TRAINFLOW_UI_SCREENSHOT_DIR`` (the docs keep the ones in docs/airflow/: run
``make e2e-airflow TRAINFLOW_UI_SCREENSHOT_DIR=$PWD/docs/airflow`` to refresh them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from airflow_deployment import Deployment
from airflow_rest import Airflow, wait_for

from bounds import HANG

pytestmark = pytest.mark.e2e

DASHBOARD = "https://kubeflow.example.com/trainer/{namespace}/trainjobs/{name}"
CONN_FIELDS = {  # connection extra -> label in the form
    "backend": "Backend",
    "in_cluster": "In cluster",
    "kubeconfig_path": "Kubeconfig path",
    "kubeconfig": "Kubeconfig (inline)",
    "context": "Kubeconfig context",
    "namespace": "Namespace",
    "local_home": "Local state directory",
}


def screenshot(page: Any, deployment: Deployment, name: str) -> Path:
    out = Path(os.environ.get("TRAINFLOW_UI_SCREENSHOT_DIR") or deployment.root / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def test_task_page_streams_the_log_and_links_the_trainjob(
    deployment: Deployment, api: Airflow, page: Any, run_id: str
) -> None:
    """While the job runs (task deferred), the task's log view shows rank 0's training lines; once done,
    the Details tab has the "TrainJob" extra link pointing at the dashboard."""
    dag = "tf_deploy_defer"
    api.trigger(dag, run_id, {"steps": 40, "step_seconds": 1.0})
    assert api.wait_ti_state(dag, run_id, "train", {"deferred", "success", "failed"})["state"] == "deferred"
    task_url = f"{deployment.base_url}/dags/{dag}/runs/{run_id}/tasks/train"
    page.goto(task_url)
    page.get_by_text(re.compile(r"\[node-0\] step \d+/40 loss")).first.wait_for(timeout=120_000)
    ref = api.xcom(dag, run_id, "train", key="trainjob")  # pushed before the task deferred
    job = deployment.local_backend().get(ref["name"])
    assert job.state.value == "Running", job  # the lines came while the job ran
    assert page.get_by_text("Deferred", exact=True).first.is_visible()
    screenshot(page, deployment, "ui-task-log-while-running")

    run = api.wait_run(dag, run_id, timeout=300)
    assert run["state"] == "success", run
    result = api.xcom(dag, run_id, "train")
    page.goto(f"{task_url}/details")
    link = page.get_by_role("link", name="TrainJob", exact=True)
    link.wait_for()
    assert link.get_attribute("href") == DASHBOARD.format(namespace=result["namespace"], name=result["name"])
    assert page.get_by_role("heading", name="Extra Links").is_visible()
    assert api.links(dag, run_id, "train")["TrainJob"] == link.get_attribute("href")
    link.scroll_into_view_if_needed()
    screenshot(page, deployment, "ui-task-extra-link")


def test_connection_form_shows_the_trainflow_fields(deployment: Deployment, api: Airflow, page: Any) -> None:
    page.goto(f"{deployment.base_url}/connections", wait_until="networkidle")
    page.get_by_role("button", name=re.compile("Add Connection")).click()
    kind = page.get_by_role("combobox")
    kind.click()
    kind.fill("Kubeflow")
    page.get_by_role("option", name="Kubeflow Trainer", exact=True).click()
    page.get_by_text("Extra Fields", exact=True).click()
    dialog = page.get_by_role("dialog")
    for field, label in CONN_FIELDS.items():
        row = dialog.get_by_role("group").filter(has=page.locator("label", has_text=label))
        wait_for(lambda row=row: row.count() == 1 and row.is_visible(), HANG, f"the {label!r} field")
        assert row.locator(f"input[name=element_{field}]").count() == 1, (field, row.inner_html()[:500])
    # the inline kubeconfig is a secret: a password input, never echoed
    assert dialog.locator("input[name=element_kubeconfig]").get_attribute("type") == "password"
    # the standard fields the connection does not use are hidden
    for hidden in ("Host", "Login", "Password", "Port", "Schema"):
        assert dialog.locator("label", has_text=re.compile(rf"^{hidden}$")).count() == 0, hidden
    dialog.locator("input[name=element_kubeconfig_path]").scroll_into_view_if_needed()
    screenshot(page, deployment, "ui-connection-form")
    meta = {m["connection_type"]: m for m in api.hook_meta()}
    assert set(meta["kubeflow_trainer"]["extra_fields"]) == set(CONN_FIELDS)
