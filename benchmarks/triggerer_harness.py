"""What the triggerer of benchmarks/triggerer_scale.py is given: objects on the cluster the controllers leave
alone, their statuses written by the benchmark, and task instances deferred with their trigger rows exactly as
the Execution API defers them (``inject`` runs in a subprocess with the deployment's environment)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "airflow_deploy"))
import _bench as B
import airflow_stack
from triggerer_pods import RankLog, create_pods, pod_name

# trainflow: TrainJobOperator's defaults (stream_logs=True, rank 0's log); trainflow-nologs: stream_logs=False;
# cncf: KubernetesJobOperator(deferrable=True), whose get_logs=True reads the logs on a worker once the trigger
# fired (KubernetesJobOperator.execute_complete), never in the triggerer
DAGS = {
    "trainflow": "tf_bench_trainjob",
    "trainflow-nologs": "tf_bench_trainjob_nologs",
    "cncf": "tf_bench_kubejob",
}
POLL_INTERVAL = 10.0  # KubernetesJobOperator's job_poll_interval default
MAX_LOG_LINES = 1000  # TrainJobOperator's default ([trainflow] max_log_lines)


def create_jobs(api: Any, namespace: str, names: list[str]) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(api)
    container = {"name": "base", "image": "registry.invalid/bench:0", "command": ["true"]}
    B.parallel(
        lambda n: batch.create_namespaced_job(
            namespace,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": n, "labels": {B.BENCH_LABEL: "triggerer"}},
                "spec": {
                    "managedBy": B.MULTIKUEUE,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                },
            },
        ),
        names,
    )


def job_status(state: str) -> dict[str, Any]:
    t = B.now_rfc3339()
    if state == "running":
        return {"startTime": t, "active": 1, "ready": 1}
    cond = {"status": "True", "reason": "CompletionsReached", "message": "benchmark", "lastTransitionTime": t}
    return {
        "active": 0,
        "ready": 0,
        "succeeded": 1,
        "completionTime": t,
        "conditions": [{**cond, "type": "SuccessCriteriaMet"}, {**cond, "type": "Complete"}],
    }


def write_status(api: Any, impl: str, namespace: str, name: str, state: str) -> None:
    from kubernetes import client

    if impl.startswith("trainflow"):
        body = B.RUNNING_STATUS if state == "running" else B.complete_status()
        B.patch_status(api, namespace, name, body)
    else:
        client.BatchV1Api(api).patch_namespaced_job_status(name, namespace, {"status": job_status(state)})


def inject(dag_id: str, run_id: str, impl: str, namespace: str, jobs_file: str) -> None:
    """Put every task instance of the run in the deferred state with its trigger, as the Execution API does
    (``jobs_file``: per map index, the job's name, uid and pod names, as the operator knew them)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    jobs = json.loads(Path(jobs_file).read_text())

    def trigger(i: int) -> Any:
        job = jobs[i]
        if impl.startswith("trainflow"):  # what TrainJobOperator._defer passes
            from trainflow.airflow.triggers import TrainJobTrigger

            return TrainJobTrigger(
                name=job["name"],
                namespace=namespace,
                uid=job["uid"],
                conn_id="kubeflow_trainer_default",
                stream_logs=impl == "trainflow",
                log_steps=["node-0"],
                max_log_lines=MAX_LOG_LINES,
            )
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        return KubernetesJobTrigger(  # what KubernetesJobOperator.execute_deferrable passes
            job_name=job["name"],
            job_namespace=namespace,
            pod_names=job["pods"],
            pod_namespace=namespace,
            base_container_name="base",
            kubernetes_conn_id="kubernetes_default",
            cluster_context=None,
            config_file=None,
            in_cluster=None,
            poll_interval=POLL_INTERVAL,
            get_logs=True,
            do_xcom_push=False,
        )

    now = timezone.utcnow()
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        run.state, run.start_date = DagRunState.RUNNING, now
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        assert len(tis) > 1 and all(ti.map_index >= 0 for ti in tis), "the mapped task was not expanded"
        rows = []
        for ti in tis:
            classpath, kwargs = trigger(ti.map_index).serialize()
            rows.append((ti, Trigger(classpath=classpath, kwargs=kwargs)))
        session.add_all([t for _, t in rows])
        session.flush()
        for ti, t in rows:
            ti.state, ti.trigger_id, ti.next_method = TaskInstanceState.DEFERRED, t.id, "execute_complete"
            ti.try_number, ti.start_date, ti.queued_dttm = 1, now, now
    print(f"deferred {len(rows)} task instances of {dag_id}/{run_id}")


def deployment_env(n: int, kubeconfig: str) -> dict[str, str]:
    """The deployment's connections (trainflow's and cncf.kubernetes' default) and a triggerer for N triggers."""
    return {
        "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": json.dumps(
            {
                "conn_type": "kubeflow_trainer",
                "extra": {"backend": "kubernetes", "kubeconfig_path": kubeconfig},
            }
        ),
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}}
        ),
        "AIRFLOW__TRIGGERER__CAPACITY": str(n + 100),
        "AIRFLOW__OPENLINEAGE__DISABLED": "True",
        "TF_BENCH_TRIGGERER_N": str(n),
    }


def defer(
    state: dict[str, Any], impl: str, n: int, api: Any, log: RankLog | None
) -> tuple[str, list[str], str]:
    """N running jobs in a new namespace (each with a running rank-0 pod printing ``log``, unless None: jobs
    whose pods do not exist yet) and a run of N task instances deferred on them: (namespace, names, run id)."""
    from kubernetes import client

    dag_id = DAGS[impl]
    namespace = f"bench-trig-{impl}-{uuid.uuid4().hex[:5]}"
    names = [f"bench-{i:05d}" for i in range(n)]
    B.create_namespace(api, namespace)
    if impl.startswith("trainflow"):
        B.create_trainjobs(api, namespace, names)
        listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
            B.GROUP, B.VERSION, namespace, B.PLURAL
        )
        uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in listed["items"]}
    else:
        create_jobs(api, namespace, names)
        uids = {
            j.metadata.name: j.metadata.uid
            for j in client.BatchV1Api(api).list_namespaced_job(namespace).items
        }
    B.parallel(lambda name: write_status(api, impl, namespace, name, "running"), names)
    if log is not None:
        pods = create_pods(api, impl, namespace, names, log)
    else:  # as today: the operator would know no pod yet
        pods = [pod_name(impl, name) for name in names]
    jobs = [{"name": name, "uid": uids[name], "pods": [pod]} for name, pod in zip(names, pods, strict=True)]
    jobs_file = Path(state["env"]["AIRFLOW_HOME"]) / f"{namespace}.json"
    jobs_file.write_text(json.dumps(jobs))
    run_id = f"bench-{impl}-{uuid.uuid4().hex[:6]}"
    out = airflow_stack.airflow_cli(state, "dags", "trigger", dag_id, "--run-id", run_id)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    env = {**airflow_stack.process_env(state), "TF_BENCH_TRIGGERER_N": str(n)}
    subprocess.run(
        [sys.executable, __file__, "inject", dag_id, run_id, impl, namespace, str(jobs_file)],
        env=env,
        check=True,
    )
    return namespace, names, run_id


if __name__ == "__main__":  # ``inject``, in the deployment's environment
    if sys.argv[1:2] != ["inject"]:
        sys.exit("usage: triggerer_harness.py inject DAG_ID RUN_ID IMPL NAMESPACE JOBS_FILE")
    inject(*sys.argv[2:7])
