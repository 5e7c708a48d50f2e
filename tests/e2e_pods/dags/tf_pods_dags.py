"""DAGs for the real-pods suite (the cluster comes from the ``kubeflow_trainer_default`` connection)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from trainflow.airflow import TrainJobOperator

START = datetime(2026, 1, 1)
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"

with DAG("tf_pods_on_kill", schedule=None, start_date=START):
    # waits in the worker (not deferred), so a SIGTERM to the task reaches on_kill
    TrainJobOperator(
        task_id="train",
        runtime="torch-distributed",
        image=IMAGE,
        command=["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"],  # stops on SIGTERM
        num_nodes=2,
        deferrable=False,
        stream_logs=False,
        retries=0,
    )

with DAG("tf_pods_task_trainjob", schedule=None, start_date=START):

    @task.trainjob(runtime="torch-distributed", num_nodes=1, proc_per_node=2, deferrable=True)
    def fit(scale: float) -> dict:
        """Runs under torchrun in the runtime's image: gloo all_reduce, rank 0 reports; every rank returns a
        value and rank 0's is the task's (read from its pod's log)."""
        import torch
        import torch.distributed as dist

        from trainflow.core.reporting import report

        dist.init_process_group("gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1) * scale])
        dist.all_reduce(value)
        report(metrics={"reduced": value.item(), "world_size": world_size}, progress=100)
        print(f"rank={rank} reduced={value.item()}", flush=True)
        dist.destroy_process_group()
        return {"reduced": value.item(), "world_size": world_size, "rank": rank}

    @task
    def check(returned: dict, ti=None) -> dict:
        result = ti.xcom_pull(task_ids="fit", key="trainjob_result")
        return {
            "state": result["state"],
            "metrics": result["metrics"],
            "name": result["name"],
            "returned": returned,
        }

    check(fit(2.5))
