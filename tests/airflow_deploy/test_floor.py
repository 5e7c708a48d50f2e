"""The provider on the oldest Airflow it declares (pyproject's ``apache-airflow>=3.2``): a real deployment of it.

run.sh --airflow 3.2 --suite floor starts it from tests/airflow_deploy/requirements/airflow-3.2.txt.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
from airflow_deployment import Deployment
from airflow_rest import Airflow

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def declared_floor() -> str:
    """The lower bound of the ``airflow`` extra in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'airflow = \["apache-airflow>=([0-9.]+)', text)
    assert found, "pyproject.toml: the airflow extra has no lower bound"
    return found.group(1)


def test_this_is_the_declared_floor() -> None:
    floor = declared_floor()
    installed = importlib.metadata.version("apache-airflow")
    assert installed.split(".")[:2] == floor.split(".")[:2], (installed, floor)


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


def test_deferred_run_through_the_floor_triggerer(deployment: Deployment, api: Airflow, run_id: str) -> None:
    api.trigger("tf_deploy_defer", run_id, {"steps": 15, "step_seconds": 1.0})
    ti = api.wait_ti_state("tf_deploy_defer", run_id, "train", {"deferred", "success", "failed"})
    assert ti["state"] == "deferred", (ti, api.log("tf_deploy_defer", run_id, "train", 1)[-3000:])
    run = api.wait_run("tf_deploy_defer", run_id, timeout=300)
    assert run["state"] == "success", api.log("tf_deploy_defer", run_id, "train", 1)[-4000:]
    assert api.xcom("tf_deploy_defer", run_id, "train")["state"] == "Complete"


def test_connection_form_fields_on_the_floor(api: Airflow) -> None:
    """The connection form's fields on the floor (``conn-fields`` in provider info, read from 3.2)."""
    meta = {m["connection_type"]: m for m in api.hook_meta()}
    assert "kubeflow_trainer" in meta, sorted(meta)
    fields = {
        k.removeprefix("extra__kubeflow_trainer__") for k in meta["kubeflow_trainer"]["extra_fields"] or {}
    }
    assert {"backend", "kubeconfig_path", "kubeconfig", "context", "namespace", "in_cluster"} <= fields, (
        fields
    )
