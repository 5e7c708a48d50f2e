"""The identity of a task instance's TrainJob: the same on every try and every worker, never the try number."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.airflow.compat_sdk import Context

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


def carries(labels: Mapping[str, Any], dag_id: str, task_id: str, run_id: str, map_index: int | None) -> bool:
    """A TrainJob's labels name this task instance, as ``airflow_labels`` set them (no map index: not mapped)."""
    own = airflow_labels(dag_id, task_id, run_id, map_index)
    names = ("dag-id", "task-id", "run-id", "map-index")
    return all(labels.get(f"{LABEL_PREFIX}{n}") == own.get(f"{LABEL_PREFIX}{n}") for n in names)


def ti_identity(context: Context) -> tuple[str, str, str, int | None]:
    ti = context["ti"]
    return ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None)


def is_new_run(context: Context, retries: int) -> bool:
    """This try was started by a clear, not a retry: ``launch`` must train again, not reuse a Complete job.

    Airflow resets a cleared task instance's ``max_tries`` to ``try_number + retries``, and a retry leaves it
    alone; so the first try after a clear is the one with ``max_tries - try_number == retries - 1`` and
    ``try_number > 1``. A first try (``try_number == 1``) is not one: a DAG run deleted and created again
    under the same run_id, or ``dag.test()`` run again, keeps the identity's completed result.
    """
    ti = context["ti"]
    max_tries, try_number = getattr(ti, "max_tries", None), getattr(ti, "try_number", None)
    if not isinstance(max_tries, int) or not isinstance(try_number, int) or try_number <= 1:
        return False
    return max_tries - try_number == retries - 1


def is_first_try(context: Context) -> bool:
    """Try 1 of this task instance: ``launch`` may create before it lists (an earlier try's TrainJob, if any, is
    then found by the create itself, or - rarely, after a DAG run recreated under the same run_id - missed)."""
    return getattr(context["ti"], "try_number", None) == 1
