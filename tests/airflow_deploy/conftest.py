"""Fixtures for the tests against a real Airflow deployment (tests/airflow_deploy/run.sh starts it).

The deployment (Postgres, scheduler, triggerer, dag-processor, api-server) and the kwok testbed are
started before pytest and stopped after it; these fixtures never start or skip anything: if the
deployment is not up, every test fails with the tail of each component's log.
Env: ``TRAINFLOW_AIRFLOW_DIR`` (the deployment's state dir), ``TRAINFLOW_TESTBED_DIR``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rest
import stack


def deploy_dir() -> Path:
    return Path(os.environ.get("TRAINFLOW_AIRFLOW_DIR", "/tmp/trainflow-airflow"))


class Deployment:
    """The running deployment: its state, REST client and process control."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = stack.load(root)
        self.api = rest.Airflow(f"http://127.0.0.1:{self.state['ports']['api']}")
        self.trainflow_home = Path(self.state["env"]["TRAINFLOW_HOME"])

    @property
    def base_url(self) -> str:
        return self.api.base

    def pids(self, component: str) -> list[int]:
        return stack.component_pids(self.root, component)

    def log(self, component: str) -> str:
        return (self.root / "logs" / f"{component}.log").read_text(errors="replace")

    def logs_tail(self) -> str:
        return stack.tail(self.root)

    def local_backend(self) -> Any:
        from trainflow.core import get_backend

        return get_backend("local", home=str(self.trainflow_home))


@pytest.fixture(scope="session")
def deployment() -> Iterator[Deployment]:
    root = deploy_dir()
    if not (root / "state.json").exists():
        pytest.fail(f"no Airflow deployment at {root}: run tests/airflow_deploy/run.sh", pytrace=False)
    dep = Deployment(root)
    health = stack.health(root)
    if any((health.get(k) or {}).get("status") != "healthy" for k in ("scheduler", "triggerer", "dag_processor")):
        pytest.fail(f"deployment not healthy: {health}\n{dep.logs_tail()}", pytrace=False)
    yield dep
    dep.api.close()


@pytest.fixture
def api(deployment: Deployment) -> rest.Airflow:
    return deployment.api


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call" and rep.failed and "deployment" in getattr(item, "funcargs", {}):
        rep.sections.append(("airflow deployment logs", item.funcargs["deployment"].logs_tail()))


# -- the kwok testbed (kubernetes backend) -----------------------------------------------------------


class Testbed:
    def __init__(self, root: Path) -> None:
        self.state = json.loads((root / "state.json").read_text())
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(
            config_file=self.state["kubeconfig"], context=self.state["context"]
        )
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def trainjobs(self, namespace: str) -> list[dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")
        return items["items"]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    root = Path(os.environ.get("TRAINFLOW_TESTBED_DIR", "/tmp/trainflow-testbed"))
    if not (root / "state.json").exists():
        pytest.fail(f"no testbed at {root}: run tests/airflow_deploy/run.sh", pytrace=False)
    tb = Testbed(root)
    yield tb
    tb.api_client.close()


@pytest.fixture
def namespace(testbed: Testbed, run_id: str) -> Iterator[str]:
    from kubernetes import client

    name = f"af-{uuid.uuid4().hex[:8]}"
    testbed.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    rest.wait_for(
        lambda: any(sa.metadata.name == "default" for sa in testbed.core.list_namespaced_service_account(name).items),
        60,
        f"default ServiceAccount in {name}",
    )
    yield name
    testbed.core.delete_namespace(name, body=client.V1DeleteOptions(propagation_policy="Background"))
