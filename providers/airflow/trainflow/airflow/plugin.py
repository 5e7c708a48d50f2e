"""The provider's Airflow plugin: the TrainJob page of a task instance (``job_view``), on Airflow 3's API server
and on Airflow 2's webserver.

Every Airflow process loads plugins, so this module imports nothing: the FastAPI app (Airflow 2: the Flask
blueprint) is built the first time the web server asks for it. ``[trainflow] task_instance_view = True`` also
adds the page as a tab of every task instance page (Airflow's UI cannot yet show a tab for some tasks only); the
"TrainJob page" extra link is there either way.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin
from trainflow.airflow import _config

URL_PREFIX = "/trainflow"


_APPS: list[Any] = []  # the one app of this process, built on first use
_BLUEPRINTS: list[Any] = []  # likewise on Airflow 2's webserver


class TrainflowPlugin(AirflowPlugin):
    name = "trainflow"

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        if not _APPS:
            from trainflow.airflow.job_app import make_app

            _APPS.append(make_app())
        return [{"app": _APPS[0], "url_prefix": URL_PREFIX, "name": "TrainJob pages"}]

    @property
    def flask_blueprints(self) -> list[Any]:  # type: ignore[override]
        """Airflow 2's webserver serves the page from a Flask blueprint (Airflow 3: the FastAPI app above)."""
        from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS

        if AIRFLOW_V_3_0_PLUS:
            return []
        if not _BLUEPRINTS:
            from trainflow.airflow.job_flask import make_blueprint

            _BLUEPRINTS.append(make_blueprint())
        return list(_BLUEPRINTS)

    @property
    def external_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        if _config.get("task_instance_view").strip().lower() not in ("1", "true", "yes", "on"):
            return []
        href = f"{URL_PREFIX}/jobs/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}?map_index={{MAP_INDEX}}"
        return [{"name": "TrainJob", "href": href, "destination": "task_instance", "url_route": "trainjob"}]
