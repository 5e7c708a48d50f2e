"""DAGs for the real-pods suite (the cluster comes from the ``kubeflow_trainer_default`` connection)."""

from __future__ import annotations

import os
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


# Issue 22 (tests/e2e_pods/test_objstore_pods.py): the store's URIs and endpoint come from the test's env; the
# credentials only as references to the Secret "store" in the job's namespace.
S3 = {k: os.environ.get(f"TF_S3_{k.upper()}", "") for k in ("data", "model", "output", "endpoint", "region")}
# Outside the test of that DAG the env is unset; the operator refuses an empty output_uri at parse, so a
# placeholder keeps this file's other DAGs parseable (tf_pods_s3 is only run with the env set).
S3["output"] = S3["output"] or "s3://tf-pods-unset/output"
S3_CREDENTIALS = {"access_key_id": "store/access_key_id", "secret_access_key": "store/secret_access_key"}
S3_OPTIONS = {"endpoint": S3["endpoint"], "region": S3["region"]}

with DAG("tf_pods_s3", schedule=None, start_date=START):

    @task.trainjob(
        runtime="torch-with-initializers",
        runtime_kind="TrainingRuntime",
        proc_per_node=1,
        dataset_uri=S3["data"],
        dataset_options=S3_OPTIONS,
        dataset_secret_env=S3_CREDENTIALS,
        model_uri=S3["model"],
        model_options=S3_OPTIONS,
        model_secret_env=S3_CREDENTIALS,
        output_uri=S3["output"],
        env={"AWS_ENDPOINT_URL": S3["endpoint"], "AWS_REGION": S3["region"]},
        secret_env={
            "AWS_ACCESS_KEY_ID": "store/access_key_id",
            "AWS_SECRET_ACCESS_KEY": "store/secret_access_key",
        },
        deferrable=True,
    )
    def fit(steps: int, lr: float) -> dict:
        """The data and the base model from the Trainer's initializers (/workspace), the model to output_dir()
        (s3://: published to the store on rank 0 when this returns)."""
        import csv
        import json
        import os

        import torch

        from trainflow.core import output_dir, report

        with open("/workspace/dataset/points.csv") as f:
            rows = [(float(r["x"]), float(r["y"])) for r in csv.DictReader(f)]
        with open("/workspace/model/config.json") as f:
            base = json.load(f)
        # the model initializer's default ignore_patterns skip *.bin: the store's weights.bin never arrives
        print("model dir:", sorted(os.listdir("/workspace/model")), flush=True)
        x = torch.tensor([[r[0]] for r in rows])
        y = torch.tensor([[r[1]] for r in rows])
        model = torch.nn.Linear(1, 1)
        with torch.no_grad():
            model.weight.fill_(base["w"])
            model.bias.fill_(base["b"])
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        out = output_dir()
        torch.save(model.state_dict(), out / "model.pt")
        weights = {"w": model.weight.item(), "b": model.bias.item(), "base": base["name"]}
        (out / "weights.json").write_text(json.dumps(weights))
        report(metrics={"loss": loss.item()}, progress=100)
        return weights

    @task
    def evaluate(returned: dict, ti=None) -> dict:
        """Downstream: the model from the store the TrainJob named, with this worker's own credentials (env)."""
        import json
        import tempfile
        from pathlib import Path

        from trainflow.core import download

        result = ti.xcom_pull(task_ids="fit", key="trainjob_result")
        where = Path(tempfile.mkdtemp())
        files = download(result["output_uri"], where)
        weights = json.loads((where / "weights.json").read_text())
        return {"files": files, "weights": weights, "returned": returned, "result": result}

    evaluate(fit(300, 0.1))
