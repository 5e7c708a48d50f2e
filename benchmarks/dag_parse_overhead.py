"""DAG-parse cost of the trainflow Airflow provider.

Parses two DAG files in fresh interpreters, the way a DAG processor does (``airflow.sdk`` already
imported, then the DAG file executed): one with BashOperator-free plain tasks, one that also imports
``trainflow.airflow`` and instantiates a TrainJobOperator and a TrainJobSensor. Prints the median over
several runs, the added milliseconds and the ratio. Target: < 100 ms added, and nothing heavy imported (the
request model the argument check reads is allowed; many operators: ``dag_parse_many.py``).

    .venv/bin/python benchmarks/dag_parse_overhead.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

BASELINE_DAG = """
from datetime import datetime
from airflow.sdk import DAG, task

with DAG("bench_baseline", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
    @task
    def train():
        return 1

    @task
    def evaluate(x):
        return x

    evaluate(train())
"""

TRAINFLOW_DAG = """
from datetime import datetime
from airflow.sdk import DAG, task
from trainflow.airflow import TrainJobOperator, TrainJobSensor

with DAG("bench_trainflow", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
    train = TrainJobOperator(
        task_id="train",
        runtime="torch-distributed",
        function="example_training:train_regression",
        function_kwargs={"epochs": 60, "lr": 0.1},
        num_nodes=2,
        proc_per_node=2,
        dataset_uri="s3://bucket/data/{{ ds }}",
    )
    wait = TrainJobSensor(task_id="wait", job_name="{{ ti.xcom_pull('train', key='job_name') }}")

    @task
    def evaluate(x):
        return x

    train >> wait >> evaluate(train.output)
"""

PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys, time
    import airflow.sdk  # the DAG processor has this loaded before it parses any file
    from airflow.sdk import DAG, BaseOperator  # noqa: F401
    path = sys.argv[1]
    start = time.perf_counter()
    spec = importlib.util.spec_from_file_location("bench_dag", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    elapsed = time.perf_counter() - start
    # the parse-time argument check loads the request model (and its errors, and the function-reference
    # rule for a function given as text); anything else of trainflow.core, kubernetes or torch is heavy
    model = {"trainflow.core", "trainflow.core.request", "trainflow.core.errors",
             "trainflow.core.function_trainer", "trainflow.core.reporting"}
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "kubernetes_asyncio", "torch")
                   or (m.startswith("trainflow.core") and m not in model))
    print(json.dumps({"seconds": elapsed, "heavy": heavy}))
    """
)


def parse_once(dag_file: Path, env: dict[str, str]) -> tuple[float, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag_file)], capture_output=True, text=True, env=env, check=True
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return float(data["seconds"]), list(data["heavy"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainflow-parse-bench-") as tmp:
        folder = Path(tmp)
        (folder / "baseline.py").write_text(BASELINE_DAG)
        (folder / "with_trainflow.py").write_text(TRAINFLOW_DAG)
        env = dict(os.environ)
        env.setdefault("AIRFLOW_HOME", str(folder / "airflow"))
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        base_times, tf_times, heavy = [], [], []
        parse_once(folder / "baseline.py", env)  # warm the OS file cache and .pyc files
        parse_once(folder / "with_trainflow.py", env)
        for _ in range(args.runs):  # interleaved, so machine load hits both alike
            base_times.append(parse_once(folder / "baseline.py", env)[0])
            seconds, loaded = parse_once(folder / "with_trainflow.py", env)
            tf_times.append(seconds)
            heavy = loaded
    base, with_tf = statistics.median(base_times), statistics.median(tf_times)
    added_ms = (with_tf - base) * 1000
    print(f"runs: {args.runs} fresh interpreters each (median)")
    print(f"parse DAG without trainflow: {base * 1000:8.1f} ms")
    print(f"parse DAG with trainflow:    {with_tf * 1000:8.1f} ms")
    print(
        f"added by trainflow.airflow:  {added_ms:8.1f} ms   (ratio {with_tf / base:.2f}x; target < 100 ms added)"
    )
    print(f"heavy modules imported at parse time: {heavy or 'none'}")
    return 0 if added_ms < 100 and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
