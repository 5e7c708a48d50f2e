"""DAGs the deployment tests trigger over REST (tests/airflow_deploy).

``kubeflow_trainer_default`` is the local engine (the deployment's TRAINFLOW_HOME); ``tf_testbed`` is the
kwok testbed with the kubernetes backend, and ``kubernetes_default`` a cncf.kubernetes connection to the same
testbed. Function trainers use the jax-distributed runtime, which the local engine runs as plain ``python -c``
processes: quick to start. The ``tf_conv_*`` DAGs use the operator's defaults, as a new user writes it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

try:  # Airflow 3 (common-compat's sdk module is missing where 3.0.6's constraints pin 1.7.3)
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow.decorators import task

    from airflow import DAG

from trainflow.airflow import TrainJobOperator

try:  # the deploy suite's OpenLineage provider emits events only for DAGs that ask (selective_enable)
    from airflow.providers.openlineage.utils.selective_enable import enable_lineage
except ImportError:  # the floor's venv has no OpenLineage provider and runs no lineage test

    def enable_lineage(obj: DAG) -> DAG:
        return obj


START = datetime(2026, 1, 1)
RUNTIME = "jax-distributed"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


def train_steps(steps: int = 5, step_seconds: float = 1.0, loss0: float = 2.0) -> None:
    """A fake training loop: one 'step i loss x' line per step (rank 0's log), then a metrics report."""
    import time

    from trainflow.core.reporting import report

    loss = float(loss0)
    for i in range(int(steps)):
        time.sleep(float(step_seconds))
        loss *= 0.8
        print(f"step {i + 1}/{steps} loss {loss:.4f}", flush=True)
        report(progress=int(100 * (i + 1) / int(steps)))
    report(metrics={"loss": round(loss, 4), "steps": int(steps)}, progress=100)


def train_until_released(release: str, step_seconds: float = 0.5) -> None:
    """Numbered lines until the file ``release`` exists, then one line saying how many: a log that lasts as
    long as the test needs it, however slow the machine (the triggerer-restart test)."""
    import os
    import time

    i = 0
    while not os.path.exists(release):
        i += 1
        print(f"line {i} of an open-ended log", flush=True)
        time.sleep(float(step_seconds))
    print(f"released after {i} lines", flush=True)


def trainer_task(function: object, **kwargs: object) -> TrainJobOperator:
    """The local-engine TrainJob of the deployment's DAGs: ``function`` for ``params.steps`` paced steps."""
    return TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=function,
        function_kwargs={"steps": "{{ params.steps }}", "step_seconds": "{{ params.step_seconds }}"},
        execution_timeout=timedelta(minutes=10),
        **kwargs,
    )


def steps_task(**kwargs: object) -> TrainJobOperator:
    """The TrainJob of the defer and worker DAGs: ``params.steps`` one-second-ish steps."""
    return trainer_task(train_steps, **kwargs)


PARAMS = {
    "schedule": None,
    "start_date": START,
    "render_template_as_native_obj": True,
    "tags": ["trainflow-deploy"],
}

with DAG("tf_deploy_defer", params={"steps": 5, "step_seconds": 1.0}, **PARAMS):
    # deferrable and stream_logs given explicitly: the run must not depend on defaults
    steps_task(deferrable=True, stream_logs=True)

with DAG(
    "tf_deploy_logs",
    params={"release": "", "step_seconds": 0.5},
    max_active_runs=32,  # the triggerer-restart test holds 20 runs deferred at once (the defaults are 16)
    max_active_tasks=32,
    **PARAMS,
):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=train_until_released,
        function_kwargs={"release": "{{ params.release }}", "step_seconds": "{{ params.step_seconds }}"},
        execution_timeout=timedelta(minutes=30),
        max_log_lines=100_000,
        deferrable=True,
        stream_logs=True,
    )

# The same open-ended log from real pods (tests/airflow_deploy/test_deploy_pods.py, run.sh --suite pods): one
# pod per run prints numbered lines until the test writes "release" on the shared volume (hostPath, claim
# "shared" in the run's namespace), so the cluster's log position (timestamps and digests) crosses the restarts.
OPEN_ENDED = (
    'i=0; while [ ! -e /shared/release ]; do i=$((i+1)); echo "line $i of an open-ended log"; sleep 0.5; '
    'done; echo "released after $i lines"'
)

with DAG(
    "tf_deploy_logs_pods",
    params={"namespace": "default"},
    max_active_runs=32,
    max_active_tasks=32,
    **PARAMS,
):
    TrainJobOperator(
        task_id="train",
        conn_id="tf_testbed",
        namespace="{{ params.namespace }}",
        runtime="torch-distributed",
        image=IMAGE,
        command=["sh", "-c", OPEN_ENDED],
        volumes=[{"claim_name": "shared", "mount_path": "/shared"}],
        num_nodes=1,
        execution_timeout=timedelta(minutes=30),
        max_log_lines=100_000,
        deferrable=True,
        stream_logs=True,
    )

