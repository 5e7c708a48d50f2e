"""Credentials for the async path's own HTTP transport, read from a kubeconfig the way kubectl reads them.

The shared watch needs a handful of GETs. kubernetes_asyncio cannot load a kubeconfig without importing its
whole generated client (about 850 modules, most of a waiter's memory), so the async path reads credentials
itself: the CA, client certificate and key (files or inline data), a token or token file, exec plugins
(``client.authentication.k8s.io`` ExecCredential) and the in-cluster service account. ``auth-provider``
entries, basic auth and SOCKS proxies raise ``Unsupported``: the caller then uses kubernetes_asyncio.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainflow.core.errors import BackendError
from trainflow.core.kube.config import (
    SA_DIR,
    SA_TOKEN_FILE,
    ClusterConfig,
    context_namespace,
    entry_at,
    read_kubeconfigs,
)

TOKEN_FILE_MAX_AGE = 60.0  # re-read a token file this often: kubelet rotates bound service-account tokens
EXEC_TIMEOUT = 60.0  # an exec plugin that has not answered by then is killed
EXPIRY_MARGIN = 10.0  # refresh an exec token this long before it expires
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class Unsupported(Exception):
    """A credential kind trainflow does not read itself; kubernetes_asyncio loads it instead."""


@dataclass
class ExecPlugin:
    """A kubeconfig ``exec`` entry: runs the command and reads the ExecCredential it prints."""

    command: str
    args: list[str]
    env: dict[str, str]
    api_version: str
    cluster_info: dict[str, Any] | None
    interactive_mode: str

    async def run(self) -> dict[str, Any]:
        if self.interactive_mode == "Always":
            raise BackendError(f"exec plugin {self.command!r} needs a terminal (interactiveMode Always)")
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster_info is not None:
            spec["cluster"] = self.cluster_info
        env = {**os.environ, **self.env}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command,
                *self.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise BackendError(f"cannot run the kubeconfig exec plugin {self.command!r}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), EXEC_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BackendError(
                f"kubeconfig exec plugin {self.command!r} did not answer in {EXEC_TIMEOUT:.0f} s"
            ) from None
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip()[-300:]
            raise BackendError(f"kubeconfig exec plugin {self.command!r} exited {proc.returncode}: {tail}")
        try:
            cred = json.loads(out)
        except ValueError:
            raise BackendError(f"kubeconfig exec plugin {self.command!r} printed no ExecCredential") from None
        status = cred.get("status") if isinstance(cred, dict) else None
        if not isinstance(status, dict):
            raise BackendError(f"kubeconfig exec plugin {self.command!r}: the ExecCredential has no status")
        if not status.get("token") and not (
            status.get("clientCertificateData") and status.get("clientKeyData")
        ):
            raise BackendError(
                f"kubeconfig exec plugin {self.command!r} returned neither a token nor a client key pair"
            )
        return status


@dataclass
class HttpCredentials:
    """Where the API server is and how to prove who we are, for one aiohttp session."""

    server: str
    verify: bool = True
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    tls_server_name: str | None = None
    proxy: str | None = None
    token: str | None = None
    token_file: str | None = None
    exec_plugin: ExecPlugin | None = None
    expires_at: float | None = None
    _read_at: float = field(default=0.0, repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (None for a plain-HTTP server)."""
        if not self.server.startswith("https://"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_data is not None and self.key_data is not None:
            _load_chain_from_data(ctx, self.cert_data, self.key_data)
        elif self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    async def authorization(self) -> str | None:
        """The Authorization header value, refreshing token files and expiring exec tokens first."""
        now = time.monotonic()
        if self.token_file and (self.token is None or now - self._read_at > TOKEN_FILE_MAX_AGE):
            try:
                self.token = Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise BackendError(f"cannot read the token file {self.token_file}: {exc}") from None
            self._read_at = now
        expired = self.expires_at is not None and time.time() > self.expires_at - EXPIRY_MARGIN
        if self.exec_plugin is not None and expired:
            apply_exec_status(self, await self.exec_plugin.run())
        return f"Bearer {self.token}" if self.token else None


def _load_chain_from_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a key pair from files only: write them to a private directory, load, delete."""
    with tempfile.TemporaryDirectory(prefix="trainflow-tls-") as tmp:  # mode 0700
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(str(cert_path), str(key_path))


def apply_exec_status(creds: HttpCredentials, status: Mapping[str, Any]) -> None:
    """Take the token or key pair, and the expiry, from an ExecCredential's status."""
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    creds.token = str(token) if token else creds.token
    if cert and key:
        creds.cert_data, creds.key_data = str(cert).encode(), str(key).encode()
    expiry = status.get("expirationTimestamp")
    creds.expires_at = _parse_time(str(expiry)) if expiry else None


def _parse_time(text: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BackendError(
            f"the kubeconfig exec plugin returned a bad expirationTimestamp {text!r}"
        ) from None


def _entry_with_dir(
    docs: Sequence[tuple[Mapping[str, Any], Path]], section: str, name: str
) -> tuple[Mapping[str, Any], Path] | None:
    """The entry, with the directory its relative paths are relative to (kubectl's rule)."""
    found = entry_at([doc for doc, _ in docs], section, name)
    return (found[0], docs[found[1]][1]) if found else None


def _path(value: Any, base: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)


def _decode(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise BackendError(f"kubeconfig {what} is not valid base64") from None


def _documents(cluster: ClusterConfig) -> list[tuple[Mapping[str, Any], Path]]:
    if cluster.config_dict is not None:
        return [(cluster.config_dict, Path.cwd())]
    return [(doc, Path(p).resolve().parent) for p in cluster.paths for doc in read_kubeconfigs([Path(p)])]


def _in_cluster(cluster: ClusterConfig) -> HttpCredentials:
    return HttpCredentials(
        server=cluster.server,
        verify=cluster.verify_ssl,
        ca_file=f"{SA_DIR}/ca.crt",
        token_file=SA_TOKEN_FILE,
    )


def _exec_plugin(spec: Mapping[str, Any], base: Path, cluster_entry: Mapping[str, Any]) -> ExecPlugin:
    command = str(spec.get("command") or "")
    if not command:
        raise BackendError("the kubeconfig exec entry has no command")
    if os.sep in command and not os.path.isabs(command):  # kubectl: relative to the kubeconfig file
        command = str(base / command)
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in EXEC_API_VERSIONS:
        raise Unsupported(f"exec apiVersion {api_version!r}")
    env = {
        str(e.get("name")): str(e.get("value", "")) for e in spec.get("env") or [] if isinstance(e, Mapping)
    }
    info = None
    if spec.get("provideClusterInfo"):
        keys = (
            "server",
            "certificate-authority-data",
            "insecure-skip-tls-verify",
            "tls-server-name",
            "proxy-url",
        )
        info = {k: cluster_entry[k] for k in keys if k in cluster_entry}
    return ExecPlugin(
        command=command,
        args=[str(a) for a in spec.get("args") or []],
        env=env,
        api_version=api_version,
        cluster_info=info,
        interactive_mode=str(spec.get("interactiveMode") or "IfAvailable"),
    )


async def load_http_credentials(cluster: ClusterConfig) -> HttpCredentials:
    """Read the credentials of the cluster's context (running its exec plugin once); ``Unsupported`` if not ours."""
    if cluster.in_cluster:
        return _in_cluster(cluster)
    docs = _documents(cluster)
    ctx_name, _ = context_namespace([d for d, _ in docs], cluster.context)
    ctx = _entry_with_dir(docs, "contexts", str(ctx_name or ""))
    cluster_found = _entry_with_dir(docs, "clusters", str((ctx or ({}, None))[0].get("cluster") or ""))
    user_found = _entry_with_dir(docs, "users", str((ctx or ({}, None))[0].get("user") or ""))
    c, c_base = cluster_found or ({}, Path.cwd())
    u, u_base = user_found or ({}, Path.cwd())
    if u.get("auth-provider") or u.get("username") or u.get("password"):
        raise Unsupported("auth-provider or basic auth")
    proxy = str(c.get("proxy-url") or "") or None
    if proxy and not proxy.startswith(("http://", "https://")):
        raise Unsupported(f"proxy {proxy.split(':', 1)[0]}")
    creds = HttpCredentials(
        server=cluster.server,
        verify=cluster.verify_ssl and not c.get("insecure-skip-tls-verify"),
        ca_file=_path(c.get("certificate-authority"), c_base),
        ca_data=_decode(c["certificate-authority-data"], "certificate-authority-data").decode(
            "ascii", "replace"
        )
        if c.get("certificate-authority-data")
        else None,
        cert_file=_path(u.get("client-certificate"), u_base),
        key_file=_path(u.get("client-key"), u_base),
        cert_data=_decode(u["client-certificate-data"], "client-certificate-data")
        if u.get("client-certificate-data")
        else None,
        key_data=_decode(u["client-key-data"], "client-key-data") if u.get("client-key-data") else None,
        tls_server_name=str(c.get("tls-server-name") or "") or None,
        proxy=proxy,
        token=str(u.get("token") or "") or None,
        token_file=_path(u.get("tokenFile"), u_base),
    )
    if isinstance(u.get("exec"), Mapping):
        creds.exec_plugin = _exec_plugin(u["exec"], u_base, c)
        apply_exec_status(creds, await creds.exec_plugin.run())
    return creds
