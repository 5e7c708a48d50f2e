"""The deployment's triggerer restarted under real pods (run.sh --suite pods, on the pods testbed): the
cluster's log position (each step's last kubelet timestamp and the digests of the lines at it; the first read
of a continued log asks for ``sinceSeconds``) carries 20 deferred tasks' logs across a graceful stop and a
SIGKILL of the triggerer, as the local engine's byte offset does in test_deploy_local.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow_deployment import Deployment, Testbed
from airflow_rest import Airflow
from triggerer_restart import restart_while_streaming

from shared_volumes import delete_pv, shared_claim

pytestmark = pytest.mark.e2e

LOGS_PODS = "tf_deploy_logs_pods"


@pytest.fixture
def shared(testbed: Testbed, namespace: str) -> Iterator[Path]:
    """A hostPath PersistentVolume bound to the claim ``shared`` of ``namespace``: the directory returned here
    is ``/shared`` in the pods."""
    if testbed.state.get("mode") != "pods":
        pytest.fail("run.sh --suite pods needs the pods testbed (testbed/up.sh --pods)", pytrace=False)
    path, pv = Path(testbed.state["dir"]) / "shared" / namespace, f"shared-{namespace}"
    shared_claim(testbed.core, namespace, path, pv)
    try:
        yield path
    finally:
        (path / "release").touch()  # whatever happened, no pod of the test keeps running
        delete_pv(testbed.core, pv)


def test_a_restarted_triggerer_continues_each_pod_log_where_it_stopped(
    deployment: Deployment, api: Airflow, run_id: str, namespace: str, shared: Path
) -> None:
    """20 deferred tasks follow their pods' logs (one pod each, 2 numbered lines a second) through the
    triggerer's SIGTERM and restart, then SIGKILL and restart; Airflow 3.3's triggers save on their way out.
    Each task log holds every line; up to the position saved before the kill, each once and in order."""
    runs = [f"{run_id}-pod{i}-{uuid.uuid4().hex[:4]}" for i in range(20)]
    restart_while_streaming(
        deployment,
        api,
        LOGS_PODS,
        runs,
        {"namespace": namespace},
        (shared / "release").touch,
        graceful=True,
    )
