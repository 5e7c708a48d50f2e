"""Extra links of a TrainJob task: "TrainJob page" (the provider's page of the task's TrainJob, always) and
"TrainJob" (a dashboard URL from ``[trainflow] dashboard_url_template``, when one is configured)."""

from __future__ import annotations

from typing import Any

from trainflow.airflow import _config
from trainflow.airflow.compat_sdk import BaseOperatorLink

XCOM_KEY = "trainjob"


def dashboard_template() -> str:
    return _config.get("dashboard_url_template").strip()


def format_link(template: str, ref: dict[str, Any] | None) -> str:
    if not template or not ref:
        return ""
    from trainflow.core.links import dashboard_url

    return dashboard_url(template, ref.get("name"), ref.get("namespace"), ref.get("uid"))


class TrainJobLink(BaseOperatorLink):
    """Link to the TrainJob in a dashboard; only attached to operators when the template is configured."""

    name = "TrainJob"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        template = dashboard_template()
        if not template:
            return ""
        ref = getattr(operator, "_trainjob_ref", None)
        if not ref:
            from trainflow.airflow.compat_sdk import XCom

            try:
                ref = XCom.get_value(ti_key=ti_key, key=XCOM_KEY)
            except Exception:
                ref = None
        return format_link(template, ref if isinstance(ref, dict) else None)


class TrainJobPageLink(BaseOperatorLink):
    """The task instance's TrainJob page on this Airflow (state, progress and ETA, nodes, charts, log tail)."""

    name = "TrainJob page"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from urllib.parse import urlparse

        from trainflow.airflow.job_view import page_path
        from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS

        section = "api" if AIRFLOW_V_3_0_PLUS else "webserver"  # where each line keeps its base_url
        base = urlparse(_config.airflow_option(section, "base_url", "/")).path
        map_index = getattr(ti_key, "map_index", -1)
        return page_path(
            base, ti_key.dag_id, ti_key.run_id, ti_key.task_id, -1 if map_index is None else map_index
        )


def extra_links() -> tuple[BaseOperatorLink, ...]:
    """The links an operator shows: its TrainJob page (served by the plugin: on Airflow 3's API server, on
    Airflow 2's webserver), and the dashboard when a URL template is configured."""
    page: tuple[BaseOperatorLink, ...] = (TrainJobPageLink(),)
    return (*page, TrainJobLink()) if dashboard_template() else page
