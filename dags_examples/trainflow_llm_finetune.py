"""LLM fine-tuning on a TorchTune runtime: dataset and model initializers, then ``tune run`` with overrides.

Cluster only (GPUs, Hugging Face downloads); it parses anywhere and renders to a valid TrainJob offline.
The Hugging Face token comes from key ``token`` of the Kubernetes Secret ``hf-token`` (never from Airflow): the
model initializer reads it as ACCESS_TOKEN (``model_secret_env``). trainflow sends ``tune run`` so the Trainer
picks the recipe and config (full, LoRA, QLoRA) from the overrides and the GPUs, and keeps the runtime's dataset
arguments.
"""

from __future__ import annotations

from datetime import datetime, timedelta

try:  # Airflow 3 (common-compat's sdk module is missing where 3.0.6's constraints pin 1.7.3)
    from airflow.sdk import DAG, Param, task
except ImportError:  # Airflow 2
    from airflow.decorators import task
    from airflow.models.param import Param

    from airflow import DAG

from trainflow.airflow import TrainJobOperator

with DAG(
    dag_id="trainflow_llm_finetune",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "runtime": Param("torchtune-llama3.2-1b", enum=["torchtune-llama3.2-1b", "torchtune-llama3.2-3b"]),
        "dataset": Param("hf://tatsu-lab/alpaca/data", type="string"),
        "model": Param("hf://meta-llama/Llama-3.2-1B-Instruct", type="string"),
        "epochs": Param(1, type="integer", minimum=1),
        "gpus_per_node": Param(1, type="integer", minimum=1),
    },
    tags=["trainflow", "example", "cluster"],
    doc_md=__doc__,
) as dag:
    finetune = TrainJobOperator(
        task_id="finetune",
        conn_id="kubeflow_trainer_default",
        backend="kubernetes",
        namespace="ml-team",
        runtime="{{ params.runtime }}",
        dataset_uri="{{ params.dataset }}",
        model_uri="{{ params.model }}",
        model_secret_env={"access_token": "hf-token/token"},
        args=["epochs={{ params.epochs }}", "batch_size=4", "dataset.split=train[:2000]"],
        num_nodes=1,
        resources_per_node={"gpu": "{{ params.gpus_per_node }}", "memory": "64Gi", "cpu": 8},
        kueue_queue="gpu-queue",
        labels={"team": "ml", "purpose": "sft"},
        execution_timeout=timedelta(hours=6),
        on_kill_action="delete",
        on_finish_action="delete_succeeded",
        stream_logs=True,
    )

    @task
    def report(result: dict) -> None:
        print(
            f"fine-tuned model of {result['name']} in {result['duration_seconds']}s: {result['output_uri']}"
        )

    report(finetune.output)
