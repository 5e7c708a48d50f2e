"""Airflow e2e (issue 5, case 5): a real ``dag.test()`` run of TrainJobOperator, deferrable, against the testbed.

The DAGs (tests/e2e/dags/tf_e2e_dags.py) run in a subprocess with a tmp SQLite AIRFLOW_HOME; the
``kubeflow_trainer_default`` connection comes from ``AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT`` with the kubernetes
backend, so the trigger's ``wait_async`` shared watch runs against the real kube-apiserver and kwok runs the pods.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.core.naming import KEY_LABEL, MANAGED_BY_LABEL

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "airflow" / "dag_runner.py"
DAGS = Path(__file__).resolve().parent / "dags"
BIN = Path(sys.executable).parent
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
LOGICAL = "2026-02-01T00:00:00"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


def airflow_env(home: Path, conn_extra: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)  # the connection alone must point at the cluster
    env.update(
        {
            "AIRFLOW_HOME": str(home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "TRAINFLOW_HOME": str(home / "trainflow"),
            "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": json.dumps(
                {"conn_type": "kubeflow_trainer", "extra": conn_extra}
            ),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int, str]:
    """Run in its own process group; on timeout kill the whole tree and fail with the log tail."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{cmd} timed out after {timeout}s:\n{log.read_text()[-6000:]}") from None
    return rc, log.read_text()


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One tmp AIRFLOW_HOME (SQLite) migrated once for the module."""
    home = tmp_path_factory.mktemp("airflow-e2e")
    (home / "airflow").mkdir()
    (home / "trainflow").mkdir()
    rc, out = run([str(BIN / "airflow"), "db", "migrate"], airflow_env(home, {}), HANG, home / "migrate.log")
    assert rc == 0, out[-4000:]
    yield home


def run_dag(home: Path, dag_id: str, conn_extra: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    rc, out = run(
        [sys.executable, str(RUNNER), dag_id, LOGICAL, LOGICAL],
        airflow_env(home, conn_extra),
        240,
        tmp_path / f"{dag_id}.log",
    )
    assert rc == 0, out[-6000:]
    lines = [ln for ln in out.splitlines() if ln.startswith('{"run_id"')]
    assert lines, out[-6000:]
    return {**json.loads(lines[-1]), "log": out}


def airflow_trainjobs(k8s: Any, ns: str, dag_id: str) -> list[dict[str, Any]]:
    return k8s.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "trainjobs", label_selector=f"airflow.apache.org/dag-id={dag_id}"
    )["items"]


def trigger_states(log: str, ns: str) -> list[str]:
    """The states the trigger reported, in order (``TrainJob ns/name: State`` lines)."""
    return re.findall(rf"TrainJob {re.escape(ns)}/[a-z0-9-]+: (\w+) ", log)


def assert_watched(states: list[str], last: str) -> None:
    """The trigger's watch saw the job run and end. Order is not asserted: Trainer 2.3 reports all-zero
    jobsStatus between a pod failing and the Failed condition, which reads as Created (see the report)."""
    assert "Running" in states and states[-1] == last, states


def condition_true(obj: dict[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def test_deferrable_operator_completes_and_feeds_downstream(
    testbed: Any, namespace: str, k8s: Any, airflow_home: Path, tmp_path: Path
) -> None:
    extra = {
        "backend": "kubernetes",
        "kubeconfig_path": str(testbed.kubeconfig),
        "context": testbed.context,
        "namespace": namespace,
    }
    started = time.monotonic()
    out = run_dag(airflow_home, "tf_e2e_cluster", extra, tmp_path)
    elapsed = time.monotonic() - started
    assert out["state"] == "success", (out["tasks"], out["log"][-6000:])
    assert out["tasks"]["train[-1]"]["state"] == "success", out["tasks"]
    assert out["tasks"]["report[-1]"]["state"] == "success", out["tasks"]
    assert "Pausing task as DEFERRED" in out["log"], out["log"][-6000:]  # the trigger waited, not the worker

    assert_watched(trigger_states(out["log"], namespace), "Complete")
    (job,) = airflow_trainjobs(k8s, namespace, "tf_e2e_cluster")
    labels = job["metadata"]["labels"]
    assert labels["airflow.apache.org/task-id"] == "train"
    assert labels[MANAGED_BY_LABEL] == "trainflow" and KEY_LABEL in labels
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert condition_true(job, "Complete"), job.get("status")
    assert len(k8s.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]) == 1

    seen = out["xcoms"]["report[-1].return_value"]
    assert seen["state"] == "Complete"
    assert seen["name"] == job["metadata"]["name"]
    assert seen["namespace"] == namespace
    assert seen["uid"] == job["metadata"]["uid"]
    assert seen["runtime"] == "torch-distributed"
    print(f"\nairflow dag.test on cluster (deferrable): {elapsed:.1f}s")


def test_failed_pod_fails_the_task_with_the_reason(
    testbed: Any, namespace: str, k8s: Any, airflow_home: Path, tmp_path: Path, no_retry_runtime: str
) -> None:
    assert no_retry_runtime == "torch-no-retry"  # the runtime tf_e2e_cluster_fail names
    extra = {  # inline kubeconfig this time, the other way the connection reaches a cluster
        "backend": "kubernetes",
        "kubeconfig": testbed.kubeconfig.read_text(),
        "context": testbed.context,
        "namespace": namespace,
    }
    out = run_dag(airflow_home, "tf_e2e_cluster_fail", extra, tmp_path)
    assert out["state"] == "failed", out["tasks"]
    assert out["tasks"]["train[-1]"]["state"] == "failed", out["tasks"]
    log = out["log"]
    assert "Pausing task as DEFERRED" in log, log[-6000:]
    assert "reason=FailedJobs" in log, log[-6000:]
    assert "exit_code=3" in log, log[-6000:]
    assert_watched(trigger_states(log, namespace), "Failed")
    (job,) = airflow_trainjobs(k8s, namespace, "tf_e2e_cluster_fail")
    assert condition_true(job, "Failed"), job.get("status")