with DAG("tf_deploy_worker", params={"steps": 30, "step_seconds": 1.0}, **PARAMS):
    # waits on the worker (not deferred), so killing the worker interrupts the wait itself
    steps_task(deferrable=False, retries=2, retry_delay=timedelta(seconds=2))

with DAG(
    "tf_deploy_sweep",
    schedule=None,
    start_date=START,
    params={"namespace": "default", "delay": "5s"},
    tags=["trainflow-deploy"],
):
    # 20 mapped TrainJobs on the testbed (kwok runs the pods), all deferred in the one triggerer
    TrainJobOperator.partial(
        task_id="train",
        conn_id="tf_testbed",
        namespace="{{ params.namespace }}",
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=1,
        annotations={KWOK_COMPLETE_DELAY: "{{ params.delay }}"},
        deferrable=True,
        execution_timeout=timedelta(minutes=10),
    ).expand(args=[["--lr", f"{0.001 * (i + 1):.3f}"] for i in range(20)])

with DAG(
    "tf_deploy_kube",
    schedule=None,
    start_date=START,
    params={"namespace": "default", "delay": "20s"},
    tags=["trainflow-deploy"],
):
    # the cncf.kubernetes connection users already have (conn type kubernetes, extra kube_config_path)
    TrainJobOperator(
        task_id="train",
        conn_id="kubernetes_default",
        namespace="{{ params.namespace }}",
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=2,
        annotations={KWOK_COMPLETE_DELAY: "{{ params.delay }}"},
        deferrable=True,
        execution_timeout=timedelta(minutes=10),
    )

with DAG("tf_conv_defaults", params={"steps": 12, "step_seconds": 1.0}, **PARAMS):
    # no deferrable, no stream_logs: [operators] default_deferrable and the provider's defaults decide
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=train_steps,
        function_kwargs={"steps": "{{ params.steps }}", "step_seconds": "{{ params.step_seconds }}"},
    )

with DAG("tf_conv_decorator", **PARAMS):

    @task.trainjob(runtime=RUNTIME, num_nodes=1)
    def fit(lr: float) -> dict[str, float]:
        return {"lr": lr, "accuracy": 0.93}

    @task
    def check(value: dict[str, float]) -> dict[str, float]:
        return value

    check(fit(lr=0.01))

with enable_lineage(
    DAG(
        "tf_conv_assets",
        params={"dataset": "file:///tmp/dataset", "output": "file:///tmp/model", "steps": 1},
        **PARAMS,
    )
):
    # templated URIs: the output asset is recorded at run time through the trainflow-output alias (deferred
    # runs, as the floor suite's default makes them, pass steps=12: see docs/airflow.md on short triggers)
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=train_steps,
        function_kwargs={"steps": "{{ params.steps }}", "step_seconds": 1.0},
        dataset_uri="{{ params.dataset }}",
        output_uri="{{ params.output }}",
    )

with DAG(
    "tf_deploy_faults",
    schedule=None,
    start_date=START,
    params={"conn_id": "tf_testbed"},
    tags=["trainflow-deploy"],
):
    # a deferred TrainJob on the connection the test names (test_deploy_faults.py: a scripted API server);
    # the operator's defaults otherwise (on_kill_action="delete", stream_logs=True)
    TrainJobOperator(
        task_id="train",
        conn_id="{{ params.conn_id }}",
        runtime="torch-distributed",
        image=IMAGE,
        command=["torchrun", "train.py"],
        num_nodes=1,
        deferrable=True,
        execution_timeout=timedelta(seconds=150),
    )

# --- Kueue (a testbed started with --kueue; tests/airflow_deploy/test_deploy_kueue.py makes the queues) ------
KUEUE_PARAMS = {"namespace": "default", "queue": "team", "delay": "3s"}


KUEUE_JOB: dict[str, Any] = {  # a kwok TrainJob through the test's LocalQueue, deferred
    "conn_id": "tf_testbed",
    "namespace": "{{ params.namespace }}",
    "runtime": "torch-distributed",
    "image": IMAGE,
    "command": ["torchrun", "train.py"],
    "num_nodes": 1,
    "kueue_queue": "{{ params.queue }}",
    "annotations": {KWOK_COMPLETE_DELAY: "{{ params.delay }}"},
    "deferrable": True,
    "execution_timeout": timedelta(minutes=20),
}


