"""The TrainJob page serves only the task instance's own TrainJob, in a real deployment (the deploy suite's
newest Airflow and the floor's, local engine): while team A's task runs, its ``trainjob`` XCom is made to name
team B's job (as anyone who may write an XCom of the task can: the REST API, a DAG author), and the page the
web server serves for team A's task shows nothing of it, whatever connection the XCom names; with its own XCom
the page shows team A's job, and its nodes table lists that job's nodes, not those of a job of the same name in
the connection's namespace.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import airflow_stack
import httpx
import pytest
from airflow_deployment import Deployment
from airflow_rest import Airflow, wait_for

from bounds import HANG

pytestmark = pytest.mark.e2e

FORGE = """
import json, sys
try:
    from airflow.models.xcom import XComModel as XCom  # Airflow 3
except ImportError:
    from airflow.models.xcom import XCom  # Airflow 2
dag_id, run_id, task_id, value = sys.argv[1:5]
XCom.set("trainjob", json.loads(value), dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=-1)
"""


def forge(dep: Deployment, dag_id: str, run_id: str, task_id: str, value: dict[str, Any]) -> None:
    """Write the task instance's ``trainjob`` XCom in the deployment's metadata database."""
    state = dep.state
    done = subprocess.run(
        [f"{state['venv']}/bin/python", "-c", FORGE, dag_id, run_id, task_id, json.dumps(value)],
        env=airflow_stack.process_env(state),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def twin_line() -> None:
    print("twin-line-of-the-default-namespace", flush=True)


def test_the_page_shows_only_the_tasks_own_job(
    deployment: Deployment, api: Airflow, run_id: str, request: pytest.FixtureRequest
) -> None:
    from trainflow.core import TrainJobRequest

    api.trigger("tf_deploy_page_b", run_id)
    run = api.wait_run("tf_deploy_page_b", run_id, timeout=300)
    assert run["state"] == "success", api.why("tf_deploy_page_b", run_id)
    theirs = api.xcom("tf_deploy_page_b", run_id, "train", key="trainjob")
    assert theirs["namespace"] == "team-b"

    gate = deployment.trainflow_home / f"gate-{run_id}"  # team A's job runs until the test opens it
    request.addfinalizer(gate.touch)  # whatever happens
    api.trigger("tf_deploy_page_a", run_id, {"gate": str(gate), "seconds": 600})
    ti = api.wait_ti_state("tf_deploy_page_a", run_id, "train", {"deferred", "success", "failed"})
    assert ti["state"] == "deferred", (ti, api.why("tf_deploy_page_a", run_id))
    own = api.xcom("tf_deploy_page_a", run_id, "train", key="trainjob")
    assert own["namespace"] == "team-a"
    href = api.links("tf_deploy_page_a", run_id, "train")["TrainJob page"]
    assert href, href
    url = f"{deployment.base_url}{href}"

    # a job of the same name in the connection's namespace ("default"), on two nodes
    backend = deployment.local_backend()
    twin = backend.submit(
        TrainJobRequest(
            name=own["name"], namespace="default", runtime="jax-distributed", function=twin_line, num_nodes=2
        )
    )
    assert backend.wait(twin, timeout=300).state.value == "Complete"

    forged = [
        theirs,
        {**theirs, "conn_id": "tf_elsewhere"},
        {**own, "namespace": "team-b"},
        {"name": twin.name, "namespace": "default"},
    ]
    for value in forged:
        forge(deployment, "tf_deploy_page_a", run_id, "train", value)
        page = httpx.get(url, timeout=60)
        assert page.status_code == 403, (value, page.status_code, page.text[:3000])
        assert "TOPSECRET" not in page.text and "twin-line" not in page.text, page.text
        assert theirs["name"] not in page.text and "team-b" not in page.text, page.text
    assert api.ti("tf_deploy_page_a", run_id, "train")["state"] == "deferred"  # read live, not its result

    forge(deployment, "tf_deploy_page_a", run_id, "train", own)
    page = wait_for(
        lambda: (p := httpx.get(url, timeout=60)).status_code == 200 and "own-line-of-team-a" in p.text and p,
        HANG,
        "team A's own job on its page",
    )
    nodes = re.findall(r"<tr><td>(node-\d+)</td>", page.text)
    assert nodes == ["node-0"], page.text
    assert "twin-line" not in page.text and "TOPSECRET" not in page.text
    assert 'id="tf-state"' in page.text and "Running" in page.text, page.text[:3000]
    assert api.ti("tf_deploy_page_a", run_id, "train")["state"] == "deferred"
    gate.touch()
    run = api.wait_run("tf_deploy_page_a", run_id, timeout=300)
    assert run["state"] == "success", api.why("tf_deploy_page_a", run_id)
