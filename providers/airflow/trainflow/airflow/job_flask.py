"""The TrainJob page on Airflow 2's Flask webserver: the same page as ``job_app`` serves on Airflow 3's API
server (``job_view``), as a Flask blueprint at ``/trainflow``, behind the webserver's own authentication (read
access to the DAG's task instances, as the webserver's task views check it); what it reads of the cluster
follows ``task_job``.

Imported by the Airflow 2 webserver only (``plugin.TrainflowPlugin.flask_blueprints``).
"""

from __future__ import annotations

from typing import Any


def xcom_values_2x(session: Any, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
    """The task instance's XComs the page reads, deserialized by Airflow 2's XCom backend."""
    from airflow.models.xcom import XCom
    from trainflow.airflow.job_view import XCOM_KEYS

    out: dict[str, Any] = {}
    for key in XCOM_KEYS:
        value = XCom.get_one(
            key=key, dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index, session=session
        )
        if value is not None:
            out[key] = value
    return out


def make_blueprint() -> Any:
    """``GET /trainflow/jobs/<dag_id>/<run_id>/<task_id>?map_index=N``: the task instance's TrainJob page."""
    from flask import Blueprint, Response, request

    from airflow.auth.managers.models.resource_details import DagAccessEntity
    from airflow.utils.session import create_session
    from airflow.www.auth import has_access_dag
    from trainflow.airflow.job_view import render_page
    from trainflow.airflow.task_job import TaskKey, task_connection

    blueprint = Blueprint("trainflow", __name__, url_prefix="/trainflow")

    def job(dag_id: str, run_id: str, task_id: str) -> Response:
        try:
            map_index = int(request.args.get("map_index", "-1"))
        except ValueError:
            return Response("map_index: give an integer, -1 for an unmapped task", status=400)
        if map_index < -1:
            return Response("map_index: give -1 or a map index (0 or more)", status=400)
        key = TaskKey(dag_id, run_id, task_id, map_index)
        with create_session() as session:
            definition = task_connection(session, key)
            xcoms = xcom_values_2x(session, dag_id, run_id, task_id, map_index) if definition else {}
        status, html = render_page(key, xcoms, definition)
        return Response(html, status=status, mimetype="text/html", headers={"Cache-Control": "no-store"})

    allowed = has_access_dag("GET", DagAccessEntity.TASK_INSTANCE)  # reads dag_id from the route
    blueprint.add_url_rule("/jobs/<dag_id>/<run_id>/<task_id>", "job", view_func=allowed(job))
    return blueprint
