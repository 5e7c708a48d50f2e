"""Airflow's conventions where a DAG author meets them, at DAG parse and render (no task run, no backend):
Airflow's own ``queue``/``resources``, templated fields and ``request_file``, the parameter reference, the
clear-vs-retry rule, task-log status lines, log node choice, lineage names.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainflow.airflow import TrainJobOperator

REPO = Path(__file__).resolve().parents[2]
README = REPO / "providers" / "airflow" / "trainflow" / "airflow" / "README.md"


def _operator(**kwargs: Any) -> Any:
    return TrainJobOperator(task_id="t", runtime="jax-distributed", command=["true"], **kwargs)


def _queue_warnings(**kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = _operator(**kwargs)
    assert op.queue == kwargs.get("queue", op.queue)  # Airflow's meaning is kept
    return [str(w.message) for w in caught if "kueue_queue" in str(w.message)]


def test_queue_that_looks_like_a_kueue_queue_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """``queue`` is Airflow's executor queue; a user who meant Kueue is told about ``kueue_queue``."""
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert _queue_warnings(queue="gpu-queue")  # LocalExecutor ignores queues: surely not meant for it
    assert _queue_warnings(queue="a100")
    assert not _queue_warnings(queue="gpu-queue", kueue_queue="team-a")  # both given: both meant
    assert not _queue_warnings()  # the default queue
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    assert not _queue_warnings(queue="a100")  # a Celery queue name
    assert _queue_warnings(queue="team-a-queue")  # reads like a Kueue LocalQueue


