"""Namespace discovery and private client configuration of the Kubernetes backend."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client as k8s_client

from trainflow.core.errors import BackendError
from trainflow.core.kube.config import context_namespace, discover_namespace, load_cluster_config


def kubeconfig(server: str, contexts: dict[str, str | None], current: str | None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [
            {"name": n, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
            for n, ns in contexts.items()
        ],
        **({"current-context": current} if current else {}),
    }


def test_discover_namespace_order(tmp_path):
    sa = tmp_path / "namespace"
    sa.write_text("from-sa\n")
    assert discover_namespace("explicit", "ctx", sa) == "explicit"
    assert discover_namespace(None, "ctx", sa) == "ctx"
    assert discover_namespace(None, None, sa) == "from-sa"
    assert discover_namespace(None, None, tmp_path / "missing") == "default"
    sa.write_text("  \n")
    assert discover_namespace(None, None, sa) == "default"


def test_context_namespace_current_and_named():
    doc = kubeconfig("https://127.0.0.1:1", {"a": "team-a", "b": None}, "a")
    assert context_namespace([doc], None) == ("a", "team-a")
    assert context_namespace([doc], "b") == ("b", None)
    assert context_namespace([kubeconfig("https://x", {"a": "n"}, None)], None) == (None, None)


def test_kubeconfig_file_context_namespace_and_private_config(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    before = k8s_client.Configuration.get_default_copy().host
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", {"a": "team-a", "b": "team-b"}, "a")))
    cc = load_cluster_config(kubeconfig=str(path))
    assert (cc.server, cc.namespace, cc.context) == ("https://127.0.0.1:6443", "team-a", "a")
    assert "Bearer t0ken" in cc.sync_configuration().api_key.values()
    assert cc.sync_configuration().retries is False  # tenacity is the only retry layer
    assert load_cluster_config(kubeconfig=str(path), context="b").namespace == "team-b"
    assert load_cluster_config(kubeconfig=str(path), context="b", namespace="x").namespace == "x"
    # the process-wide default configuration is untouched
    assert k8s_client.Configuration.get_default_copy().host == before


def test_kubeconfig_env_with_several_files(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    first, second = tmp_path / "one", tmp_path / "two"
    first.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:7001", {"one": None}, "one")))
    second.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:7002", {"two": "ns-two"}, "two")))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    cc = load_cluster_config()
    assert (cc.context, cc.server) == ("one", "https://127.0.0.1:7001")
    assert cc.namespace == "default"
    # the same a:b list given explicitly (the CLI passes $KUBECONFIG as --kubeconfig), and a context of file
    # two; its cluster name is taken by file one, and as with kubectl the first file to define a name wins
    explicit = load_cluster_config(kubeconfig=f"{first}:{second}", context="two")
    assert (explicit.server, explicit.namespace) == ("https://127.0.0.1:7001", "ns-two")
    assert "Bearer t0ken" in explicit.sync_configuration().api_key.values()


def test_unknown_context_names_the_choices(tmp_path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", {"a": None, "b": None}, "a")))
    with pytest.raises(BackendError, match=r"context 'c' not found .*contexts: a, b"):
        load_cluster_config(kubeconfig=str(path), context="c")


def test_config_dict_for_airflow_connections(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # ignored: an explicit config wins
    cc = load_cluster_config(config_dict=kubeconfig("https://127.0.0.1:9443", {"x": "ml"}, "x"))
    assert (cc.server, cc.namespace, cc.in_cluster) == ("https://127.0.0.1:9443", "ml", False)


def test_missing_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BackendError, match="no kubeconfig found") as err:
        load_cluster_config(kubeconfig=str(tmp_path / "nope"))
    assert "=" not in str(err.value)  # no Python keyword arguments in a message CLI users read


def test_in_cluster_without_service_account_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(BackendError, match="in-cluster service account"):
        load_cluster_config()


VERSION_FIELDS = (
    "major",
    "minor",
    "gitVersion",
    "gitCommit",
    "gitTreeState",
    "buildDate",
    "goVersion",
    "compiler",
    "platform",
)


def test_token_reaches_the_server_from_sync_and_async_clients(tmp_path, monkeypatch):
    """kubernetes 30 stores the token as 'authorization', kubernetes_asyncio reads 'BearerToken': both must send it."""
    import asyncio
    import http.server
    import threading

    from kubernetes_asyncio import client as async_client

    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({k: "x" for k in VERSION_FIELDS}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        path = tmp_path / "config"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        path.write_text(yaml.safe_dump(kubeconfig(url, {"a": "ns"}, "a")))
        cc = load_cluster_config(kubeconfig=str(path))
        k8s_client.VersionApi(k8s_client.ApiClient(cc.sync_configuration())).get_code()

        async def async_get():
            async with async_client.ApiClient(await cc.async_configuration()) as api:
                await async_client.VersionApi(api).get_code()

        asyncio.run(async_get())
    finally:
        server.shutdown()
    assert seen == ["Bearer t0ken", "Bearer t0ken"]
