"""The provider on the floor of an Airflow line it declares (pyproject's ``apache-airflow>=2.11``): a real
deployment of it.

run.sh --airflow 2.11 --suite floor starts it from tests/airflow_deploy/requirements/airflow-2.11.txt (and 3.0,
3.1, 3.2 likewise).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest
from airflow_deployment import Deployment
from airflow_rest import Airflow, wait_for

from browser import chart_points, screenshot

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def declared_floor() -> str:
    """The lower bound of the ``airflow`` extra in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'airflow = \[\s*"apache-airflow>=([0-9.]+)', text)
    assert found, "pyproject.toml: the airflow extra has no lower bound"
    return found.group(1)


def test_this_line_is_within_the_declared_range() -> None:
    """The installed Airflow is one the extra allows, and the provider's version module reads it right."""
    from packaging.version import Version

    from trainflow.airflow.version_compat import AIRFLOW_VERSION

    installed = importlib.metadata.version("apache-airflow")
    assert Version(declared_floor()) <= Version(installed) < Version("4"), (installed, declared_floor())
    assert ".".join(map(str, AIRFLOW_VERSION)) == installed


@pytest.mark.parametrize(
    "name",
    [
        "TrainJobOperator",
        "TrainJobSensor",
        "TrainJobHook",
        "TrainJobTrigger",
        "trainjob_task",
        "DeleteTrainJobOperator",
    ],
)
def test_provider_imports(name: str) -> None:
    module = importlib.import_module("trainflow.airflow")
    assert getattr(module, name) is not None


def test_deferred_run_through_the_floor_triggerer_and_its_trainjob_page(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """A deferred run returns its result through XCom; its "TrainJob page" extra link, read over REST, opens the
    provider's page on this line's web server (Airflow 2's Flask webserver: a blueprint; 3.x: the API server's
    FastAPI app), through its auth."""
    import httpx

    api.trigger("tf_deploy_defer", run_id, {"steps": 15, "step_seconds": 1.0})
    ti = api.wait_ti_state("tf_deploy_defer", run_id, "train", {"deferred", "success", "failed"})
    assert ti["state"] == "deferred", (ti, api.log("tf_deploy_defer", run_id, "train", 1)[-3000:])
    run = api.wait_run("tf_deploy_defer", run_id, timeout=300)
    assert run["state"] == "success", (
        f"{api.why('tf_deploy_defer', run_id)}\n{api.log('tf_deploy_defer', run_id, 'train', 1)[-4000:]}"
    )
    assert api.xcom("tf_deploy_defer", run_id, "train")["state"] == "Complete"

    href = api.links("tf_deploy_defer", run_id, "train")["TrainJob page"]
    assert href and href.startswith("/trainflow/jobs/tf_deploy_defer/"), href
    page = httpx.get(f"{deployment.base_url}{href}", timeout=60, follow_redirects=False)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:2000]
    state = re.search(r'id="tf-state"[^>]*>([^<]*)<', page.text)
    assert state and state.group(1).startswith("Complete"), page.text[:3000]
    assert "the result its wait recorded" in page.text
    missing = httpx.get(f"{deployment.base_url}/trainflow/jobs/tf_deploy_defer/no-such-run/train", timeout=60)
    assert missing.status_code == 404, (missing.status_code, missing.text[:500])


def test_connection_form_fields_on_the_floor(api: Airflow) -> None:
    """The connection form's fields on this line: from the hook's ``get_connection_form_widgets`` before 3.2
    (the Flask form on 2.x, the React form on 3.0/3.1), from ``conn-fields`` in provider info from 3.2."""
    fields = api.connection_form_fields("kubeflow_trainer")
    assert {"backend", "kubeconfig_path", "kubeconfig", "context", "namespace", "in_cluster"} <= fields, (
        fields
    )


def test_a_feature_this_line_lacks_is_refused_at_parse() -> None:
    """``durable=True`` needs the task state store (Airflow 3.3): refused when the DAG file is parsed, naming
    the argument and the line that has it; left unset, the same DAG parses on every line."""
    from trainflow.airflow import TrainJobOperator
    from trainflow.airflow.version_compat import AIRFLOW_V_3_3_PLUS
    from trainflow.core.errors import InvalidRequest

    args = {"runtime": "torch-distributed", "image": "python:3.11", "command": ["python", "-c", "pass"]}
    TrainJobOperator(task_id="plain", **args)
    if AIRFLOW_V_3_3_PLUS:
        TrainJobOperator(task_id="durable", durable=True, **args)
        return
    with pytest.raises(InvalidRequest) as err:
        TrainJobOperator(task_id="durable", durable=True, **args)
    assert "durable" in str(err.value) and "Airflow 3.3 or later" in str(err.value), str(err.value)


