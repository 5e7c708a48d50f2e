"""The identity of a task instance's TrainJob: the same on every try and every worker, never the try number."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Context

LABEL_PREFIX = "airflow.apache.org/"


def idempotency_key(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    """The idempotency key of one task instance's TrainJob."""
    index = -1 if map_index is None else int(map_index)
    return f"{dag_id}/{task_id}/{run_id}/{index}"


def airflow_labels(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> dict[str, str]:
    """Labels (valid label values, no try_number) so a TrainJob can be traced to its task."""
    from trainflow.core.naming import label_value

    labels = {
        f"{LABEL_PREFIX}dag-id": label_value(dag_id),
        f"{LABEL_PREFIX}task-id": label_value(task_id),
        f"{LABEL_PREFIX}run-id": label_value(run_id),
    }
    if map_index is not None and int(map_index) >= 0:
        labels[f"{LABEL_PREFIX}map-index"] = str(int(map_index))
    return labels


def ti_identity(context: Context) -> tuple[str, str, str, int | None]:
    ti = context["ti"]
    return ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None)
