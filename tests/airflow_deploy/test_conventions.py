"""What Airflow users expect of a provider and what this one does not do yet (issue 13, "Conventions").

Each test states one expectation, checked where users meet it: a real deployment (``make
e2e-airflow-conventions``, with ``[operators] default_deferrable = False``, the Airflow default, and a cncf
``kubernetes_default`` connection to the testbed) or the DAG file a user writes. They fail until the provider
changes listed in the module's tests land; then they move into the deploy suite and ``make test``.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from airflow_deployment import DEFER, Deployment, Testbed, assert_complete_once, jobs_of
from airflow_rest import Airflow, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = REPO / "providers" / "airflow" / "trainflow" / "airflow" / "README.md"


def _operator(**kwargs: Any) -> Any:
    from trainflow.airflow import TrainJobOperator

    return TrainJobOperator(task_id="t", runtime="jax-distributed", command=["true"], **kwargs)


# -- deferral and task logs --------------------------------------------------------------------------------


def test_default_deferrable_follows_the_airflow_setting(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """With ``[operators] default_deferrable = False`` (Airflow's default) an operator given no ``deferrable``
    waits on its worker, as cncf.kubernetes operators do: a deployment without a triggerer still works."""
    assert deployment.state["env"]["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "False"
    api.trigger("tf_conv_defaults", run_id, {"steps": 20})
    seen: set[str] = set()

    def done() -> bool:
        seen.add(api.ti("tf_conv_defaults", run_id, "train")["state"])
        return api.run("tf_conv_defaults", run_id)["state"] in ("success", "failed")

    wait_for(done, 300, "the run to finish")
    assert api.run("tf_conv_defaults", run_id)["state"] == "success"
    assert "deferred" not in seen, seen


def test_task_log_shows_training_output_by_default(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """Without ``stream_logs``, rank 0's output is in the task log while the job runs (on by default)."""
    api.trigger("tf_conv_defaults", run_id, {"steps": 30})
    api.wait_ti_state("tf_conv_defaults", run_id, "train", {"running", "deferred", "success", "failed"})

    def streamed() -> bool:
        return "step 3/30" in api.log("tf_conv_defaults", run_id, "train", 1)

    wait_for(streamed, 60, "rank 0's lines in the task log while the job runs")
    assert api.ti("tf_conv_defaults", run_id, "train")["state"] in ("running", "deferred")


def test_streaming_triggers_do_not_block_other_completions(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """Log streaming must not hold the triggerer's shared thread pool: with more streaming jobs running than the
    event loop's default executor has threads (cpu_count + 4), a short job's completion is still reported."""
    import os

    long_runs = [f"{run_id}-long{i}" for i in range(min(32, (os.cpu_count() or 1) + 4) + 1)]
    for rid in long_runs:
        api.trigger(DEFER, rid, {"steps": 600, "step_seconds": 1.0})
    for rid in long_runs:
        assert (
            api.wait_ti_state(DEFER, rid, "train", {"deferred", "success", "failed"})["state"] == "deferred"
        )
    short = f"{run_id}-short"
    api.trigger(DEFER, short, {"steps": 15, "step_seconds": 1.0})
    ti = wait_for(
        lambda: (t := api.ti(DEFER, short, "train"))["state"] in ("success", "failed") and t,
        180,
        "the short job's task to finish while the long ones stream",
    )
    assert ti["state"] == "success", api.log(DEFER, short, "train", 1)[-3000:]
    log = api.log(DEFER, short, "train", 1)
    assert "[node-0] step 1/15" in log and "[node-0] step 15/15" in log, log[-3000:]


# -- rerun semantics ---------------------------------------------------------------------------------------


def test_clear_reruns_the_training(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """Clearing a finished task runs it again: a new TrainJob (attempt 2), not the old result replayed.

    This is what clearing means to an Airflow user and what KubernetesPodOperator does (a finished pod is
    labelled ``already_checked`` and a clear starts a new one); a retry after a crash still reattaches.
    """
    api.trigger(DEFER, run_id, {"steps": 15, "step_seconds": 1.0})
    first = assert_complete_once(api, deployment, DEFER, run_id, tries=1)
    cleared = api.clear(DEFER, run_id, ["train"])
    assert [t["task_id"] for t in cleared] == ["train"], cleared
    ti = wait_for(
        lambda: (
            (t := api.ti(DEFER, run_id, "train"))["try_number"] == 2
            and t["state"] in ("success", "failed")
            and t
        ),
        300,
        "the cleared task to run again",
    )
    assert ti["state"] == "success", (ti, api.log(DEFER, run_id, "train", 2)[-4000:])
    jobs = sorted(jobs_of(deployment, DEFER, run_id), key=lambda j: j.attempt or 0)
    assert [j.attempt for j in jobs] == [1, 2], [(j.name, j.attempt) for j in jobs]
    second = api.xcom(DEFER, run_id, "train")
    assert second["name"] == jobs[1].name != first["name"], (first, second)


# -- outputs -----------------------------------------------------------------------------------------------


def _dataset(deployment: Deployment, run_id: str) -> Path:
    root = deployment.root / "assets" / run_id
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("x,y\n1,2\n")
    return root


def test_task_trainjob_returns_the_function_return_value(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """``@task.trainjob`` hands the function's return value downstream, as ``@task.kubernetes`` does; the
    TrainJobResult stays available beside it (XCom ``trainjob_result``)."""
    api.trigger("tf_conv_decorator", run_id)
    run = api.wait_run("tf_conv_decorator", run_id, timeout=300)
    assert run["state"] == "success", api.log("tf_conv_decorator", run_id, "fit", 1)[-3000:]
    assert api.xcom("tf_conv_decorator", run_id, "check") == {"lr": 0.01, "accuracy": 0.93}
    assert api.xcom("tf_conv_decorator", run_id, "fit", key="trainjob_result")["state"] == "Complete"


def test_dataset_and_output_uris_are_assets(deployment: Deployment, api: Airflow, run_id: str) -> None:
    """``dataset_uri`` is an inlet and ``output_uri`` an outlet: the run records an asset event for the model."""
    root = _dataset(deployment, run_id)
    dataset, output = f"file://{root}/data", f"file://{root}/model"
    api.trigger("tf_conv_assets", run_id, {"dataset": dataset, "output": output})
    assert api.wait_run("tf_conv_assets", run_id, timeout=300)["state"] == "success"
    events = api._call("GET", "/assets/events", params={"source_run_id": run_id})["asset_events"]
    assert [e["uri"] for e in events] == [output], events


def test_openlineage_events_name_the_dataset_and_the_model(
    deployment: Deployment, api: Airflow, run_id: str
) -> None:
    """With the OpenLineage provider installed (console transport), the task's COMPLETE event has the
    dataset as input and the model as output."""
    root = _dataset(deployment, run_id)
    dataset, output = f"file://{root}/data", f"file://{root}/model"
    api.trigger("tf_conv_assets", run_id, {"dataset": dataset, "output": output})
    assert api.wait_run("tf_conv_assets", run_id, timeout=300)["state"] == "success"
    log = api.log("tf_conv_assets", run_id, "train", 1)
    complete = [
        line for line in log.splitlines() if '"eventType": "COMPLETE"' in line or "eventType=COMPLETE" in line
    ]
    assert complete, log[-4000:]
    assert str(root / "data") in complete[-1] and str(root / "model") in complete[-1], complete[-1][:2000]


# -- connections -------------------------------------------------------------------------------------------


def test_a_cncf_kubernetes_connection_reaches_the_cluster(
    deployment: Deployment, api: Airflow, testbed: Testbed, namespace: str, run_id: str
) -> None:
    """``conn_id="kubernetes_default"`` (a cncf.kubernetes connection with ``kube_config_path``) works."""
    api.trigger("tf_conv_cncf_conn", run_id, {"namespace": namespace})
    run = api.wait_run("tf_conv_cncf_conn", run_id, timeout=300)
    assert run["state"] == "success", api.log("tf_conv_cncf_conn", run_id, "train", 1)[-3000:]
    assert len(testbed.trainjobs(namespace)) == 1


@pytest.mark.parametrize("prefix", ["", "extra__kubernetes__"])
def test_cncf_connection_extras_are_understood(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """The extras a cncf.kubernetes connection carries map onto the trainflow backend's settings."""
    import json

    from trainflow.airflow import TrainJobHook

    extra = {
        f"{prefix}kube_config_path": "/etc/kube/config",
        f"{prefix}cluster_context": "prod",
        f"{prefix}namespace": "ml",
        f"{prefix}disable_verify_ssl": True,
    }
    monkeypatch.setenv("AIRFLOW_CONN_TF_CNCF", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    name, kwargs = TrainJobHook("tf_cncf").backend_config()
    assert name == "kubernetes"
    assert kwargs["kubeconfig"] == "/etc/kube/config" and kwargs["context"] == "prod", kwargs
    assert kwargs["namespace"] == "ml", kwargs
    assert kwargs.get("verify_ssl") is False or kwargs.get("disable_verify_ssl") is True, kwargs


# -- arguments ---------------------------------------------------------------------------------------------


def test_queue_that_looks_like_a_kueue_queue_warns() -> None:
    """``queue`` is Airflow's executor queue; a user who meant Kueue is told about ``kueue_queue``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = _operator(queue="gpu-queue")
    assert op.queue == "gpu-queue"  # Airflow's meaning is kept
    assert any("kueue_queue" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_kubernetes_style_resources_get_a_clear_error() -> None:
    """``resources`` is Airflow's executor resources; Kubernetes quantities there name ``resources_per_node``."""
    with pytest.raises(Exception, match="resources_per_node") as info:
        _operator(resources={"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 1})
    assert not isinstance(info.value, TypeError), info.value


def test_more_fields_are_templated() -> None:
    from trainflow.airflow import TrainJobOperator

    fields = set(TrainJobOperator.template_fields)
    assert {"tolerations", "volumes", "runtime_patches", "conn_id", "request_file"} <= fields, sorted(fields)
    assert {".yaml", ".yml", ".json"} <= set(TrainJobOperator.template_ext), TrainJobOperator.template_ext


def test_every_operator_argument_is_in_the_parameter_reference() -> None:
    """The provider README documents every argument with its type and default, and says which are templated."""
    from trainflow.airflow import TrainJobOperator

    text = README.read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\|\s*`([a-z_]+)`\s*\|.*$", text, re.M)}
    params = [
        p
        for p in inspect.signature(TrainJobOperator.__init__).parameters.values()
        if p.kind == p.KEYWORD_ONLY
    ]
    missing = [p.name for p in params if p.name not in rows]
    assert not missing, f"not in the parameter reference: {missing}"
    for name in TrainJobOperator.template_fields:
        if name in rows:
            assert "templated" in rows[name].lower() or "yes" in rows[name].lower(), rows[name]
