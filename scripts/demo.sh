#!/usr/bin/env bash
# trainflow demo: run the trainflow_retraining example DAG through Airflow on the embedded local engine.
# Makes a throwaway SQLite AIRFLOW_HOME, points DAGS_FOLDER at dags_examples/, migrates the DB,
# runs `airflow dags test trainflow_retraining`, then prints the evaluate task's metrics (read back
# from XCom) and where the model file is. The home is kept (the model file lives there) unless
# DEMO_CLEAN=1; DEMO_HOME=<dir> picks the directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_BIN="${VENV_BIN:-$ROOT/.venv/bin}"
export PATH="$VENV_BIN:$PATH"

DEMO_HOME="${DEMO_HOME:-$(mktemp -d "${TMPDIR:-/tmp}/trainflow-demo.XXXXXX")}"
if [[ "${DEMO_CLEAN:-0}" == "1" ]]; then trap 'rm -rf "$DEMO_HOME"' EXIT; fi

export AIRFLOW_HOME="$DEMO_HOME/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags_examples"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export TRAINFLOW_HOME="$DEMO_HOME/trainflow"
# The default Kubeflow Trainer connection, pointed at the local engine (no cluster needed).
export AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT='{"conn_type": "kubeflow_trainer", "extra": {"backend": "local"}}'
mkdir -p "$AIRFLOW_HOME" "$TRAINFLOW_HOME"
LOGICAL_DATE="${DEMO_DATE:-$(date -u +%Y-%m-%d)}"

echo "==> Airflow home:   $AIRFLOW_HOME (SQLite)"
echo "==> trainflow home: $TRAINFLOW_HOME (local engine state)"
echo "==> airflow db migrate"
airflow db migrate >"$DEMO_HOME/migrate.log" 2>&1 || { cat "$DEMO_HOME/migrate.log"; exit 1; }

echo "==> airflow dags test trainflow_retraining $LOGICAL_DATE  (log: $DEMO_HOME/dags_test.log)"
start=$(date +%s)
if ! airflow dags test trainflow_retraining "$LOGICAL_DATE" >"$DEMO_HOME/dags_test.log" 2>&1; then
  tail -n 60 "$DEMO_HOME/dags_test.log"
  echo "demo FAILED (full log: $DEMO_HOME/dags_test.log)"; exit 1
fi
echo "==> DAG run finished in $(( $(date +%s) - start ))s"

python - <<'PY'
import json

from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

DAG_ID = "trainflow_retraining"
with create_session() as session:
    run = session.query(DagRun).filter(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).first()
    states = {
        ti.task_id: str(ti.state)
        for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run.run_id)
    }

    def xcom(task_id: str, key: str = "return_value"):
        row = (
            session.query(XComModel)
            .filter(XComModel.dag_id == DAG_ID, XComModel.run_id == run.run_id)
            .filter(XComModel.task_id == task_id, XComModel.key == key)
            .first()
        )
        return None if row is None else XComModel.deserialize_value(row)

    train, metrics, promoted = xcom("train"), xcom("evaluate"), xcom("promote")
print(f"DAG run {run.run_id}: {run.state}")
print("task states:", json.dumps(states, sort_keys=True))
if train:
    print(f"TrainJob {train['namespace']}/{train['name']}: {train['state']} in {train['duration_seconds']}s")
    print("  training metrics (from trainerStatus):", json.dumps(train["metrics"]))
if metrics:
    print("evaluate (downstream task, read the model via the XCom result):")
    print(f"  held-out mse = {metrics['mse']:.3e}, weights = {metrics['weights']}, bias = {metrics['bias']}")
    print(f"  model file   = {metrics['model_path']}")
if promoted:
    print(f"promoted model = {promoted}")
if not (train and metrics) or run.state != "success":
    raise SystemExit("demo did not produce the expected results")
PY
if [[ "${DEMO_CLEAN:-0}" != "1" ]]; then echo "==> demo files kept in $DEMO_HOME (rm -rf it when done)"; fi
