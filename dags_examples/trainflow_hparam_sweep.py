"""Hyperparameter sweep: one TrainJob per learning rate (dynamic task mapping), then pick the best run.

Each mapped task instance gets its own idempotent TrainJob (the map index is part of its identity), so
retrying one learning rate never resubmits the others.
"""

from __future__ import annotations

from datetime import datetime

try:  # Airflow 3 (common-compat's sdk module is missing where 3.0.6's constraints pin 1.7.3)
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow.decorators import task

    from airflow import DAG
from example_training import train_regression

from trainflow.airflow import TrainJobOperator

LEARNING_RATES = [0.01, 0.05, 0.2]

with DAG(
    dag_id="trainflow_hparam_sweep",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={"learning_rates": LEARNING_RATES, "epochs": 40},
    tags=["trainflow", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def grid(params=None) -> list[dict]:
        """One function_kwargs dict per learning rate (override with ``-c '{"learning_rates": [...]}'``)."""
        return [
            {"lr": float(lr), "epochs": int(params["epochs"]), "seed": 7} for lr in params["learning_rates"]
        ]

    sweep = TrainJobOperator.partial(
        task_id="train",
        runtime="torch-distributed",
        function=train_regression,
        num_nodes=1,
        proc_per_node=2,
        max_active_tis_per_dagrun=3,
    ).expand(function_kwargs=grid())

    @task
    def pick_best(results: list[dict]) -> dict:
        """Lowest training loss wins; the downstream model path comes from the winner's output_uri."""
        done = [r for r in results if r["state"] == "Complete" and "train_loss" in r["metrics"]]
        if not done:
            raise ValueError("no run of the sweep reported train_loss")
        for r in sorted(done, key=lambda r: float(r["metrics"]["train_loss"])):
            print(f"{r['name']}: train_loss={float(r['metrics']['train_loss']):.3e} output={r['output_uri']}")
        best = min(done, key=lambda r: float(r["metrics"]["train_loss"]))
        return {
            "name": best["name"],
            "train_loss": float(best["metrics"]["train_loss"]),
            "output_uri": best["output_uri"],
        }

    @task
    def evaluate_best(best: dict) -> dict:
        from pathlib import Path

        from example_training import evaluate_model

        uri = best["output_uri"]
        model = Path(uri[len("file://") :] if uri.startswith("file://") else uri) / "model.pt"
        metrics = evaluate_model(model)
        print(f"best run {best['name']}: held-out mse={metrics['mse']:.3e}")
        return {**best, **metrics, "model_path": str(model)}

    evaluate_best(pick_best(sweep.output))
