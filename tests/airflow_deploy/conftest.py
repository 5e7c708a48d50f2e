"""Fixtures for the tests against a real Airflow deployment (tests/airflow_deploy/run.sh starts it).

The deployment (Postgres, scheduler, triggerer, dag-processor, api-server) and the kwok testbed are
started before pytest and stopped after it; these fixtures never start or skip anything: if the
deployment is not up, every test fails with the tail of each component's log.
Env: ``TRAINFLOW_AIRFLOW_DIR`` (the deployment's state dir), ``TRAINFLOW_TESTBED_DIR``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import airflow_rest
import airflow_stack
import pytest
from airflow_deployment import Deployment, Testbed, deploy_dir

from bounds import HANG


@pytest.fixture(scope="session")
def deployment() -> Iterator[Deployment]:
    root = deploy_dir()
    if not (root / "state.json").exists():
        pytest.fail(f"no Airflow deployment at {root}: run tests/airflow_deploy/run.sh", pytrace=False)
    dep = Deployment(root)
    try:  # a component's heartbeat may lapse for a moment right after start-up (3.0's DAG processor parsing)
        airflow_stack.wait_healthy(root, ("scheduler", "triggerer", "dag-processor"), timeout=HANG)
    except RuntimeError as exc:
        pytest.fail(f"deployment not healthy: {exc}\n{dep.logs_tail()}", pytrace=False)
    yield dep
    dep.api.close()


@pytest.fixture
def api(deployment: Deployment) -> airflow_rest.Airflow:
    return deployment.api


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, never a downloaded browser build."""
    from browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, deployment: Deployment) -> Iterator[Any]:
    """A logged-in page (all-admins auth: the token login sets the session cookie as a login would)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.set_default_timeout(60_000)
    p.goto(f"{deployment.base_url}/auth/token/login?next=/dags", wait_until="networkidle")
    yield p
    context.close()


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
    airflow_rest.wait_for(
        lambda: any(
            sa.metadata.name == "default" for sa in testbed.core.list_namespaced_service_account(name).items
        ),
        HANG,
        f"default ServiceAccount in {name}",
    )
    yield name
    testbed.core.delete_namespace(name, body=client.V1DeleteOptions(propagation_policy="Background"))
