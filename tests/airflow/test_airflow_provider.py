"""Provider registration, connection form, hook configuration and DAG-parse import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bounds import HANG

AIRFLOW_PKG = Path(__import__("airflow").__file__).parent


def test_provider_info_is_valid_against_airflows_schema() -> None:
    from trainflow.airflow.provider_info import get_provider_info

    schema = json.loads((AIRFLOW_PKG / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    conn = info["connection-types"][0]
    assert conn["connection-type"] == "kubeflow_trainer"
    assert set(conn["conn-fields"]) == {
        "backend",
        "in_cluster",
        "kubeconfig_path",
        "kubeconfig",
        "context",
        "namespace",
        "local_home",
    }
    assert conn["conn-fields"]["kubeconfig"]["schema"]["format"] == "password"
    assert set(info["config"]["trainflow"]["options"]) >= {"default_deferrable", "dashboard_url_template"}


def test_every_declared_class_imports() -> None:
    import importlib

    from trainflow.airflow.provider_info import get_provider_info

    info = get_provider_info()
    paths = [info["connection-types"][0]["hook-class-name"], *info["extra-links"]]
    paths += [d["class-name"] for d in info["task-decorators"]]
    for section in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for path in paths:
        module, _, name = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), path


def test_providers_manager_registers_hook_form_decorator_and_config() -> None:
    import importlib.util

    from airflow.providers_manager import ProvidersManager

    from trainflow.airflow.version_compat import AIRFLOW_V_3_2_PLUS

    pm = ProvidersManager()
    runtime: Any = pm  # before the task SDK's own providers manager (3.2), the one manager serves both
    if importlib.util.find_spec("airflow.sdk") and importlib.util.find_spec(
        "airflow.sdk.providers_manager_runtime"
    ):
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

        runtime = ProvidersManagerTaskRuntime()
    assert "trainflow" in pm.providers
    assert runtime.hooks["kubeflow_trainer"].hook_class_name == "trainflow.airflow.hooks.TrainJobHook"
    widgets = pm.connection_form_widgets
    assert widgets["extra__kubeflow_trainer__kubeconfig"].is_sensitive
    assert not widgets["extra__kubeflow_trainer__namespace"].is_sensitive
    if AIRFLOW_V_3_2_PLUS:  # conn-fields: a JSON schema per field
        assert widgets["extra__kubeflow_trainer__backend"].field["schema"]["enum"] == ["kubernetes", "local"]
    else:  # the hook's WTForms fields
        assert widgets["extra__kubeflow_trainer__backend"].field.kwargs["default"] == "kubernetes"
    assert "trainjob" in runtime.taskflow_decorators
    assert "trainflow.airflow.links.TrainJobLink" in pm.extra_links_class_names
    config = dict(pm.provider_configs)["trainflow"]["trainflow"]["options"]
    assert config["default_deferrable"]["default"] is None  # unset: [operators] default_deferrable decides


def test_airflow_providers_list_shows_trainflow(af, airflow_db: Path, tmp_path: Path) -> None:
    result = af.run(
        [str(af.bin / "airflow"), "providers", "list"], af.env(tmp_path), HANG, tmp_path / "list.log"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("trainflow ")), None)
    assert line is not None, result.stdout[-3000:]
    assert "0.1.0" in line


def test_hook_reads_connection_extras(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trainflow.airflow.hooks import TrainJobHook

    extra = {"backend": "kubernetes", "kubeconfig_path": "~/kc.yaml", "context": "kind-x", "namespace": "ml"}
    monkeypatch.setenv("AIRFLOW_CONN_TF_K8S", json.dumps({"conn_type": "kubeflow_trainer", "extra": extra}))
    name, kwargs = TrainJobHook("tf_k8s").backend_config()
    assert name == "kubernetes"
    assert kwargs == {
        "namespace": "ml",
        "kubeconfig": str(Path("~/kc.yaml").expanduser()),
        "context": "kind-x",
    }
    # operator arguments win over the connection
    name, kwargs = TrainJobHook("tf_k8s", namespace="other", in_cluster=True).backend_config()
    assert kwargs == {"namespace": "other", "in_cluster": True, "context": "kind-x"}

    monkeypatch.setenv(
        "AIRFLOW_CONN_TF_LOCAL",
        json.dumps(
            {"conn_type": "kubeflow_trainer", "extra": {"backend": "local", "local_home": str(tmp_path)}}
        ),
    )
    backend = TrainJobHook("tf_local").get_conn()
    assert backend.name == "local"
    assert Path(backend.home) == tmp_path


def test_hook_inline_kubeconfig_is_parsed_and_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.airflow.hooks import TrainJobHook
    from trainflow.core import InvalidRequest

    kubeconfig = "apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: s3cr3t-token}}]\n"
    monkeypatch.setenv(
        "AIRFLOW_CONN_TF_INLINE",
        json.dumps({"conn_type": "kubeflow_trainer", "extra": {"kubeconfig": kubeconfig}}),
    )
    name, kwargs = TrainJobHook("tf_inline").backend_config()
    assert name == "kubernetes"
    assert kwargs["config_dict"]["users"][0]["user"]["token"] == "s3cr3t-token"

    monkeypatch.setenv(
        "AIRFLOW_CONN_TF_BAD",
        json.dumps({"conn_type": "kubeflow_trainer", "extra": {"kubeconfig": "s3cr3t-token"}}),
    )
    with pytest.raises(InvalidRequest) as err:
        TrainJobHook("tf_bad").backend_config()
    assert "s3cr3t" not in str(err.value)
    assert "extra.kubeconfig" in str(err.value) and "tf_bad" in str(err.value)

    both = {"kubeconfig": kubeconfig, "in_cluster": True}
    monkeypatch.setenv("AIRFLOW_CONN_TF_BOTH", json.dumps({"conn_type": "kubeflow_trainer", "extra": both}))
    with pytest.raises(InvalidRequest, match="mutually exclusive"):
        TrainJobHook("tf_both").backend_config()


def test_missing_connection_falls_back_to_default_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainflow.airflow.hooks import TrainJobHook

    name, kwargs = TrainJobHook("does_not_exist").backend_config()
    assert (name, kwargs) == ("kubernetes", {})  # kubeconfig / in-cluster discovery by the core
    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DEFAULT_BACKEND", "local")
    monkeypatch.setenv("AIRFLOW__TRAINFLOW__LOCAL_HOME", str(tmp_path))
    assert TrainJobHook("does_not_exist").backend_config() == ("local", {"home": str(tmp_path)})


PARSE_PROBE = """
import sys
from datetime import datetime
try:
    from airflow.sdk import DAG
