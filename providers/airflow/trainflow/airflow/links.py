"""The "TrainJob" extra link: a dashboard URL from ``[trainflow] dashboard_url_template``."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink
from trainflow.airflow import _config

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
            from airflow.sdk.execution_time.xcom import XCom

            try:
                ref = XCom.get_value(ti_key=ti_key, key=XCOM_KEY)
            except Exception:
                ref = None
        return format_link(template, ref if isinstance(ref, dict) else None)


def extra_links() -> tuple[BaseOperatorLink, ...]:
    """The links an operator shows: none unless a dashboard URL template is configured."""
    return (TrainJobLink(),) if dashboard_template() else ()
