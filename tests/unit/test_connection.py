"""One connection-override rule (core/connection.py): the step's arguments over a connection over defaults,
under one set of names (cncf.kubernetes' included), for the Airflow hook, the CLI, a KFP step and
get_backend alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow.core import get_backend
from trainflow.core.connection import connection_config
from trainflow.core.errors import InvalidRequest


def kubeconfig(tmp_path: Path, name: str = "kc.yaml", context: str = "one") -> Path:
    path = tmp_path / name
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": c, "cluster": {"server": f"https://{c}.example:6443"}} for c in ("one", "two")],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": c, "context": {"cluster": c, "user": "u", "namespace": f"ns-{c}"}}
            for c in ("one", "two")
        ],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_arguments_win_over_the_connection_which_wins_over_defaults() -> None:
    name, kwargs = connection_config(
        {"namespace": "from-args", "kubeconfig": "/a/kc"},
        {"namespace": "from-conn", "in_cluster": True, "cluster_context": "prod", "backend": "kubernetes"},
        {"backend": "local", "home": "/unused"},
    )
    # the arguments name a way (a kubeconfig): the connection's in_cluster does not override it
    assert (name, kwargs) == (
        "kubernetes",
        {"namespace": "from-args", "kubeconfig": "/a/kc", "context": "prod"},
    )
    assert connection_config(None, None, {"backend": "local", "home": "/h"}) == ("local", {"home": "/h"})


def test_one_name_per_setting_whatever_the_adapter_calls_it() -> None:
    cncf = {"kube_config_path": "/k", "cluster_context": "c", "disable_verify_ssl": "true"}
    ours = {"kubeconfig_path": "/k", "context": "c", "disable_verify_ssl": True}
    args = {"kubeconfig": "/k", "context": "c", "verify_ssl": False}
    aliases = {"kubeconfig_path": "/k", "cluster_context": "c", "verify_ssl": "false"}
    expected = ("kubernetes", {"kubeconfig": "/k", "context": "c", "verify_ssl": False})
    assert connection_config(None, cncf) == connection_config(None, ours) == expected
    assert connection_config(args) == connection_config(aliases) == expected
    assert connection_config(None, args, connection_names="arguments") == expected


def test_values_are_read_not_trusted() -> None:
    # a string "false" is false (it used to reach the kubernetes backend as a truthy string from a KFP step)
    assert connection_config({"in_cluster": "false", "kubeconfig": "/k"}) == (
        "kubernetes",
        {"kubeconfig": "/k"},
    )
    with pytest.raises(InvalidRequest) as info:
        connection_config(None, {"in_cluster": "maybe"}, connection_subject="kubeflow_trainer connection 'c'")
    assert str(info.value).startswith("invalid kubeflow_trainer connection 'c': extra.in_cluster: 'maybe'")
    with pytest.raises(InvalidRequest) as info:
        connection_config({"backend": "kubernets"})
    assert info.value.fields == ["backend"]
    with pytest.raises(InvalidRequest, match="mutually exclusive"):
        connection_config(None, {"kube_config_path": "/k", "kube_config": "apiVersion: v1"})
    with pytest.raises(InvalidRequest) as info:
        connection_config(None, {"kubeconfig": "s3cr3t-token"})
    assert "s3cr3t" not in str(info.value) and info.value.fields == ["extra.kubeconfig"]


def test_get_backend_reads_the_same_names(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path)
    backend = get_backend("kubernetes", kubeconfig_path=str(path), cluster_context="two")  # was a TypeError
    assert (backend.cluster.server, backend.namespace) == ("https://two.example:6443", "ns-two")
    local = get_backend("local", local_home=str(tmp_path / "home"), namespace="n")
    assert Path(local.home) == tmp_path / "home"


def test_a_kfp_step_namespace_wins_over_its_backend_config(tmp_path: Path) -> None:
    from trainflow.kfp.runner import _backend

    backend = _backend("local", "from-step", {"namespace": "from-config", "home": str(tmp_path)})
    assert backend.namespace == "from-step"  # was from-config: backend_config overrode the step's argument
    path = kubeconfig(tmp_path)
    cluster = _backend("kubernetes", None, {"kubeconfig": str(path), "in_cluster": "false", "context": "two"})
    assert cluster.cluster.server == "https://two.example:6443"  # "false" was a truthy string: in-cluster


def test_the_airflow_hook_merges_by_the_core_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trainflow.airflow.hooks import TrainJobHook

    extra = {
        "extra__kubernetes__in_cluster": True,
        "extra__kubernetes__cluster_context": "two",
        "namespace": "ml",
    }
    monkeypatch.setenv("AIRFLOW_CONN_TF_HOUSE", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    path = str(kubeconfig(tmp_path))
    name, kwargs = TrainJobHook("tf_house", kubeconfig=path).backend_config()
    # the operator's kubeconfig wins over the connection's in_cluster (it used to lose to it)
    assert (name, kwargs) == ("kubernetes", {"namespace": "ml", "kubeconfig": path, "context": "two"})
    assert TrainJobHook("tf_house").backend_config() == (
        "kubernetes",
        {"namespace": "ml", "in_cluster": True, "context": "two"},
    )


def test_the_cli_merges_by_the_core_rule(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from trainflow.core.cli import cli

    args: list[Any] = ["--backend", "local", "--home", str(tmp_path), "-n", "team", "render"]
    out = CliRunner().invoke(cli, [*args, "--name", "x", "--", "python3", "-c", "pass"])
    assert out.exit_code == 0, out.output
    assert yaml.safe_load(out.output)["metadata"]["namespace"] == "team"
