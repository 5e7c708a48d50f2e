"""The HTTP transports, sync and async: one library (httpx) and one set of connection options, so both paths
reach the API server alike.

``options`` builds the client settings once from the ``ClusterConfig``: the TLS context (kube/connect.py), the
proxy kubectl would use, the SNI name (``tls-server-name``), timeouts, no redirects (the API server never
redirects, and following one could send the credentials elsewhere) and no environment lookups (the proxy
is chosen by kube/connect.py). HTTP/1.1: with httpcore's HTTP/2 a followed log stalled the watches that shared
its connection (a Failed event arrived 48 s late on the testbed), so each stream has a connection of its own.
On an event loop, followed logs use a pool of their own, so however many there are, the watches and reads
always get a connection. After a 401 the credentials refresh once (kube/auth.py) and the request is sent
again. A new client certificate from an exec plugin takes effect through new clients; the old ones close once
their open responses are done.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import httpx

from trainflow.core.kube.auth import Credentials, credentials_for
from trainflow.core.kube.calls import ApiException, Call, request_headers, url_of
from trainflow.core.kube.config import ClusterConfig
from trainflow.core.kube.connect import proxy_for, ssl_context

CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0
MAX_CONNECTIONS = 100  # watches and reads of one client
MAX_LOG_STREAMS = 500  # followed logs open at once on one event loop; more wait for a free connection
MAX_ERROR_BODY = 1 << 20
ROTATED_GRACE = 600.0  # a client replaced by a rotated certificate closes this long after, with its streams


def options(
    cluster: ClusterConfig, cert: tuple[bytes, bytes] | None, *, logs: bool = False
) -> dict[str, Any]:
    """The client settings both transports use (the TLS context reads the CA and key files: not on a loop).
    ``logs``: the pool of followed logs, which wait for a free connection as long as it takes."""
    ctx = ssl_context(cluster, cert)
    size = MAX_LOG_STREAMS if logs else MAX_CONNECTIONS
    return {
        "verify": ctx if ctx is not None else False,
        "proxy": proxy_for(cluster.server, cluster.proxy_url),
        "http2": False,
        "trust_env": False,
        "follow_redirects": False,
        "limits": httpx.Limits(max_connections=size, max_keepalive_connections=0 if logs else 20),
        "timeout": httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=None if logs else READ_TIMEOUT),
    }


def _timeout(call: Call) -> httpx.Timeout:
    if call.stream:
        return httpx.Timeout(call.timeout or READ_TIMEOUT, connect=CONNECT_TIMEOUT)
    if call.timeout is not None:
        return httpx.Timeout(call.timeout, connect=min(CONNECT_TIMEOUT, call.timeout))
    return httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)


def _request(
    client: httpx.Client | httpx.AsyncClient, cluster: ClusterConfig, call: Call, auth: dict[str, str]
) -> httpx.Request:
    return client.build_request(
        call.method,
        url_of(cluster.server, call),
        content=call.body,
        headers=request_headers(call, auth),
        timeout=_timeout(call),
    )


class _ErrorBody:
    """A failed answer's body, kept up to ``MAX_ERROR_BODY`` (an error is read whole only that far), and the
    ``ApiException`` it makes: the one rule of both transports' send loops, which differ only in their I/O."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> bool:
        """Keep what fits of ``chunk``; True once the cap is reached (stop reading)."""
        self.data += chunk[: max(0, MAX_ERROR_BODY - len(self.data))]
        return len(self.data) >= MAX_ERROR_BODY

    def error(self, resp: httpx.Response) -> ApiException:
        return ApiException(
            resp.status_code,
            resp.reason_phrase,
            bytes(self.data).decode("utf-8", "replace"),
            dict(resp.headers),
        )


class SyncHttp:
    """Requests from sync code (any thread): one client, rebuilt when the client certificate rotates."""

    def __init__(self, cluster: ClusterConfig, creds: Credentials) -> None:
        self.cluster, self.creds = cluster, creds
        self._client: httpx.Client | None = None
        self._old: list[httpx.Client] = []
        self._generation = -1
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SyncHttp(server={self.cluster.server!r})"

    def _current(self) -> httpx.Client:
        generation, cert = self.creds.client_cert()
        with self._lock:
            if self._client is None or generation != self._generation:
                if self._client is not None:  # responses still open on it keep their connections
                    self._old.append(self._client)
                self._client = httpx.Client(**options(self.cluster, cert))
                self._generation = generation
            return self._client

    def send(self, call: Call) -> httpx.Response:
        """Send ``call``; the response body is unread (``read_all``, or ``iter_lines`` then ``finish``)."""
        for attempt in (1, 2):
            auth, used = self.creds.headers()
            client = self._current()
            resp = client.send(_request(client, self.cluster, call, auth), stream=True)
            if resp.status_code == 401 and attempt == 1 and self.creds.rejected(used):
                resp.close()
                continue
            if resp.is_success:
                return resp
            body = _ErrorBody()
            try:
                for chunk in resp.iter_bytes():
                    if body.add(chunk):
                        break
            finally:
                resp.close()
            raise body.error(resp)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            for client in [*self._old, *([self._client] if self._client is not None else [])]:
                client.close()
            self._old, self._client = [], None


