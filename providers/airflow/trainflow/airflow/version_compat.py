"""The Airflow line this process runs, and what the provider does differently on it (the one place that says so).

The flags are those of common-compat's ``version_compat``, copied as the Apache providers copy it (a provider
does not import another provider's version module). Every name that moved between lines is imported through
``compat_sdk`` (common-compat's ``sdk`` where the installed release has one); this module holds only what a line itself lacks: each feature a line
cannot give is refused when the DAG file is parsed (``missing``), naming the feature and the line that has it,
and the one read that differs by line in the triggerer (``task_instance_state``).
"""

from __future__ import annotations

import asyncio
from typing import Any


def get_base_airflow_version_tuple() -> tuple[int, int, int]:
    from packaging.version import Version

    from airflow import __version__

    version = Version(__version__)
    return version.major, version.minor, version.micro


AIRFLOW_VERSION = get_base_airflow_version_tuple()
AIRFLOW_V_3_0_PLUS = AIRFLOW_VERSION >= (3, 0, 0)
AIRFLOW_V_3_1_PLUS = AIRFLOW_VERSION >= (3, 1, 0)
AIRFLOW_V_3_2_PLUS = AIRFLOW_VERSION >= (3, 2, 0)
AIRFLOW_V_3_3_PLUS = AIRFLOW_VERSION >= (3, 3, 0)

# What needs a newer Airflow: argument -> (the line that has it, what it gives, what to do instead). An
# argument left at its default never asks for it, so a DAG that does not ask parses on every line.
FEATURES: dict[str, tuple[tuple[int, int], str, str]] = {
    "durable": (
        (3, 3),
        "durable=True (recording the TrainJob in the task state store)",
        "leave durable unset: every try still reattaches to its TrainJob by name (derived from the task "
        "instance); or run Airflow 3.3 or later",
    ),
}


def missing(argument: str, value: Any) -> tuple[str, str, str] | None:
    """``(argument, problem, fix)`` when this Airflow lacks what ``argument=value`` asks for, else None."""
    needs, what, instead = FEATURES[argument]
    if value is None or value is False or AIRFLOW_VERSION[:2] >= needs:
        return None
    have = ".".join(map(str, AIRFLOW_VERSION))
    return argument, f"{what} needs Airflow {needs[0]}.{needs[1]} or later; this is Airflow {have}", instead


async def task_instance_state(ti: Any) -> Any:
    """A task instance's current state, read from the triggerer without blocking its loop: Airflow 3 asks the
    API server through the triggerer's supervisor (the triggerer has no database access), Airflow 2 reads the
    metadata database."""
    if AIRFLOW_V_3_0_PLUS and not AIRFLOW_V_3_2_PLUS:
        # 3.0/3.1: the triggerer's channel to its supervisor is safe only from its own loop (a synchronous send
        # from a worker thread reads replies out of order, and the trigger runner exits: seen on 3.0.6)
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetTaskStates

        reply = await task_runner.SUPERVISOR_COMMS.asend(
            GetTaskStates(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
            )
        )
        return reply.task_states[ti.run_id][ti.task_id]  # type: ignore[union-attr]
    if AIRFLOW_V_3_0_PLUS:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = await asyncio.to_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=ti.dag_id,
            task_ids=[ti.task_id],
            run_ids=[ti.run_id],
            map_index=ti.map_index,
        )
        return states[ti.run_id][ti.task_id]

    def read() -> Any:
        from sqlalchemy import select

        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.scalar(
                select(TaskInstance.state).where(
                    TaskInstance.dag_id == ti.dag_id,
                    TaskInstance.task_id == ti.task_id,
                    TaskInstance.run_id == ti.run_id,
                    TaskInstance.map_index == ti.map_index,
                )
            )

    return await asyncio.to_thread(read)
