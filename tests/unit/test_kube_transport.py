"""The async path's own HTTP transport against a loopback server: which credentials reach the server, when
exec plugins and token files are read again, and the kubernetes_asyncio fallback. The real API server's
verdict on the same credentials is in tests/e2e/test_async_credentials.py."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainflow.core.errors import BackendError, Unauthorized
from trainflow.core.kube import credentials
from trainflow.core.kube.aio import AsyncKubeApi
from trainflow.core.kube.config import load_cluster_config
from trainflow.core.kube.transport import AiohttpTransport, ClientLibTransport, open_transport


class Recorder:
    """A loopback HTTP server that answers every GET with a JSON object and records the Authorization header."""

    def __init__(self, status: int = 200) -> None:
        self.seen: list[str | None] = []
        self.paths: list[str] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.seen.append(self.headers.get("Authorization"))
                recorder.paths.append(self.path)
                body = json.dumps({"kind": "Status", "message": "nope"} if status >= 400 else {"items": []})
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

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


async def list_once(path: Path) -> type:
    cluster = load_cluster_config(kubeconfig=str(path))
    async with open_transport(cluster) as transport:
        await AsyncKubeApi(transport).list_trainjobs("ns")
        return type(transport)


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


def test_a_token_file_relative_to_the_kubeconfig_is_read_again_when_old(tmp_path, recorder, monkeypatch):
    (tmp_path / "tok").write_text("first\n")
    path = write_config(tmp_path / "config", recorder.url, {"tokenFile": "tok"})
    cluster = load_cluster_config(kubeconfig=str(path))
    monkeypatch.chdir("/")  # relative to the kubeconfig's directory, not the working directory

    async def two_gets() -> None:
        async with open_transport(cluster) as transport:
            api = AsyncKubeApi(transport)
            await api.list_trainjobs("ns")
            (tmp_path / "tok").write_text("second\n")  # the kubelet rotated the service-account token
            await api.list_trainjobs("ns")  # younger than TOKEN_FILE_MAX_AGE: not read again
            monkeypatch.setattr(credentials, "TOKEN_FILE_MAX_AGE", 0.0)
            await api.list_trainjobs("ns")

    asyncio.run(two_gets())
    assert recorder.seen == ["Bearer first", "Bearer first", "Bearer second"]
    assert recorder.paths[0] == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs"


def test_an_exec_plugin_runs_when_the_connection_opens_and_again_when_its_token_expires(tmp_path, recorder):
    plugin(
        tmp_path,
        "assert info['kind'] == 'ExecCredential' and info['spec']['interactive'] is False\n"
        "assert os.environ['FROM_KUBECONFIG'] == 'yes'\n"
        "soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3600)\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "    'status': {'token': f'tok-{n}', 'expirationTimestamp': soon.strftime('%Y-%m-%dT%H:%M:%SZ')}}))",
    )
    user = exec_user("bin/plugin.py", env=[{"name": "FROM_KUBECONFIG", "value": "yes"}])
    path = write_config(tmp_path / "config", recorder.url, user)

    async def gets() -> None:
        cluster = load_cluster_config(kubeconfig=str(path))
        async with open_transport(cluster) as transport:
            api = AsyncKubeApi(transport)
            await api.list_trainjobs("ns")
            await api.list_trainjobs("ns")
            assert isinstance(transport, AiohttpTransport)
            assert transport.creds.expires_at is not None and transport.creds.expires_at > time.time() + 3000
            transport.creds.expires_at = time.time() + 5  # an hour later: inside the refresh margin
            await api.list_trainjobs("ns")
            await api.list_trainjobs("ns")

    asyncio.run(gets())
    assert recorder.seen == ["Bearer tok-0", "Bearer tok-0", "Bearer tok-1", "Bearer tok-1"]
    assert (tmp_path / "runs").read_text() == "xx"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "sys.stderr.write('token expired, run: login\\n'); sys.exit(3)",
            "exited 3: token expired, run: login",
        ),
        ("print('not json')", "printed no ExecCredential"),
        (
            "print(json.dumps({'kind': 'ExecCredential', 'status': {}}))",
            "neither a token nor a client key pair",
        ),
    ],
)
def test_a_failing_exec_plugin_is_a_clear_error(tmp_path, recorder, body, expected):
    script = plugin(tmp_path, body)
    path = write_config(tmp_path / "config", recorder.url, exec_user(str(script)))
    with pytest.raises(BackendError, match=expected) as info:
        asyncio.run(list_once(path))
    assert f"exec plugin {str(script)!r}" in str(info.value)  # names the command
    assert recorder.seen == []  # nothing was sent


def test_a_missing_exec_plugin_names_the_command(tmp_path, recorder):
    path = write_config(tmp_path / "config", recorder.url, exec_user("no-such-auth-plugin"))
    with pytest.raises(BackendError, match="cannot run the kubeconfig exec plugin 'no-such-auth-plugin'"):
        asyncio.run(list_once(path))


def test_basic_auth_falls_back_to_kubernetes_asyncio(tmp_path, recorder):
    path = write_config(tmp_path / "config", recorder.url, {"username": "ann", "password": "pw"})
    assert asyncio.run(list_once(path)) is ClientLibTransport
    assert recorder.seen == ["Basic " + base64.b64encode(b"ann:pw").decode()]
    token = write_config(tmp_path / "config2", recorder.url, {"token": "t"})
    assert asyncio.run(list_once(token)) is AiohttpTransport


def test_a_rejected_credential_is_unauthorized(tmp_path):
    rec = Recorder(status=401)
    try:
        path = write_config(tmp_path / "config", rec.url, {"token": "stale"})
        with pytest.raises(Unauthorized, match="rejected the credentials: nope"):
            asyncio.run(list_once(path))
    finally:
        rec.server.shutdown()
    assert rec.seen == ["Bearer stale"]  # a 401 is not retried by the call; the watch reloads credentials


def test_a_bad_certificate_file_is_a_clear_error(tmp_path):
    (tmp_path / "ca.crt").write_text("not a certificate")
    path = tmp_path / "config"
    write_config(path, "https://127.0.0.1:1", {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        BackendError, match=r"cannot load the TLS credentials of the kubeconfig \(context x\)"
    ):
        asyncio.run(list_once(path))