def test_the_scheduled_retraining_example_defers_and_hands_its_model_downstream(api: Airflow) -> None:
    """dags_examples/trainflow_retraining.py as a user deploys it (tests/airflow_deploy/dags/tf_examples.py),
    under ``[operators] default_deferrable = True`` (run.sh's floor suite sets it): the scheduler's own daily run
    trains on the local engine through this line's triggerer; the downstream task loads the model the job wrote,
    found through the train task's XCom, and passes its metrics on through XCom."""
    dag = "trainflow_retraining"
    api.wait_dag(dag)
    run = wait_for(
        lambda: next(iter(api.runs(dag)), None), 180, f"the scheduler's run of {dag}", interval=1.0
    )
    run_id = run["dag_run_id"]
    assert run["run_type"] == "scheduled", run
    done = api.wait_run(dag, run_id, timeout=600)
    assert done["state"] == "success", api.why(dag, run_id)

    train = api.xcom(dag, run_id, "train")
    assert train["state"] == "Complete", train
    assert train["metrics"]["world_size"] == 4.0, train  # 2 nodes x 2 processes
    model = Path(train["output_uri"].removeprefix("file://")) / "model.pt"
    assert model.is_file() and model.stat().st_size > 0, train["output_uri"]
    metrics = api.xcom(dag, run_id, "evaluate")
    assert metrics["model_path"] == str(model) and metrics["trainjob"] == train["name"], metrics
    assert metrics["train_loss"] == train["metrics"]["train_loss"] and metrics["mse"] < 0.01, metrics
    tis = {t["task_id"]: t["state"] for t in api.task_instances(dag, run_id)}
    assert tis["promote"] == "success" and tis["keep_current"] == "skipped", tis  # nothing to beat yet
    # the wait ran in the triggerer (the example names no ``deferrable``: the config's default decided), and
    # its lines are in the task log: the job's state and rank 0's training output
    log = api.log(dag, run_id, "train", 1)
    assert "Pausing task as DEFERRED" in log, log[-4000:]
    assert f"TrainJob {train['namespace']}/{train['name']}: Running" in log, log[-4000:]
    assert "world_size=4" in log and "saved model to" in log, log[-4000:]


def test_the_output_is_a_dataset_event_on_2_and_an_asset_event_on_3(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """``output_uri`` (templated) becomes an event of the run through the ``trainflow-output`` alias: a Dataset
    event on Airflow 2 (``/datasets/events``), an Asset event on 3.x, with the deferred task's own result."""
    root = deployment.root / "assets" / run_id
    (root / "data").mkdir(parents=True)
    dataset, output = f"file://{root}/data", f"file://{root}/model"
    api.trigger("tf_conv_assets", run_id, {"dataset": dataset, "output": output, "steps": 12})
    run = api.wait_run("tf_conv_assets", run_id)
    assert run["state"] == "success", api.why("tf_conv_assets", run_id)
    events = api.asset_events(run_id)
    assert [e["uri"] for e in events] == [output], events
    assert "Pausing task as DEFERRED" in api.log("tf_conv_assets", run_id, "train", 1)
    assert api.xcom("tf_conv_assets", run_id, "train")["output_uri"] == output


def test_the_extra_links_and_the_trainjob_page_in_chromium(
    deployment: Deployment, api: Airflow, page: Any, run_id: str, tmp_path: Path
) -> None:
    """What a user of this line sees: the task's Extra Links in its UI (2.x: the Flask webserver's grid, details
    tab; 3.x: the React task page), and the "TrainJob page" link opened, its chart drawn by Chromium."""
    dag, steps = "tf_deploy_defer", 12
    api.trigger(dag, run_id, {"steps": steps, "step_seconds": 1.0})
    assert api.wait_run(dag, run_id, timeout=300)["state"] == "success", api.why(dag, run_id)
    links = api.links(dag, run_id, "train")
    line = importlib.metadata.version("apache-airflow").rsplit(".", 1)[0]
    if api.major >= 3:
        page.goto(f"{deployment.base_url}/dags/{dag}/runs/{run_id}/tasks/train/details")
    else:
        page.goto(f"{deployment.base_url}/dags/{dag}/grid?dag_run_id={run_id}&task_id=train&tab=details")
    for name in ("TrainJob", "TrainJob page"):
        link = page.get_by_role("link", name=name, exact=True)
        link.wait_for()
        assert link.get_attribute("href") == links[name], (name, links)
    screenshot(page, f"ui-floor-{line}-extra-links", tmp_path)

    page.goto(f"{deployment.base_url}{links['TrainJob page']}")
    assert page.locator("#tf-state").inner_text() == "Complete (AllJobsCompleted)"
    history = api.xcom(dag, run_id, "train")["history"]
    expected = {k: sum(v is not None for v in vs) for k, vs in history["metrics"].items()}
    assert (
        chart_points(page) == {"progress": len(history["time"]), **expected} and len(history["time"]) > steps
    )
    screenshot(page, f"ui-floor-{line}-trainjob-page", tmp_path)
