"""DAGs of benchmarks/triggerer_scale.py: N TrainJob tasks and N cncf.kubernetes Job tasks whose task instances the
benchmark puts in the deferred state (they never run on a worker). N comes from ``TF_BENCH_TRIGGERER_N``."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from trainflow.airflow import TrainJobOperator

N = int(os.environ.get("TF_BENCH_TRIGGERER_N", "10"))
START = datetime(2026, 1, 1)

with DAG("tf_bench_trainjob", schedule=None, start_date=START, max_active_tasks=N):
    for i in range(N):
        TrainJobOperator(task_id=f"wait_{i:05d}", job_name=f"bench-{i:05d}", command=["true"], deferrable=True)

with DAG("tf_bench_kubejob", schedule=None, start_date=START, max_active_tasks=N):
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    for i in range(N):
        KubernetesJobOperator(
            task_id=f"wait_{i:05d}", name=f"bench-{i:05d}", image="registry.invalid/bench:0", deferrable=True
        )
