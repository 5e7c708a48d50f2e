"""Both transports against a loopback server: which credentials reach the server, when exec plugins and token
files are read again, what a 401 does, and the errors a bad kubeconfig gives. Each test runs on the sync and
the async path: one loader and one credential provider serve both. The real API server's verdict on the same
credentials is in tests/e2e (test_async_credentials.py and the credential parity suite)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow.core.errors import BackendError, Unauthorized
from trainflow.core.kube import auth, calls
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.client import KubeApi
from trainflow.core.kube.config import load_cluster_config
from trainflow.core.kube.connect import proxy_for
from trainflow.core.kube.http import open_transport


@pytest.fixture(autouse=True)
def fresh_providers() -> Iterator[None]:
    auth._PROVIDERS.clear()
    yield
    auth._PROVIDERS.clear()


class Recorder:
    """A loopback HTTP server that answers every GET with a JSON object and records the Authorization header."""

    def __init__(self, status: int = 200, reject: set[str] | None = None) -> None:
        self.seen: list[str | None] = []
        self.paths: list[str] = []
        self.reject = reject or set()  # Authorization values answered with 401
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.seen.append(self.headers.get("Authorization"))
                recorder.paths.append(self.path)
                status = 401 if self.headers.get("Authorization") in recorder.reject else recorder.status
                body = json.dumps({"kind": "Status", "message": "nope"} if status >= 400 else {"items": []})
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.status = status
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.server.shutdown()


def write_config(path: Path, server: str, user: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
                "current-context": "x",
            }
        )
    )
    return path


LIST = calls.list_trainjobs("ns")


class Client:
    """The same calls on the sync client (``KubeApi``) or on an event loop (``AsyncKubeApi``)."""

    def __init__(self, path: Path, mode: str) -> None:
        self.cluster = load_cluster_config(kubeconfig=str(path))
        self.mode = mode

    def calls(self, *steps: Any) -> None:
        """Run each step: a Call, or a plain function called between them."""
        if self.mode == "sync":
            api = KubeApi(self.cluster)
            for step in steps:
                api.run(step) if isinstance(step, calls.Call) else step()
            return

        async def run() -> None:
            async with open_transport(self.cluster) as transport:
                api = AsyncKubeApi(transport)
                for step in steps:
                    await api.run(step) if isinstance(step, calls.Call) else step()

        asyncio.run(run())


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def plugin(tmp_path: Path, body: str) -> Path:
    """An exec plugin: a Python script that counts its runs in ``runs`` and prints what ``body`` builds."""
    script = tmp_path / "bin" / "plugin.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, datetime\n"
        f"runs = {str(tmp_path / 'runs')!r}\n"
        "n = len(open(runs).read()) if os.path.exists(runs) else 0\n"
        "open(runs, 'a').write('x')\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        f"{body}\n"
    )
    script.chmod(0o755)
    return script


def exec_user(command: str, **extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": command, **extra}}


@MODES
def test_a_token_file_relative_to_the_kubeconfig_is_read_again_when_old(
    tmp_path, recorder, monkeypatch, mode
):
    (tmp_path / "tok").write_text("first\n")
    path = write_config(tmp_path / "config", recorder.url, {"tokenFile": "tok"})
    client = Client(path, mode)
    monkeypatch.chdir("/")  # relative to the kubeconfig's directory, not the working directory

    def rotate() -> None:  # the kubelet rotated the service-account token
        (tmp_path / "tok").write_text("second\n")

    client.calls(LIST, rotate, LIST, lambda: monkeypatch.setattr(auth, "TOKEN_FILE_MAX_AGE", 0.0), LIST)
    assert recorder.seen == ["Bearer first", "Bearer first", "Bearer second"]
    assert recorder.paths[0].startswith("/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs")


EXPIRING = (
    "assert info['kind'] == 'ExecCredential' and info['spec']['interactive'] is False\n"
    "assert os.environ['FROM_KUBECONFIG'] == 'yes'\n"
    "soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3600)\n"
    "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
    "    'status': {'token': f'tok-{n}', 'expirationTimestamp': soon.strftime('%Y-%m-%dT%H:%M:%SZ')}}))"
)


@MODES
def test_an_exec_plugin_runs_once_and_again_when_its_token_expires(tmp_path, recorder, mode):
    plugin(tmp_path, EXPIRING)
    user = exec_user("bin/plugin.py", env=[{"name": "FROM_KUBECONFIG", "value": "yes"}])
    client = Client(write_config(tmp_path / "config", recorder.url, user), mode)
    creds = auth.credentials_for(client.cluster)

    def an_hour_later() -> None:
        assert creds._expires_at is not None
        creds._expires_at -= 3595  # inside the refresh margin

    client.calls(LIST, LIST, an_hour_later, LIST, LIST)
    assert recorder.seen == ["Bearer tok-0", "Bearer tok-0", "Bearer tok-1", "Bearer tok-1"]
    assert (tmp_path / "runs").read_text() == "xx"


def test_concurrent_requests_after_expiry_run_the_plugin_once(tmp_path, recorder):
    """client-go serialises refreshes: 30 requests that find the credential expired wait for one run."""
    plugin(tmp_path, EXPIRING)
    user = exec_user("bin/plugin.py", env=[{"name": "FROM_KUBECONFIG", "value": "yes"}])
    cluster = load_cluster_config(kubeconfig=str(write_config(tmp_path / "config", recorder.url, user)))

    async def burst() -> None:
        async with open_transport(cluster) as transport:
            api = AsyncKubeApi(transport)
            await api.run(LIST)
            creds = auth.credentials_for(cluster)
            creds._expires_at = 0.0
            await asyncio.gather(*(api.run(LIST) for _ in range(30)))

    asyncio.run(burst())
    assert (tmp_path / "runs").read_text() == "xx"
    assert recorder.seen.count("Bearer tok-1") == 30


REVOKED = (
    "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
    "    'status': {'token': f'tok-{n}'}}))"
)


@MODES
def test_a_401_refreshes_the_exec_credential_once_and_sends_again(tmp_path, mode):
    """The server revoked tok-0 (no expiry given): the 401 runs the plugin again and the request is resent."""
    rec = Recorder(reject={"Bearer tok-0"})
    try:
        plugin(tmp_path, REVOKED)
        client = Client(write_config(tmp_path / "config", rec.url, exec_user("bin/plugin.py")), mode)
        client.calls(LIST, LIST)
    finally:
        rec.server.shutdown()
    assert rec.seen == ["Bearer tok-0", "Bearer tok-1", "Bearer tok-1"]
    assert (tmp_path / "runs").read_text() == "xx"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "sys.stderr.write('token expired, run: login\\n'); sys.exit(3)",
            "exited with code 3: token expired, run: login",
        ),
        ("print('not json')", "did not print an ExecCredential"),
        (
            "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential', 'status': {}}))",
            "neither a token nor a client certificate and key",
        ),
        (
            "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential', "
            "'status': {'token': 'x'}}))",
            "answered apiVersion 'client.authentication.k8s.io/v1beta1'",
        ),
    ],
)
@MODES
def test_a_failing_exec_plugin_is_a_clear_error(tmp_path, recorder, body, expected, mode):
    script = plugin(tmp_path, body)
    client = Client(write_config(tmp_path / "config", recorder.url, exec_user(str(script))), mode)
    with pytest.raises(BackendError, match=expected) as info:
        client.calls(LIST)
    assert f"plugin {str(script)!r} of kubeconfig user 'u'" in str(info.value)  # names the command and user
    assert recorder.seen == []  # nothing was sent


@MODES
def test_a_missing_exec_plugin_names_the_command(tmp_path, recorder, mode):
    client = Client(write_config(tmp_path / "config", recorder.url, exec_user("no-such-auth-plugin")), mode)
    with pytest.raises(
        BackendError, match="plugin 'no-such-auth-plugin' of kubeconfig user 'u' was not found"
    ):
        client.calls(LIST)


@MODES
def test_basic_auth(tmp_path, recorder, mode):
    Client(
        write_config(tmp_path / "config", recorder.url, {"username": "ann", "password": "pw"}), mode
    ).calls(LIST)
    assert recorder.seen == ["Basic " + base64.b64encode(b"ann:pw").decode()]


@MODES
def test_a_rejected_static_token_is_unauthorized_after_one_request(tmp_path, mode):
    rec = Recorder(status=401)
    try:
        client = Client(write_config(tmp_path / "config", rec.url, {"token": "stale"}), mode)
        with pytest.raises(
            Unauthorized, match=r"rejected the credentials: nope .*user u of kubeconfig"
        ) as err:
            client.calls(LIST)
    finally:
        rec.server.shutdown()
    assert rec.seen == ["Bearer stale"]  # nothing to refresh: not sent again
    assert "stale" not in str(err.value)


@MODES
def test_a_bad_certificate_file_is_a_clear_error(tmp_path, mode):
    (tmp_path / "ca.crt").write_text("not a certificate")
    path = tmp_path / "config"
    write_config(path, "https://127.0.0.1:1", {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(BackendError, match=r"cannot load the TLS settings of kubeconfig .*\(context x\)"):
        Client(path, mode).calls(LIST)


GO_PROXY_RULES = [
    # (server, proxy-url, environment, expected proxy) - Go's httpproxy rules, which kubectl follows
    ("https://kube.example:6443", None, {"HTTPS_PROXY": "proxy:3128"}, "http://proxy:3128"),
    ("https://kube.example:6443", None, {"https_proxy": "http://p:1"}, "http://p:1"),
    ("https://kube.example:6443", None, {"HTTP_PROXY": "http://p:1"}, None),  # https servers use HTTPS_PROXY
    ("http://kube.example:8080", None, {"HTTP_PROXY": "http://p:1"}, "http://p:1"),
    ("https://127.0.0.1:6443", None, {"HTTPS_PROXY": "http://p:1"}, None),  # loopback: never
    ("https://localhost:6443", None, {"HTTPS_PROXY": "http://p:1"}, None),
    ("https://[::1]:6443", None, {"HTTPS_PROXY": "http://p:1"}, None),
    (
        "https://kube.example:6443",
        None,
        {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example"},
        None,
    ),  # a domain: and its subdomains
    ("https://kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "ample"}, "http://p:1"),
    ("https://kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "kube.example"}, None),
    ("https://a.kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "kube.example"}, None),
    (
        "https://kube.example:6443",
        None,
        {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".kube.example"},
        "http://p:1",
    ),
    ("https://a.kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.kube.example"}, None),
    (
        "https://kube.example:6443",
        None,
        {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "kube.example:443"},
        "http://p:1",
    ),
    ("https://kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "kube.example:6443"}, None),
    ("https://10.1.2.3:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://10.1.2.3:6443", None, {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.4"}, "http://p:1"),
    ("https://kube.example:6443", None, {"HTTPS_PROXY": "http://p:1", "no_proxy": "*"}, None),
    ("https://127.0.0.1:6443", "http://forced:3128", {}, "http://forced:3128"),  # proxy-url: always
    ("https://kube.example:6443", "forced:3128", {"NO_PROXY": "*"}, "http://forced:3128"),
]


@pytest.mark.parametrize(("server", "proxy_url", "env", "expected"), GO_PROXY_RULES)
def test_proxy_choice_follows_kubectl(server, proxy_url, env, expected):
    assert proxy_for(server, proxy_url, env) == expected


def test_a_socks_proxy_is_refused_clearly():
    with pytest.raises(
        BackendError, match="socks5 proxy; trainflow connects through http and https proxies only"
    ):
        proxy_for("https://kube.example:6443", "socks5://p:1080", {})
