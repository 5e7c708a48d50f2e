"""Names Airflow owns: ``queue`` and ``resources`` keep their Airflow meaning, and a user who meant Kueue or
Kubernetes quantities hears about it at DAG parse, named with the argument to use instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainflow.airflow import _config

AIRFLOW_RESOURCES = ("cpus", "ram", "disk", "gpus")  # airflow.sdk.definitions.resources.Resources
QUEUELESS_EXECUTORS = ("LocalExecutor", "SequentialExecutor", "DebugExecutor")  # they ignore `queue`
KUEUE_LIKE = re.compile(r"(queue|^lq-|-lq$|^kueue)", re.IGNORECASE)


class KueueQueueWarning(UserWarning):
    """``queue`` (Airflow's executor queue) was given where a Kueue LocalQueue may have been meant."""


def check_resources(resources: Any) -> None:
    """``resources`` holding Kubernetes quantities: a ValueError naming ``resources_per_node``."""
    if not isinstance(resources, Mapping):
        return
    foreign = [str(k) for k in resources if k not in AIRFLOW_RESOURCES]
    if foreign:
        raise ValueError(
            f"resources={dict(resources)!r}: {', '.join(foreign)} are not Airflow executor resources "
            f"({', '.join(AIRFLOW_RESOURCES)}). For what each TrainJob node gets, pass "
            f"resources_per_node={dict(resources)!r}"
        )


def _executors() -> list[str]:
    value = _config.airflow_option("core", "executor")
    return [e.split(":")[-1].strip().rsplit(".", 1)[-1] for e in value.split(",") if e.strip()]


def queue_warning(queue: Any, kueue_queue: Any) -> str | None:
    """The warning for an executor ``queue`` that may have meant a Kueue LocalQueue, or None.

    Airflow's meaning is kept. Without ``kueue_queue``, the user hears about it when the deployment's
    executors ignore queues, or when the name looks like a Kueue queue (``gpu-queue``, ``lq-a100``).
    """
    if not isinstance(queue, str) or kueue_queue is not None:
        return None
    if queue == _config.airflow_option("operators", "default_queue", "default"):
        return None
    executors = _executors()
    queueless = bool(executors) and all(e in QUEUELESS_EXECUTORS for e in executors)
    if not queueless and not KUEUE_LIKE.search(queue):
        return None
    ignored = f" ({', '.join(executors)} ignores executor queues)" if queueless else ""
    return (
        f"queue={queue!r} is this task's Airflow executor queue{ignored}. To queue the TrainJob in a Kueue "
        f"LocalQueue, pass kueue_queue={queue!r}. If you meant the executor queue, silence this with "
        "warnings.filterwarnings('ignore', category=trainflow.airflow.arguments.KueueQueueWarning)"
    )