def kueue_task(**kwargs: object) -> TrainJobOperator:
    return TrainJobOperator(task_id="train", **KUEUE_JOB, **kwargs)


with DAG(
    "tf_deploy_kueue_sweep", schedule=None, start_date=START, params=KUEUE_PARAMS, tags=["trainflow-deploy"]
):
    # 40 deferred tasks through a ClusterQueue that fits 4 one-CPU jobs
    TrainJobOperator.partial(task_id="train", resources_per_node={"cpu": 1}, **KUEUE_JOB).expand(
        args=[["--seed", str(i)] for i in range(40)]
    )

with DAG(
    "tf_deploy_kueue_low", schedule=None, start_date=START, params=KUEUE_PARAMS, tags=["trainflow-deploy"]
):
    # low priority, the whole queue: a high-priority job preempts it while the task is deferred
    kueue_task(resources_per_node={"cpu": 4}, priority_class="trainflow-low")

with DAG(
    "tf_deploy_kueue_budget", schedule=None, start_date=START, params=KUEUE_PARAMS, tags=["trainflow-deploy"]
):
    # larger than the queue: never admitted; the queue budget gives up on it (on_kill_action deletes it)
    kueue_task(resources_per_node={"cpu": 8}, max_queue_seconds=20)


def train_paced(steps: int = 20, step_seconds: float = 1.0) -> None:
    """Reports loss, accuracy and progress every step, paced, so a page shows it live (the ETA extrapolated)."""
    import time

    from trainflow.core.reporting import report

    for i in range(int(steps)):
        time.sleep(float(step_seconds))
        loss = 2.0 * 0.85**i
        print(f"step {i + 1}/{steps} loss {loss:.4f}", flush=True)
        report(
            metrics={"loss": round(loss, 5), "accuracy": round(1 - loss / 2.5, 4)},
            progress=(i + 1) * 100 // int(steps),
        )


def paced_task(**kwargs: object) -> TrainJobOperator:
    return trainer_task(train_paced, **kwargs)


try:  # the plugins folder (tests/airflow_deploy/plugins) is on every process's path in the deploy suite
    import tf_callbacks
except ImportError:  # another deployment (the floor's) without it
    tf_callbacks = None

if tf_callbacks is not None:
    with DAG("tf_deploy_page", params={"steps": 20, "step_seconds": 1.5}, **PARAMS):
        # deferred: the update callback runs in the triggerer, the result callback once on the worker (a retry
        # covers a try the executor loses before it starts, as a loaded API server can make it)
        paced_task(
            deferrable=True,
            retries=2,
            retry_delay=timedelta(seconds=2),
            on_update_callback=tf_callbacks.record_update,
            on_result_callback=tf_callbacks.record_result,
        )

    with DAG("tf_deploy_bad_callbacks", params={"steps": 6, "step_seconds": 0.5}, **PARAMS):
        # callbacks that fail or hang never fail or hang the task (each call bounded by callback_timeout)
        paced_task(
            deferrable=True,
            on_update_callback="tf_callbacks.raise_update",
            on_result_callback=tf_callbacks.hang_result,
            callback_timeout=5,
        )

    with DAG("tf_deploy_hung_update", params={"steps": 6, "step_seconds": 0.5}, **PARAMS):
        paced_task(deferrable=True, on_update_callback="tf_callbacks.hang_update", callback_timeout=3)


def say_and_wait(text: str = "", gate: str = "", seconds: float = 0.0) -> None:
    """Print one line (rank 0's log) and report, then run until the file ``gate`` exists (at most ``seconds``)."""
    import os
    import time

    from trainflow.core.reporting import report

    print(text, flush=True)
    report(metrics={"said": 1.0}, progress=50)
    end = time.time() + float(seconds)
    while time.time() < end and not (gate and os.path.exists(gate)):
        time.sleep(0.2)


# the TrainJob page's ownership (test_page_ownership.py): team B's job prints a secret in its own namespace;
# team A's task runs in namespace team-a while the test makes its XCom name team B's job
with DAG("tf_deploy_page_b", **PARAMS):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=say_and_wait,
        function_kwargs={"text": "TOPSECRET-of-team-b"},
        namespace="team-b",
        deferrable=False,
    )

with DAG("tf_deploy_page_a", params={"gate": "", "seconds": 600}, **PARAMS):
    TrainJobOperator(
        task_id="train",
        runtime=RUNTIME,
        function=say_and_wait,
        function_kwargs={
            "text": "own-line-of-team-a",
            "gate": "{{ params.gate }}",
            "seconds": "{{ params.seconds }}",
        },
        namespace="team-a",
        deferrable=True,
        execution_timeout=timedelta(minutes=10),
    )
