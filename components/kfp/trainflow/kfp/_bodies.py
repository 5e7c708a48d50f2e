# ruff: noqa: UP045  (kfp 2.17 reads typing.Optional, not PEP 604 unions, in component signatures)
# mypy: disable-error-code="type-arg,valid-type"
"""Bodies of the trainflow KFP components. KFP embeds each function's source in the component, so every
body imports what it needs inside; no ``from __future__ import annotations`` here (KFP reads real types).
"""

from typing import NamedTuple, Optional

from kfp import dsl


def train_job(
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    summary: dsl.Output[dsl.Markdown],
    report: dsl.Output[dsl.HTML],
    task_config: dsl.TaskConfig,
    runtime: str = "torch-distributed",
    runtime_kind: str = "ClusterTrainingRuntime",
    image: Optional[str] = None,
    command: Optional[list] = None,
    args: Optional[list] = None,
    function: Optional[str] = None,
    function_kwargs: Optional[dict] = None,
    num_nodes: int = 0,
    proc_per_node: int = 0,
    resources: Optional[dict] = None,
    env: Optional[dict] = None,
    secret_env: Optional[dict] = None,
    dataset_uri: Optional[str] = None,
    model_uri: Optional[str] = None,
    output_uri: Optional[str] = None,
    labels: Optional[dict] = None,
    name: Optional[str] = None,
    queue: Optional[str] = None,
    priority_class: Optional[str] = None,
    max_queue_seconds: int = 0,
    deadline_seconds: int = 0,
    backend: str = "kubernetes",
    namespace: Optional[str] = None,
    on_cancel: str = "delete",
    timeout: Optional[float] = None,
    run_id: Optional[str] = None,
    task_name: Optional[str] = None,
    idempotency_key: Optional[str] = None,
    volumes: Optional[list] = None,
    mount_workspace: bool = False,
    workspace_path: Optional[str] = None,
    forward_task_config: bool = True,
    stream_logs: bool = True,
    log_steps: Optional[list] = None,
    extra: Optional[dict] = None,
    backend_config: Optional[dict] = None,
    dashboard_url_template: Optional[str] = None,
    dataset: Optional[dsl.Input[dsl.Dataset]] = None,
) -> NamedTuple("TrainJobOutputs", [("job_name", str), ("namespace", str), ("state", str), ("result", str)]):
    """Run a Kubeflow Trainer TrainJob (or reattach to it on retry), wait, and publish Model, Metrics, a
    Markdown summary, an HTML report (the job summary with loss/metrics and progress charts, self-contained)
    and the result JSON (metrics, the metrics history, a function trainer's return_value).

    The TrainJob's identity comes from the step's output artifact folder (one per task execution, the same on
    retries; run_id/task_name only label it) unless idempotency_key or name is given. SIGTERM deletes the
    TrainJob unless on_cancel='keep'. A Failed TrainJob fails the step.
    """
    params = {
        k: v
        for k, v in locals().items()
        if k not in ("model", "metrics", "summary", "report", "dataset", "task_config")
    }
    from trainflow.kfp.runner import run_train_job

    return run_train_job(
        params,
        model=model,
        metrics=metrics,
        dataset=dataset,
        task_config=task_config,
        summary=summary,
        report=report,
    )


def wait_train_job(
    metrics: dsl.Output[dsl.Metrics],
    summary: dsl.Output[dsl.Markdown],
    job_name: str,
    namespace: Optional[str] = None,
    backend: str = "kubernetes",
    backend_config: Optional[dict] = None,
    timeout: Optional[float] = None,
    on_cancel: str = "keep",
    dashboard_url_template: Optional[str] = None,
) -> NamedTuple("TrainJobStatus", [("state", str), ("result", str)]):
    """Wait for a TrainJob created elsewhere; fail when it fails. on_cancel='delete' deletes it on SIGTERM."""
    from trainflow.kfp.runner import wait_for_train_job

    return wait_for_train_job(
        job_name,
        namespace=namespace,
        backend=backend,
        backend_config=backend_config,
        timeout=timeout,
        on_cancel=on_cancel,
        metrics=metrics,
        summary=summary,
        dashboard_url_template=dashboard_url_template,
    )


def get_train_job(
    job_name: str,
    namespace: Optional[str] = None,
    backend: str = "kubernetes",
    backend_config: Optional[dict] = None,
) -> NamedTuple("TrainJobStatus", [("state", str), ("result", str)]):
    """Read a TrainJob's current state (and result JSON) without waiting; fails if it does not exist."""
    from trainflow.kfp.runner import get_train_job_state

    return get_train_job_state(job_name, namespace=namespace, backend=backend, backend_config=backend_config)