def test_kubernetes_style_resources_get_a_clear_error() -> None:
    """``resources`` is Airflow's executor resources; Kubernetes quantities there name ``resources_per_node``."""
    with pytest.raises(ValueError, match="resources_per_node") as info:
        _operator(resources={"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 1})
    assert "cpu, memory, nvidia.com/gpu" in str(info.value)
    assert _operator(resources={"cpus": 2}).resources is not None  # Airflow's own keys keep working


def test_more_fields_are_templated() -> None:
    fields = set(TrainJobOperator.template_fields)
    assert {"tolerations", "volumes", "runtime_patches", "conn_id", "request_file"} <= fields, sorted(fields)
    assert {".yaml", ".yml", ".json"} <= set(TrainJobOperator.template_ext), TrainJobOperator.template_ext


def test_request_file_is_rendered_and_only_it_is_read_as_a_file(tmp_path: Path) -> None:
    """The file is found through the DAG's template_searchpath and rendered with Jinja; a URI or an argument
    ending in ``.json`` stays a string (Airflow would look each up as a template file otherwise)."""
    from airflow.sdk import DAG

    (tmp_path / "train.yaml").write_text(
        "runtime: jax-distributed\nnum_nodes: {{ params.nodes }}\ncommand: [python3, train.py]\n"
        "env: {RUN: '{{ run_id }}'}\n"
    )
    with DAG("d", schedule=None, template_searchpath=[str(tmp_path)], params={"nodes": 3}) as dag:
        op = TrainJobOperator(
            task_id="t",
            request_file="train.yaml",
            dataset_uri="file:///data/{{ params.nodes }}/train.json",
            args=["--config", "conf.yaml"],
            request={"num_nodes": 2},
        )
    dag.resolve_template_files()
    op.render_template_fields({"params": {"nodes": 3}, "run_id": "r1"})
    fields = op.request_fields()
    assert fields["runtime"] == "jax-distributed" and fields["env"] == {"RUN": "r1"}
    assert fields["num_nodes"] == 2  # request wins over the file
    assert fields["dataset_uri"] == "file:///data/3/train.json"
    assert fields["args"] == ["--config", "conf.yaml"]
    with pytest.raises(ValueError, match="request_file"):
        TrainJobOperator(task_id="u", request_file="train.txt")


def test_a_bad_request_file_names_the_field() -> None:
    from trainflow.core import InvalidRequest

    op = _operator(request_file="x.yaml")
    op.request_file = "runtime: a\nruntime: b\n"  # as rendered
    with pytest.raises(InvalidRequest, match=r"request_file.*duplicate key 'runtime'"):
        op.request_fields()


def test_every_operator_argument_is_in_the_parameter_reference() -> None:
    """The provider README documents every argument with its type and default, says which are templated,
    and is what providers/airflow/reference.py generates from the code (so it cannot go stale)."""
    spec = importlib.util.spec_from_file_location(
        "provider_reference", REPO / "providers/airflow/reference.py"
    )
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    text = README.read_text()
    assert reference.render(text) == text, "the parameter reference is stale: run 'make provider-reference'"
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\|\s*`([a-z_]+)`\s*\|.*$", text, re.M)}
    params = [
        p
        for p in inspect.signature(TrainJobOperator.__init__).parameters.values()
        if p.kind == p.KEYWORD_ONLY
    ]
    assert not [p.name for p in params if p.name not in rows]

    def templated(name: str) -> str:
        return re.split(r"(?<!\\)\|", rows[name])[4].strip()  # cells, \| inside a cell is not a border

    assert {name: templated(name) for name in TrainJobOperator.template_fields} == dict.fromkeys(
        TrainJobOperator.template_fields, "yes"
    )
    assert templated("function") == "no"


@pytest.mark.parametrize(
    ("try_number", "max_tries", "retries", "new_run"),
    [
        (1, 2, 2, False),  # the first try: a completed job of this identity stands
        (2, 2, 2, False),  # a retry
        (3, 2, 2, False),  # the last retry
        (2, 3, 2, True),  # cleared after try 1: max_tries = 1 + retries
        (4, 5, 2, True),  # cleared after try 3
        (5, 5, 2, False),  # ... and that run's retry
        (2, 1, 0, True),  # no retries: any later try was a clear
    ],
)
def test_a_clear_is_told_from_a_retry(try_number: int, max_tries: int, retries: int, new_run: bool) -> None:
    from trainflow.airflow.identity import is_new_run

    ti = SimpleNamespace(try_number=try_number, max_tries=max_tries)
    assert is_new_run({"ti": ti}, retries) is new_run  # type: ignore[arg-type]


def test_status_lines_show_state_changes_and_progress_every_ten_points() -> None:
    from trainflow.airflow.logstream import StatusLines
    from trainflow.core.result import JobState, TrainJobResult

    lines: list[str] = []
    status = StatusLines("ns/job", lambda fmt, *a: lines.append(fmt % a))
    for state, progress in [
        ("Created", None),
        ("Running", None),
        *[("Running", p) for p in range(0, 101, 2)],
    ]:
        status(TrainJobResult(name="job", namespace="ns", state=JobState(state), progress=progress))
    status(TrainJobResult(name="job", namespace="ns", state=JobState.COMPLETE, progress=100))
    assert lines[:3] == [
        "TrainJob ns/job: Created",
        "TrainJob ns/job: Running",
        "TrainJob ns/job: Running, progress 0%",
    ]
    assert len(lines) == 3 + 10 + 1, lines  # 10..100 in steps of ten, then Complete


def test_log_nodes_choose_the_steps_within_the_job() -> None:
    from trainflow.airflow.logstream import log_steps, node_count

    assert log_steps(0, 4) == ["node-0"]
    assert log_steps([0, 3, 3, 9], 4) == ["node-0", "node-3"]
    assert log_steps("all", 3) == ["node-0", "node-1", "node-2"]
    # initializers the job runs come first (they run first); one it does not run is left out
    runs = {"dataset-initializer"}
    assert log_steps(["model-initializer", 0, "dataset-initializer"], 2, runs) == [
        "dataset-initializer",
        "node-0",
    ]
    assert log_steps("dataset-initializer", 2, runs) == ["dataset-initializer"]
    assert log_steps("model-initializer", 2, runs) == ["node-0"]
    from trainflow.core.runtimes import Runtime

    two = Runtime(name="r", ml_policy={"numNodes": 2, "torch": {}})
    assert node_count({"spec": {"trainer": {"numNodes": 5}}}, two) == 5
    assert node_count({"spec": {}}, two) == 2 and node_count({}, None) == 1


def test_the_initializers_a_job_runs() -> None:
    from trainflow.airflow.arguments import _log_nodes_ok
    from trainflow.airflow.logstream import initializer_steps
    from trainflow.core.runtimes import find_runtime, local_catalog

    torch = find_runtime(local_catalog(), "torch-distributed")
    tune = find_runtime(local_catalog(), "torchtune-llama3.2-1b")
    with_dataset = {"spec": {"initializer": {"dataset": {"storageUri": "hf://x/y"}}}}
    assert initializer_steps(with_dataset, torch) == {"dataset-initializer"}
    assert initializer_steps({"spec": {}}, torch) == set()
    assert initializer_steps({"spec": {}}, tune) == {"dataset-initializer", "model-initializer"}
    assert _log_nodes_ok([0, "model-initializer", "all"])
    for bad in ("rank0", ["node-0"], [], [True], -1, "initializer"):
        assert not _log_nodes_ok(bad), bad


def test_lineage_names_and_parse_time_assets() -> None:
    from airflow.sdk import Asset, AssetAlias

    from trainflow.airflow.lineage import OUTPUT_ALIAS, ol_dataset_name

    assert ol_dataset_name("file:///data/train") == ("file", "/data/train")
    assert ol_dataset_name("s3://bucket/models/m1") == ("s3://bucket", "models/m1")
    assert ol_dataset_name("hf://meta-llama/Llama-3.2-1B") == ("hf://meta-llama", "Llama-3.2-1B")
    static = _operator(dataset_uri="s3://b/data", output_uri="s3://b/model")
    assert static.inlets == [Asset("s3://b/data")] and static.outlets == [Asset("s3://b/model")]
    templated = _operator(output_uri="s3://b/{{ run_id }}")
    assert templated.inlets == [] and templated.outlets == [AssetAlias(OUTPUT_ALIAS)]


@pytest.mark.parametrize("prefix", ["", "extra__kubernetes__"])
def test_cncf_connection_extras_are_understood(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """A cncf.kubernetes ``kubernetes`` connection's extras (plain or prefixed) reach the same cluster here."""
    import json

    from trainflow.airflow import TrainJobHook

    extra = {
        f"{prefix}kube_config_path": "/etc/kube/config",
        f"{prefix}cluster_context": "prod",
        f"{prefix}namespace": "ml",
        f"{prefix}disable_verify_ssl": "true",
        f"{prefix}disable_tcp_keepalive": True,
    }
    monkeypatch.setenv("AIRFLOW_CONN_TF_CNCF", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    name, kwargs = TrainJobHook("tf_cncf").backend_config()
    assert (name, kwargs) == (
        "kubernetes",
        {"kubeconfig": "/etc/kube/config", "context": "prod", "namespace": "ml", "verify_ssl": False},
    )
    inline = {
        f"{prefix}kube_config": json.dumps({"apiVersion": "v1", "clusters": []}),
        f"{prefix}in_cluster": "",
    }
    monkeypatch.setenv("AIRFLOW_CONN_TF_CNCF", json.dumps({"conn_type": "kubernetes", "extra": inline}))
    assert TrainJobHook("tf_cncf").backend_config()[1] == {
        "config_dict": {"apiVersion": "v1", "clusters": []}
    }


def test_disable_verify_ssl_reaches_the_kubernetes_client(tmp_path: Path) -> None:
    """``verify_ssl=False`` is what the kubernetes client is configured with (sync and asyncio)."""

    import yaml

    from trainflow.core.kube.config import load_cluster_config

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert load_cluster_config(kubeconfig=str(kubeconfig)).verify_ssl is True
    cluster = load_cluster_config(kubeconfig=str(kubeconfig), verify_ssl=False)
    assert cluster.verify_ssl is False and cluster.insecure  # one setting, read by both transports


def test_a_rendered_output_uri_is_recorded_through_the_alias() -> None:
    """At run time templates are rendered, so the alias outlet (not the argument) says the event is ours."""
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from trainflow.airflow.lineage import OUTPUT_ALIAS, record_output

    templated = _operator(output_uri="s3://b/{{ run_id }}")
    templated.output_uri = "s3://b/r1"  # as rendered
    events = OutletEventAccessors()
    record_output({"outlet_events": events}, templated.outlets, ["s3://b/r1"])
    added = events[AssetAlias(OUTPUT_ALIAS)].asset_alias_events
    assert [e.dest_asset_key.uri for e in added] == ["s3://b/r1"], added
    static = _operator(output_uri="s3://b/model")
    events = OutletEventAccessors()
    record_output(
        {"outlet_events": events}, static.outlets, ["s3://b/model"]
    )  # Airflow records Asset outlets
    assert not events[AssetAlias(OUTPUT_ALIAS)].asset_alias_events
    assert static.outlets == [Asset("s3://b/model")]


def test_the_output_comes_from_the_result_when_the_request_names_one() -> None:
    """The asset and the OpenLineage output are the result's ``output_uri`` (where the trainer wrote), and only
    when the request asked for an output: a local engine's own folder for one run is not an asset."""
    from trainflow.airflow.lineage import Lineage
    from trainflow.core.request import TrainJobRequest
    from trainflow.core.result import JobState, TrainJobResult

    result = TrainJobResult(name="j", namespace="n", state=JobState.COMPLETE, output_uri="s3://b/m/run1")
    named = Lineage.of(TrainJobRequest(output_uri="s3://b/m/{{ run_id }}", dataset_uri="hf://d/x"))
    assert named.outputs(result) == ["s3://b/m/run1"] and named.inputs == ("hf://d/x",)
    assert Lineage.from_dict(named.to_dict()) == named  # carried through a deferral
    assert Lineage.of(TrainJobRequest()).outputs(result.replace(output_uri="file:///home/j/output")) == []
