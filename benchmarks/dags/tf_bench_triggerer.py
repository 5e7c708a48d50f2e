"""DAGs of benchmarks/triggerer_scale.py: sweeps of N mapped TrainJob tasks (log streaming on, the default, and
off) and one of N cncf.kubernetes Job tasks, whose task instances the benchmark puts in the deferred state (they
never run on a worker).
N comes from ``TF_BENCH_TRIGGERER_N``."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from trainflow.airflow import TrainJobOperator

N = int(os.environ.get("TF_BENCH_TRIGGERER_N", "10"))
NAMES = [f"bench-{i:05d}" for i in range(N)]
START = datetime(2026, 1, 1)

with DAG("tf_bench_trainjob", schedule=None, start_date=START, max_active_tasks=N):
    TrainJobOperator.partial(task_id="wait", command=["true"], deferrable=True).expand(job_name=NAMES)

with DAG("tf_bench_trainjob_nologs", schedule=None, start_date=START, max_active_tasks=N):
    TrainJobOperator.partial(task_id="wait", command=["true"], deferrable=True, stream_logs=False).expand(
        job_name=NAMES
    )

with DAG("tf_bench_kubejob", schedule=None, start_date=START, max_active_tasks=N):
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    KubernetesJobOperator.partial(task_id="wait", image="registry.invalid/bench:0", deferrable=True).expand(
        name=NAMES
    )
