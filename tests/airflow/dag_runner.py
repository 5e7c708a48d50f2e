"""Run one DAG with ``dag.test()`` at a fixed logical date and run_after (so a rerun is the same DagRun),
then print a JSON summary of the run (task states, tries, XCom values) on the last line.

``dag_runner.py --summary DAG_ID`` only prints the summary of the DAG's latest run (after ``airflow dags test``).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime


def print_summary(dag_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).first()
        tis = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id
        )
        tasks = {
            f"{ti.task_id}[{ti.map_index}]": {"state": str(ti.state), "try": ti.try_number} for ti in tis
        }
        xcoms = {}
        for row in session.query(XComModel).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run.run_id
        ):
            xcoms[f"{row.task_id}[{row.map_index}].{row.key}"] = XComModel.deserialize_value(row)
    print(
        json.dumps(
            {"run_id": run.run_id, "state": str(run.state), "tasks": tasks, "xcoms": xcoms}, default=str
        )
    )


def main() -> int:
    if sys.argv[1] == "--summary":
        print_summary(sys.argv[2])
        return 0
    dag_id, logical, run_after = sys.argv[1], sys.argv[2], sys.argv[3]
    conf = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        print(bag.import_errors)
        return 2
    bag.get_dag(dag_id).test(
        logical_date=datetime.fromisoformat(logical).replace(tzinfo=UTC),
        run_after=datetime.fromisoformat(run_after).replace(tzinfo=UTC),
        run_conf=conf,
    )
    print_summary(dag_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