def read_all(resp: httpx.Response) -> bytes:
    """The whole body of a sync response; the connection is released either way."""
    try:
        return resp.read()
    finally:
        resp.close()


def iter_chunks(resp: httpx.Response) -> Iterator[bytes]:
    return resp.iter_bytes()


def finish(resp: httpx.Response) -> None:
    """Done with a streamed sync response (read to its end or not)."""
    resp.close()


class Transport(Protocol):
    cluster: ClusterConfig

    async def send(self, call: Call) -> httpx.Response:
        """Send ``call``; the response body is unread (the caller reads or streams it, then closes it)."""


def _is_log_stream(call: Call) -> bool:
    """A followed log (``held`` open until the container ends): a connection of the log pool. A polled log read
    ends when what was written is sent, so it takes a kept-alive connection of the shared pool, as other reads do
    (a new TLS connection for each of a thousand polled logs cost the event loop a handshake each)."""
    return call.held and call.resource == "pods/log"


class AsyncHttp:
    """Requests of one event loop: a client for watches and reads, one for followed logs; both rebuilt when the
    client certificate rotates. Credentials that need a refresh are read in a thread, one refresh at a time."""

    def __init__(self, cluster: ClusterConfig, creds: Credentials) -> None:
        self.cluster, self.creds = cluster, creds
        self._clients: dict[bool, httpx.AsyncClient] = {}  # by "is it the log pool"
        self._generation = -1
        self._old: list[httpx.AsyncClient] = []
        self._closing: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"AsyncHttp(server={self.cluster.server!r})"

    async def _current(self, logs: bool) -> httpx.AsyncClient:
        generation, cert = self.creds.client_cert()
        if generation != self._generation:  # open streams finish on the old ones; closed after ROTATED_GRACE
            for old in self._clients.values():
                self._old.append(old)
                asyncio.get_running_loop().call_later(ROTATED_GRACE, self._close_later, old)
            self._clients, self._generation = {}, generation
        client = self._clients.get(logs)
        if client is None:
            opts = await asyncio.to_thread(options, self.cluster, cert, logs=logs)  # reads CA and key files
            client = self._clients.setdefault(logs, httpx.AsyncClient(**opts))
        return client

    async def send(self, call: Call) -> httpx.Response:
        for attempt in (1, 2):
            auth, used = await self.creds.aheaders()
            client = await self._current(_is_log_stream(call))
            resp = await client.send(_request(client, self.cluster, call, auth), stream=True)
            if resp.status_code == 401 and attempt == 1 and await self.creds.arejected(used):
                await resp.aclose()
                continue
            if resp.is_success:
                return resp
            body = _ErrorBody()
            try:
                async for chunk in resp.aiter_bytes():
                    if body.add(chunk):
                        break
            finally:
                await resp.aclose()
            raise body.error(resp)
        raise AssertionError("unreachable")  # pragma: no cover

    def _close_later(self, client: httpx.AsyncClient) -> None:
        if client in self._old:
            self._old.remove(client)
            task = asyncio.ensure_future(client.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        for client in [*self._old, *self._clients.values()]:
            await client.aclose()
        self._old, self._clients = [], {}


async def aread_all(resp: httpx.Response) -> bytes:
    """The whole body of an async response; the stream is closed either way."""
    try:
        return await resp.aread()
    finally:
        await resp.aclose()


def achunks(resp: httpx.Response) -> AsyncIterator[bytes]:
    return resp.aiter_bytes()


async def aclose(resp: httpx.Response) -> None:
    await resp.aclose()


class _Open:
    def __init__(self, http: AsyncHttp) -> None:
        self.http = http

    async def __aenter__(self) -> AsyncHttp:
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()


def open_transport(cluster: ClusterConfig) -> _Open:
    """An async transport for this connection, closed on exit."""
    return _Open(AsyncHttp(cluster, credentials_for(cluster)))