except ImportError:  # Airflow 2
    from airflow import DAG
import trainflow.airflow
from trainflow.airflow import TrainJobOperator, TrainJobSensor
with DAG("probe", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    TrainJobOperator(task_id="t", function="pkg.mod:train", num_nodes=2, env={"A": "{{ ds }}"})
    TrainJobSensor(task_id="s", job_name="x")
heavy = ("kubernetes", "kubernetes_asyncio", "torch", "trainflow.core", "yaml", "tenacity")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith("trainflow.core"))
print("LOADED", loaded)
"""
# What the parse-time check needs: the request model, its errors, and (for a 'module:function' text) the
# function-reference rule; no kubernetes client, no torch.
PARSE_TIME_CORE = {
    "trainflow.core",
    "trainflow.core.request",
    "trainflow.core.errors",
    "trainflow.core.function_trainer",
    "trainflow.core.reporting",
}


def test_dag_parse_does_not_import_heavy_modules(af, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PARSE_PROBE],
        capture_output=True,
        text=True,
        timeout=HANG,
        env=af.env(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("LOADED"))
    loaded = eval(line[len("LOADED ") :])
    heavy = [m for m in loaded if m.startswith(("kubernetes", "torch", "trainflow.core"))]
    assert not [m for m in heavy if m not in PARSE_TIME_CORE], loaded


def test_the_page_link_always_and_the_dashboard_link_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from trainflow.airflow.links import TrainJobLink, TrainJobPageLink, format_link
    from trainflow.airflow.operators import TrainJobOperator
    from trainflow.airflow.version_compat import AIRFLOW_V_3_0_PLUS

    op = TrainJobOperator(task_id="t", function="m:f")
    assert [type(link) for link in op.operator_extra_links] == [
        TrainJobPageLink
    ]  # every line serves the page
    key = SimpleNamespace(dag_id="d", run_id="manual__2026-01-01T00:00:00+00:00", task_id="t", map_index=-1)
    # the web server's base URL: [api] base_url on 3.x, [webserver] base_url on 2.x
    section = "API" if AIRFLOW_V_3_0_PLUS else "WEBSERVER"
    monkeypatch.setenv(f"AIRFLOW__{section}__BASE_URL", "https://airflow.example.com/af/")
    page = op.operator_extra_links[0].get_link(op, ti_key=key)
    assert page == "/af/trainflow/jobs/d/manual__2026-01-01T00%3A00%3A00%2B00%3A00/t?map_index=-1"
    monkeypatch.setenv("AIRFLOW__TRAINFLOW__DASHBOARD_URL_TEMPLATE", "https://dash/{namespace}/{name}")
    links = tuple(op.operator_extra_links)
    assert [type(link) for link in links] == [TrainJobPageLink, TrainJobLink]
    op._trainjob_ref = {"name": "job-a", "namespace": "ml"}
    assert links[1].get_link(op, ti_key=None) == "https://dash/ml/job-a"
    assert format_link("https://dash/{nope}", {"name": "a"}) == ""


def test_the_trigger_reads_its_connection_without_a_blocking_call_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the triggerer's loop, ``Connection.extra_dejson`` (a synchronous call to the supervisor to mask the
    secrets) can raise ``DeadlockImminentError``: the hook reads through ``connection_reads``, which awaits
    Airflow's own async read where the line has one and runs the synchronous one on a worker thread before.
    Here the synchronous property fails whenever it is called on a thread running an event loop."""
    import asyncio

    from trainflow.airflow.compat_sdk import Connection
    from trainflow.airflow.hooks import TrainJobHook
    from trainflow.core import InvalidRequest

    sync_extra = Connection.extra_dejson

    def on_the_loop_fails(conn: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return sync_extra.fget(conn)  # type: ignore[attr-defined]
        raise AssertionError("extra_dejson called on the event loop's thread")

    monkeypatch.setattr(Connection, "extra_dejson", property(on_the_loop_fails))
    extra = {"backend": "local", "namespace": "ns1", "kubeconfig": "apiVersion: v1"}
    monkeypatch.setenv("AIRFLOW_CONN_TF_ASYNC", json.dumps({"conn_type": "kubeflow_trainer", "extra": extra}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_TF_ASYNC_BAD", json.dumps({"conn_type": "kubeflow_trainer", "extra": "[1]"})
    )

    from trainflow.airflow.hooks import not_found

    async def read() -> tuple[Any, Any, str]:
        got = await TrainJobHook("tf_async").aconnection_extra()
        missing = await TrainJobHook("tf_async_missing").aconnection_extra()
        # Airflow 3.0 itself drops an environment connection whose extra is not an object ("not found"):
        # the hook tells the same error from the environment variable, never falls back to discovery
        with pytest.raises(InvalidRequest, match="'tf_async_bad': extra: is a JSON list") as err:
            await TrainJobHook("tf_async_bad").aconnection_extra()
        return got, missing, str(err.value)

    got, missing, _ = asyncio.run(read())
    assert got == extra and missing is None
    assert asyncio.run(TrainJobHook("tf_async").aget_backend()).namespace == "ns1"
    with pytest.raises(InvalidRequest, match="'tf_async_bad': extra: is a JSON list"):
        TrainJobHook("tf_async_bad").connection_extra()  # the sync path says the same
    # what the hook does when Airflow says "not found": nothing set is fine; a variable Airflow could not read
    # is an error naming the variable
    not_found("tf_async_missing")
    monkeypatch.setenv("AIRFLOW_CONN_TF_UNREAD", "not a connection")
    with pytest.raises(InvalidRequest, match="AIRFLOW_CONN_TF_UNREAD: is set, but Airflow could not read it"):
        not_found("tf_unread")
