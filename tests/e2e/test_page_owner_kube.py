"""The TrainJob page's ownership rule (``trainflow.airflow.task_job``) on the testbed's kube-apiserver: a TrainJob
is read through the kubernetes backend and shown only for the task instance its labels name; the live part of
its own page then lists its pods and reads it by the uid that was checked."""

from __future__ import annotations

import pytest

from bounds import HANG
from conftest import wait_until
from trainflow.airflow.identity import airflow_labels
from trainflow.airflow.job_view import live
from trainflow.airflow.task_job import TaskKey, owned
from trainflow.core import TrainJobRequest
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.result import JobRef

pytestmark = pytest.mark.e2e

IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"


def test_a_cluster_job_is_shown_only_for_its_task_instance(testbed, namespace) -> None:
    backend = KubernetesBackend(
        kubeconfig=str(testbed.kubeconfig), context=testbed.context, namespace=namespace
    )
    try:
        team_b = TaskKey("dag_b", "scheduled__2026-01-01T00:00:00+00:00", "train", 2)
        labels = airflow_labels(team_b.dag_id, team_b.task_id, team_b.run_id, team_b.map_index)
        request = TrainJobRequest(
            runtime="torch-distributed",
            idempotency_key="page/team-b",
            num_nodes=1,
            image=IMAGE,
            command=["python", "-c", "print('TOPSECRET-of-team-b')"],
            labels=labels,
        )
        ref = backend.submit(request)
        for other in (
            team_b._replace(dag_id="dag_a"),
            team_b._replace(map_index=1),
            team_b._replace(map_index=-1),
            team_b._replace(run_id="scheduled__2026-01-02T00:00:00+00:00"),
            team_b._replace(task_id="evaluate"),
        ):
            assert owned(backend, other, ref.name, namespace) is None, other
        assert owned(backend, team_b, ref.name, "default") is None  # its name in another namespace
        assert owned(backend, team_b, "no-such-job", namespace) is None
        mine = owned(backend, team_b, ref.name, namespace)
        assert mine == JobRef(name=ref.name, namespace=namespace, uid=ref.uid) and ref.uid

        nodes = wait_until(lambda: live(backend, mine)[1] or None, HANG, "the job's pods on its page")
        result = live(backend, mine)[0]
        assert result.uid == ref.uid and result.name == ref.name
        assert nodes and all(str(n["name"]).startswith(ref.name) for n in nodes), nodes
    finally:
        backend.close()
