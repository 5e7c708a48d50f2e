"""The user's credentials, one provider per identity per process, shared by the sync and the async clients.

As client-go does: a token file is read again every minute (kubelet rotates bound service-account tokens) and
after a 401; an exec plugin (``client.authentication.k8s.io`` v1/v1beta1) runs when no cached credential is
valid, again before ``expirationTimestamp`` and after a 401, and one lock serialises those runs, so concurrent
requests wait for one run; a plugin may return a client certificate, which the transports pick up by its
``generation``. Values never appear in a repr or a message.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainflow.core.errors import BackendError
from trainflow.core.kube.config import ClusterConfig, ExecSpec

TOKEN_FILE_MAX_AGE = 60.0  # re-read a token file this often
EXEC_TIMEOUT = 60.0  # an exec plugin that has not answered by then is killed
EXPIRY_MARGIN = 10.0  # refresh an exec credential this long before it expires (a tenth of a short one's life)
MAX_PLUGIN_OUTPUT = 1 << 20


@dataclass(frozen=True)
class Used:
    """What one request was sent with: compared after a 401 to decide whether a refresh can help."""

    authorization: str | None
    generation: int

    def __repr__(self) -> str:
        return f"Used(generation={self.generation})"


class Credentials:
    """Headers and client certificate of one kubeconfig user; refreshed as client-go refreshes them."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._alocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._token = cluster.token
        self._token_read_at = -float("inf")
        self._cert: tuple[bytes, bytes] | None = (
            (cluster.cert_data, cluster.key_data) if cluster.cert_data and cluster.key_data else None
        )
        self._expires_at: float | None = None
        self._margin = EXPIRY_MARGIN
        self._exec_valid = False
        self.generation = 0  # bumped whenever the client certificate changes
        self.exec_runs = 0

    def __repr__(self) -> str:
        return f"Credentials(user={self.cluster.user!r}, kind={self.kind!r})"

    @property
    def kind(self) -> str:
        c = self.cluster
        if c.exec is not None:
            return "exec plugin"
        if c.token_file:
            return "token file"
        if c.token:
            return "token"
        if c.username:
            return "basic auth"
        if c.cert_file or c.cert_data:
            return "client certificate"
        return "none"

    # --- what a request carries -------------------------------------------------------------------------
    def headers(self) -> tuple[dict[str, str], Used]:
        """Headers for one request (reads token files, runs the exec plugin when due: may block)."""
        if self._due():
            with self._lock:
                if self._due():
                    self._refresh()
        return self._headers()

    async def aheaders(self) -> tuple[dict[str, str], Used]:
        """``headers`` for an event loop: a due refresh runs in a thread, one at a time per loop."""
        if self._due():
            async with self._alock():
                if self._due():
                    await asyncio.to_thread(self._refresh_locked)
        return self._headers()

    def client_cert(self) -> tuple[int, tuple[bytes, bytes] | None]:
        """(generation, PEM certificate and key given as data), for the TLS context of new connections."""
        return self.generation, self._cert

    # --- after a 401 ------------------------------------------------------------------------------------
    def rejected(self, used: Used) -> bool:
        """The server answered 401 to a request sent with ``used``: refresh once; True if that changed them."""
        with self._lock:
            return self._after_401(used)

    async def arejected(self, used: Used) -> bool:
        async with self._alock():
            return await asyncio.to_thread(self._rejected_locked, used)

    def _rejected_locked(self, used: Used) -> bool:
        with self._lock:
            return self._after_401(used)

    def _after_401(self, used: Used) -> bool:
        if self._current() != used:
            return True  # someone refreshed meanwhile: try the new credentials
        if self.cluster.exec is None and not self.cluster.token_file:
            return False  # a static token or certificate: nothing to refresh
        self._exec_valid = False
        self._token_read_at = -float("inf")
        self._refresh()
        return self._current() != used

    # --- internals --------------------------------------------------------------------------------------
    def _alock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._alocks.get(loop)
        if lock is None:
            lock = self._alocks[loop] = asyncio.Lock()
        return lock

    def _due(self) -> bool:
        c = self.cluster
        if c.exec is not None:
            if not self._exec_valid:
                return True
            return self._expires_at is not None and time.time() > self._expires_at - self._margin
        return bool(c.token_file) and time.monotonic() - self._token_read_at > TOKEN_FILE_MAX_AGE

    def _refresh_locked(self) -> None:
        with self._lock:
            if self._due():
                self._refresh()

    def _refresh(self) -> None:
        c = self.cluster
        if c.exec is not None:
            status = run_exec(c.exec, c.user or "?")
            self.exec_runs += 1
            self._apply(status)
            return
        if c.token_file:
            try:
                self._token = Path(c.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise BackendError(
                    f"cannot read the token file {c.token_file} of {c.describe()}: {exc.strerror or exc}"
                ) from None
            self._token_read_at = time.monotonic()

    def _apply(self, status: dict[str, Any]) -> None:
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        self._token = str(token) if token else None
        if cert and key:
            pair = (str(cert).encode(), str(key).encode())
            if pair != self._cert:
                self._cert = pair
                self.generation += 1
        expiry = status.get("expirationTimestamp")
        self._expires_at = _parse_time(str(expiry)) if expiry else None
        if self._expires_at is not None:  # a credential that lives 5 s is refreshed 0.5 s early, not always
            self._margin = min(EXPIRY_MARGIN, max(0.0, self._expires_at - time.time()) / 10)
        self._exec_valid = True

    def _current(self) -> Used:
        return Used(self._authorization(), self.generation)

    def _authorization(self) -> str | None:
        if self._token:
            return f"Bearer {self._token}"
        c = self.cluster
        if c.username is not None:
            raw = f"{c.username}:{c.password or ''}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def _headers(self) -> tuple[dict[str, str], Used]:
        used = self._current()
        headers = dict(self.cluster.impersonate)
        if used.authorization:
            headers["Authorization"] = used.authorization
        return headers, used


def run_exec(spec: ExecSpec, user: str) -> dict[str, Any]:
    """Run an exec credential plugin once; the ExecCredential's ``status``. Errors never carry its output."""
    what = f"the exec credential plugin {spec.command!r} of kubeconfig user {user!r}"
    if spec.interactive_mode == "Always":
        raise BackendError(f"{what} needs a terminal (interactiveMode Always); trainflow runs without one")
    exec_spec: dict[str, Any] = {"interactive": False}
    if spec.cluster_info is not None:
        exec_spec["cluster"] = dict(spec.cluster_info)
    env = {**os.environ, **dict(spec.env)}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": spec.api_version, "kind": "ExecCredential", "spec": exec_spec}
    )
    try:
        proc = subprocess.run(
            [spec.command, *spec.args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXEC_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise BackendError(f"{what} was not found; install it or fix the kubeconfig's exec command") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{what} did not answer within {EXEC_TIMEOUT:.0f}s") from None
    except OSError as exc:
        raise BackendError(f"{what} could not be started: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        err = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        raise BackendError(f"{what} exited with code {proc.returncode}: {err}")
    return _status(proc.stdout[:MAX_PLUGIN_OUTPUT], spec, what)


def _status(out: bytes, spec: ExecSpec, what: str) -> dict[str, Any]:
    try:
        cred = json.loads(out)
    except ValueError:
        raise BackendError(f"{what} did not print an ExecCredential (not JSON)") from None
    if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
        raise BackendError(f"{what} did not print an ExecCredential")
    if cred.get("apiVersion") != spec.api_version:
        raise BackendError(
            f"{what} answered apiVersion {cred.get('apiVersion')!r}, but the kubeconfig asked for {spec.api_version!r}"
        )
    status = cred.get("status")
    if not isinstance(status, dict):
        raise BackendError(f"{what}: the ExecCredential has no status")
    has_pair = bool(status.get("clientCertificateData")) and bool(status.get("clientKeyData"))
    if not status.get("token") and not has_pair:
        raise BackendError(f"{what} returned neither a token nor a client certificate and key")
    return status


def _parse_time(text: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BackendError(
            f"an exec credential plugin returned a bad expirationTimestamp {text[:40]!r}"
        ) from None


def identity(cluster: ClusterConfig) -> str:
    """A digest of who connects where (server, user settings, secrets included): watches and credential
    providers are shared only between equal identities. The digest reveals nothing of the secrets."""
    fields = dataclasses.asdict(cluster)
    for key in ("namespace", "where"):
        fields.pop(key)
    text = json.dumps(fields, sort_keys=True, default=lambda v: v.hex() if isinstance(v, bytes) else repr(v))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_PROVIDERS: dict[str, Credentials] = {}
_PROVIDERS_LOCK = threading.Lock()


def credentials_for(cluster: ClusterConfig) -> Credentials:
    """The process's one provider for this identity (so 1,000 triggers run an exec plugin once, not 1,000 times)."""
    key = identity(cluster)
    with _PROVIDERS_LOCK:
        found = _PROVIDERS.get(key)
        if found is None:
            found = _PROVIDERS[key] = Credentials(cluster)
        return found
