"""The running deployment and testbed, as the tests see them (state, REST client, process control)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import airflow_rest
import airflow_stack
from airflow_rest import Airflow, wait_for

DEFER = "tf_deploy_defer"  # the deferred TrainJob DAG of dags/tf_deploy_dags.py


def deploy_dir() -> Path:
    return Path(os.environ.get("TRAINFLOW_AIRFLOW_DIR", "/tmp/trainflow-airflow"))


class Deployment:
    """The running deployment: its state, REST client and process control."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = airflow_stack.load(root)
        self.major = int(self.state.get("major", 3))
        self.api = airflow_rest.Airflow(f"http://127.0.0.1:{self.state['ports']['api']}", major=self.major)
        self.trainflow_home = Path(self.state["env"]["TRAINFLOW_HOME"])

    @property
    def base_url(self) -> str:
        return self.api.base

    def pids(self, component: str) -> list[int]:
        return airflow_stack.component_pids(self.root, component)

    def log(self, component: str) -> str:
        return (self.root / "logs" / f"{component}.log").read_text(errors="replace")

    def logs_tail(self) -> str:
        return airflow_stack.tail(self.root)

    def local_backend(self) -> Any:
        from trainflow.core import get_backend

        return get_backend("local", home=str(self.trainflow_home))


class Testbed:
    """The kwok testbed (real kube-apiserver, Trainer, JobSet) the kubernetes-backend tests use."""

    def __init__(self, root: Path) -> None:
        self.state = json.loads((root / "state.json").read_text())
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(
            config_file=self.state["kubeconfig"], context=self.state["context"]
        )
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def trainjobs(self, namespace: str) -> list[dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
        )
        return items["items"]  # type: ignore[no-any-return]


# -- assertions shared by the suites ---------------------------------------------------------------------


def jobs_of(
    dep: Deployment, dag_id: str, run_id: str, task_id: str = "train", map_index: int = -1
) -> list[Any]:
    """The local engine's TrainJobs of one task instance (by the operator's identity label)."""
    from trainflow.airflow.identity import idempotency_key
    from trainflow.core.naming import KEY_LABEL, key_label

    key = idempotency_key(dag_id, task_id, run_id, map_index)
    return dep.local_backend().list(labels={KEY_LABEL: key_label(key)})  # type: ignore[no-any-return]


def wait_running_job(dep: Deployment, dag_id: str, run_id: str, timeout: float = 180) -> Any:
    def running() -> Any:
        jobs = jobs_of(dep, dag_id, run_id)
        return jobs[0] if len(jobs) == 1 and jobs[0].state.value == "Running" else None

    return wait_for(running, timeout, f"the TrainJob of {dag_id}/{run_id} to run")


def assert_complete_once(
    api: Airflow, dep: Deployment, dag_id: str, run_id: str, tries: int
) -> dict[str, Any]:
    """The run succeeded after ``tries`` tries, with exactly one TrainJob whose result is the XCom."""
    run = api.wait_run(dag_id, run_id, timeout=420)
    ti = api.ti(dag_id, run_id, "train")
    assert run["state"] == "success", (run, ti, api.log(dag_id, run_id, "train", ti["try_number"]))
    assert ti["try_number"] == tries, ti
    jobs = jobs_of(dep, dag_id, run_id)
    assert len(jobs) == 1, f"expected one TrainJob, found {[(j.name, j.state.value) for j in jobs]}"
    result = api.xcom(dag_id, run_id, "train")
    assert result["state"] == "Complete" and result["name"] == jobs[0].name, result
    return result  # type: ignore[no-any-return]
