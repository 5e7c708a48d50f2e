"""The async path's HTTP transport: GETs to the API server on one aiohttp session per shared watch.

Importing this module loads no client library; aiohttp is imported when a transport opens.

``open_transport`` reads the credentials itself (kube/credentials.py) and talks aiohttp directly, which keeps
a waiter free of kubernetes_asyncio's generated client. For the credential kinds trainflow does not read
(``auth-provider``, basic auth, SOCKS proxies) it sends the same GETs through kubernetes_asyncio's ApiClient.
Either way a non-2xx answer raises ``ApiException``, which kube/retry.py and kube/apierrors.py read.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from trainflow.core.errors import BackendError
from trainflow.core.kube.config import ClusterConfig
from trainflow.core.kube.credentials import HttpCredentials, Unsupported, load_http_credentials

if TYPE_CHECKING:
    import aiohttp

Query = Mapping[str, str | int | bool]
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0  # a plain GET whose answer stalls this long is retried (kube/retry.py)
POOL_SIZE = 100  # per shared watch: the watch plus a burst of finishing reads (as kubernetes_asyncio)


class ApiException(Exception):
    """A non-2xx answer; the same fields as the client libraries' ApiException (status, reason, body, headers)."""

    def __init__(
        self,
        status: int,
        reason: str | None,
        body: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"({status}) {reason}")
        self.status, self.reason, self.body, self.headers = status, reason, body, headers


class Transport(Protocol):
    async def get(self, path: str, query: Query, *, timeout: float | None = None) -> aiohttp.ClientResponse:
        """GET ``path``; the response is unread (the caller reads or streams it, then releases it)."""


def path_of(*segments: str) -> str:
    return "/" + "/".join(quote(s, safe="") for s in segments)


def _query(query: Query) -> dict[str, str]:
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in query.items()}


def _timeout(total: float | None) -> aiohttp.ClientTimeout:
    import aiohttp

    if total is not None:
        return aiohttp.ClientTimeout(total=total, sock_connect=CONNECT_TIMEOUT)
    return aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)


async def _checked(resp: aiohttp.ClientResponse) -> aiohttp.ClientResponse:
    if 200 <= resp.status <= 299:
        return resp
    try:
        body = await resp.text(errors="replace")
    finally:
        resp.release()
    raise ApiException(resp.status, resp.reason, body, dict(resp.headers))


class AiohttpTransport:
    """GETs with trainflow's own credentials (token, token file, exec plugin, client certificates)."""

    def __init__(self, creds: HttpCredentials, session: aiohttp.ClientSession) -> None:
        self.creds, self.session = creds, session
        self.base = creds.server.rstrip("/")

    async def get(self, path: str, query: Query, *, timeout: float | None = None) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        auth = await self.creds.authorization()
        if auth:
            headers["Authorization"] = auth
        extra: dict[str, Any] = {}
        if self.creds.tls_server_name:
            extra["server_hostname"] = self.creds.tls_server_name
        resp = await self.session.get(
            self.base + path,
            params=_query(query),
            headers=headers,
            timeout=_timeout(timeout),
            proxy=self.creds.proxy,
            **extra,
        )
        return await _checked(resp)


class ClientLibTransport:
    """The same GETs through kubernetes_asyncio, for credentials only it can load."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    async def get(self, path: str, query: Query, *, timeout: float | None = None) -> aiohttp.ClientResponse:
        from kubernetes_asyncio.client.exceptions import ApiException as LibApiException

        try:
            resp = await self.api_client.call_api(
                path,
                "GET",
                query_params=list(_query(query).items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=_timeout(timeout),
            )
        except LibApiException as exc:  # status 0: its wrapping of a transport failure
            raise ApiException(int(exc.status or 0), exc.reason, None, None) from exc
        return await _checked(resp)


@contextlib.asynccontextmanager
async def open_transport(cluster: ClusterConfig) -> AsyncIterator[Transport]:
    """A transport with freshly loaded credentials (exec plugins run again), closed on exit."""
    try:
        creds = await load_http_credentials(cluster)
    except Unsupported:
        # off the loop: the generated client is a large import
        await asyncio.to_thread(importlib.import_module, "kubernetes_asyncio.client")
        from kubernetes_asyncio.client import ApiClient

        async with ApiClient(configuration=await cluster.async_configuration()) as api_client:
            yield ClientLibTransport(api_client)
        return
    try:
        tls = creds.ssl_context()
    except (OSError, ssl.SSLError, ValueError) as exc:
        where = (
            "in-cluster service account" if cluster.in_cluster else f"kubeconfig (context {cluster.context})"
        )
        raise BackendError(f"cannot load the TLS credentials of the {where}: {exc}") from None
    import aiohttp  # the shared watch imported it off the loop

    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else False, limit=POOL_SIZE)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        yield AiohttpTransport(creds, session)
