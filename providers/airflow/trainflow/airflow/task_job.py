"""A task instance's own TrainJob, as a web server may read it: the one rule every view that reads the cluster
(the TrainJob page on Airflow 2's webserver and 3's API server, its tab) follows.

An XCom names a job, but anyone who may write one XCom of the task (the REST API, any DAG author) could name
another team's. So a view reads a job only through the connection of the task's definition (the serialized
DAG, never a connection an XCom names), and shows it only when the job carries the task instance's own labels
(``identity.carries``, as the operator set them). Anything else is ``None``: the view then says so and names
nothing of the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from trainflow.airflow.identity import carries

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.result import JobRef

TEMPLATE_MARKS = ("{{", "{%")


class TaskKey(NamedTuple):
    """A task instance as a URL names it (``map_index`` -1: not mapped)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int


class Definition(NamedTuple):
    """What the task's definition says about its connection: ``known`` False when it cannot be told."""

    known: bool
    conn_id: str | None


UNKNOWN = Definition(False, None)


def plain(value: Any) -> bool:
    """A connection id the definition holds as is (not a template Airflow renders when the task runs)."""
    return value is None or (isinstance(value, str) and not any(m in value for m in TEMPLATE_MARKS))


def definition_conn_id(task: Any, rendered: Mapping[str, Any] | None) -> Definition:
    """The ``conn_id`` of a serialized task: its own value, or for a template (or a mapped one) the value
    Airflow rendered for this task instance (``rendered``: its rendered template fields)."""
    partial = getattr(task, "partial_kwargs", None)  # a mapped task keeps its fixed arguments here
    value = partial.get("conn_id", ...) if isinstance(partial, Mapping) else getattr(task, "conn_id", ...)
    if value is not ... and plain(value):
        return Definition(True, value)
    value = (rendered or {}).get("conn_id", ...)
    if value is not ... and plain(value):
        return Definition(True, value)
    return UNKNOWN


def task_connection(session: Any, key: TaskKey) -> Definition | None:
    """The connection of the task instance's definition, from the metadata database: the serialized DAG its
    task instance ran (Airflow 3: its DAG version; 2: the latest), never an XCom. None: no such task instance."""
    from sqlalchemy import select

    from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance as TI

    ti = session.scalars(
        select(TI).where(
            TI.dag_id == key.dag_id,
            TI.run_id == key.run_id,
            TI.task_id == key.task_id,
            TI.map_index == key.map_index,
        )
    ).first()
    if ti is None:
        return None
    version = getattr(ti, "dag_version_id", None)  # Airflow 3: the DAG version this task instance ran
    if version is not None:
        row = session.scalars(
            select(SerializedDagModel).where(SerializedDagModel.dag_version_id == version).limit(1)
        ).first()
    else:
        row = SerializedDagModel.get(key.dag_id, session=session)
    dag = row.dag if row is not None else None
    if dag is None or not dag.has_task(key.task_id):
        return UNKNOWN
    rendered = session.scalars(
        select(Rendered.rendered_fields).where(
            Rendered.dag_id == key.dag_id,
            Rendered.run_id == key.run_id,
            Rendered.task_id == key.task_id,
            Rendered.map_index == key.map_index,
        )
    ).first()
    return definition_conn_id(dag.get_task(key.task_id), rendered if isinstance(rendered, Mapping) else None)


def owned(backend: Backend, key: TaskKey, name: str, namespace: str) -> JobRef | None:
    """The job ``namespace/name`` as read through ``backend``, when it carries the task instance's own labels;
    None when it does not, or does not exist (the same answer: a view tells neither apart)."""
    from trainflow.core.result import JobRef

    obj = backend.read(namespace, name)
    meta = (obj or {}).get("metadata") or {}
    if not obj or not carries(meta.get("labels") or {}, key.dag_id, key.task_id, key.run_id, key.map_index):
        return None
    return JobRef(name=name, namespace=namespace, uid=meta.get("uid"))
