"""The FastAPI app the provider's plugin mounts at ``/trainflow`` on Airflow 3's API server: one TrainJob page
per task instance (``job_view``), behind Airflow's own authentication (read access to the DAG's task instances);
what it reads of the cluster follows ``task_job``.

Imported by the API server only (``plugin.TrainflowPlugin.fastapi_apps``). No ``from __future__ import
annotations`` here: FastAPI reads the route's annotations as objects.
"""

from typing import Annotated

from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from trainflow.airflow.job_view import render_page, xcom_values
from trainflow.airflow.task_job import TaskKey, task_connection


def make_app() -> FastAPI:
    app = FastAPI(title="trainflow", docs_url=None, redoc_url=None, openapi_url=None)
    allowed = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))

    @app.get("/jobs/{dag_id}/{run_id}/{task_id}", response_class=HTMLResponse, dependencies=[allowed])
    def job(
        dag_id: str,
        run_id: str,
        task_id: str,
        session: SessionDep,
        map_index: Annotated[int, Query(ge=-1)] = -1,
    ) -> HTMLResponse:
        key = TaskKey(dag_id, run_id, task_id, map_index)
        definition = task_connection(session, key)
        xcoms = xcom_values(session, dag_id, run_id, task_id, map_index) if definition else {}
        status, html = render_page(key, xcoms, definition)
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    return app
