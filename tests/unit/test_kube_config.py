"""Namespace discovery and private client configuration of the Kubernetes backend."""

from __future__ import annotations

import json

import pytest
import yaml

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
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", {"a": "team-a", "b": "team-b"}, "a")))
    cc = load_cluster_config(kubeconfig=str(path))
    assert (cc.server, cc.namespace, cc.context) == ("https://127.0.0.1:6443", "team-a", "a")
    assert cc.token == "t0ken" and "t0ken" not in repr(cc)
    assert load_cluster_config(kubeconfig=str(path), context="b").namespace == "team-b"
    assert load_cluster_config(kubeconfig=str(path), context="b", namespace="x").namespace == "x"


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
    assert explicit.token == "t0ken"


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
    """One loader and one credential provider: the sync and the async transport send the same header."""
    import asyncio
    import http.server
    import threading

    from trainflow.core.kube import calls
    from trainflow.core.kube.aio import AsyncKubeApi
    from trainflow.core.kube.client import KubeApi
    from trainflow.core.kube.http import open_transport

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
        assert KubeApi(cc).run(calls.version())["major"] == "x"

        async def async_get():
            async with open_transport(cc) as transport:
                return await AsyncKubeApi(transport).run(calls.version())

        assert asyncio.run(async_get())["gitVersion"] == "x"
    finally:
        server.shutdown()
    assert seen == ["Bearer t0ken", "Bearer t0ken"]


def test_relative_paths_resolve_against_the_path_as_given_not_a_symlink_target(tmp_path, monkeypatch):
    """kubectl (clientcmd.ResolveLocalPaths): filepath.Abs of the file's directory, no symlink evaluation."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    real, link_dir = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    link_dir.mkdir()
    doc = kubeconfig("https://127.0.0.1:6443", {"a": None}, "a")
    doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    doc["users"][0]["user"] = {
        "client-certificate": "sub/c.crt",
        "client-key": "sub/c.key",
        "tokenFile": "tok",
    }
    (real / "config").write_text(yaml.safe_dump(doc))
    (link_dir / "config").symlink_to(real / "config")
    cc = load_cluster_config(kubeconfig=str(link_dir / "config"))
    assert cc.ca_file == str(link_dir / "ca.crt")
    assert (cc.cert_file, cc.key_file) == (str(link_dir / "sub/c.crt"), str(link_dir / "sub/c.key"))
    assert cc.token_file == str(link_dir / "tok")


def test_insecure_with_a_ca_is_refused_as_kubectl_refuses_it(tmp_path):
    doc = kubeconfig("https://127.0.0.1:6443", {"a": None}, "a")
    doc["clusters"][0]["cluster"].update(
        {"insecure-skip-tls-verify": True, "certificate-authority-data": "Zm9v"}
    )
    with pytest.raises(BackendError, match="root certificates file with the insecure flag is not allowed"):
        load_cluster_config(config_dict=doc)
    # the adapters' own switch (cncf's disable_verify_ssl) clears the CA, as kubectl's flag does
    cc = load_cluster_config(
        config_dict=doc
        | {
            "clusters": [
                {"name": "c", "cluster": {"server": "https://h", "certificate-authority-data": "Zm9v"}}
            ]
        },
        verify_ssl=False,
    )
    assert cc.insecure and cc.ca_data is None


def test_auth_provider_and_two_methods_are_clear_errors():
    doc = kubeconfig("https://127.0.0.1:6443", {"a": None}, "a")
    doc["users"][0]["user"] = {"auth-provider": {"name": "oidc", "config": {"id-token": "secret-id-token"}}}
    with pytest.raises(BackendError, match=r"user 'u' .*auth-provider 'oidc'.*exec credential plugin") as err:
        load_cluster_config(config_dict=doc)
    assert "secret-id-token" not in str(err.value)
    doc["users"][0]["user"] = {"token": "t", "username": "me", "password": "pw"}
    with pytest.raises(BackendError, match="more than one authentication method"):
        load_cluster_config(config_dict=doc)


def test_no_secret_in_any_repr():
    doc = kubeconfig("https://127.0.0.1:6443", {"a": None}, "a")
    doc["users"][0]["user"] = {
        "token": "canary-token-123",
        "client-certificate-data": "Y2FuYXJ5LWNlcnQ=",
        "client-key-data": "Y2FuYXJ5LWtleS1ieXRlcw==",
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "x",
            "env": [{"name": "P", "value": "canary-env"}],
        },
    }
    from trainflow.core.kube.auth import Credentials
    from trainflow.core.kube.backend import KubernetesBackend

    cc = load_cluster_config(config_dict=doc)
    backend = KubernetesBackend(config_dict=doc)
    for text in (
        repr(cc),
        str(cc),
        repr(Credentials(cc)),
        repr(backend),
        repr(backend.api),
        repr(backend.cluster.exec),
    ):
        for canary in ("canary-token-123", "canary-cert", "canary-key", "Y2FuYXJ5", "canary-env"):
            assert canary not in text, text
