"""A fault-injecting HTTP proxy between trainflow and the testbed's kube-apiserver (aiohttp, in a thread).

Why not toxiproxy: it works at the TCP level, and the API server speaks TLS, so a TCP proxy can delay and
reset connections but cannot answer 429 + Retry-After or cut one watch at an event boundary. This proxy
terminates HTTP (clients talk plain HTTP to 127.0.0.1), forwards to the API server over TLS with the testbed
admin client certificate, streams responses (watches, logs) through, and can:

- ``fail(n, status, retry_after, match)``: answer the next n matching requests itself (429/503 + Retry-After);
- ``reset(n, match, after_forward)``: drop the client connection of the next n matching requests, before
  forwarding (request never reached the server) or after the server answered (the answer is lost);
- ``latency``: seconds added before forwarding every request;
- ``cut_streams()``: drop every open streaming response (watches) mid-stream;
- ``reroute(match, path)``: forward matching requests to another path (e.g. a resource of an API group that
  does not exist: the server's own 404 of a resource type);
- ``unauthenticate(match)``: forward matching requests without the client certificate and with a bearer
  token the server does not know (the server's own 401);
- ``inject(lines, match)``: write lines (``ERROR`` events, malformed JSON) at the start of a matching
  forwarded watch, then close it or go on forwarding.

Clients' own ``Authorization`` headers are not forwarded: the proxy authenticates with its certificate.

Counts every request by (method, kind) so tests can assert e.g. exactly one POST reached the server.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from forward_proxy import LoopThread  # tests/e2e/forward_proxy.py, loaded by this folder's conftest

Match = Callable[[str, str], bool]  # (method, path_qs) -> bool


def any_request(_m: str, _p: str) -> bool:
    return True


@dataclass
class _Rule:
    remaining: int | None  # None: every matching request
    match: Match
    kind: str  # "fail" | "reset-before" | "reset-after" | "reroute" | "unauthenticate" | "inject"
    status: int = 429
    retry_after: float | None = None
    body: str | None = None
    path: Callable[[str], str] | None = None
    lines: list[bytes] = field(default_factory=list)
    then: str = (
        "close"  # inject: "close" the watch after the lines, or "stream" the server's events after them
    )
    fired: int = 0


@dataclass
class FaultProxy(LoopThread):
    upstream: str
    ca: Path
    cert: Path
    key: Path
    latency: float = 0.0
    rules: list[_Rule] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    fail_times: list[float] = field(default_factory=list)
    port: int = 0

    # --- control (any thread) ------------------------------------------------------------------
    def _add(self, rule: _Rule) -> _Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail(
        self,
        n: int | None,
        status: int = 429,
        retry_after: float | None = 1.0,
        match: Match = any_request,
        body: str | None = None,
    ) -> _Rule:
        return self._add(_Rule(n, match, "fail", status, retry_after, body))

    def reset(self, n: int, match: Match = any_request, after_forward: bool = False) -> _Rule:
        return self._add(_Rule(n, match, "reset-after" if after_forward else "reset-before"))

    def reroute(self, path: Callable[[str], str], match: Match, n: int | None = None) -> _Rule:
        return self._add(_Rule(n, match, "reroute", path=path))

    def unauthenticate(self, match: Match = any_request, n: int | None = None) -> _Rule:
        return self._add(_Rule(n, match, "unauthenticate"))

    def inject(self, lines: list[bytes], match: Match, n: int | None = 1, then: str = "close") -> _Rule:
        return self._add(_Rule(n, match, "inject", lines=list(lines), then=then))

    def cut_streams(self) -> int:
        cut = list(self._streams)
        for transport in cut:
            self._loop.call_soon_threadsafe(transport.abort)
        return len(cut)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
        self.latency = 0.0

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.server}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [
                {"name": "proxy", "context": {"cluster": "proxy", "user": "proxy", "namespace": namespace}}
            ],
            "current-context": "proxy",
        }

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._lock = threading.Lock()
        self._streams: set[Any] = set()
        self._start_loop("faultproxy")
        return self

    async def _serve(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        self._session = ClientSession(
            connector=TCPConnector(ssl=ctx, limit=200), timeout=ClientTimeout(total=None, sock_connect=10)
        )
        anonymous = ssl.create_default_context(cafile=str(self.ca))  # no client certificate
        self._anonymous = ClientSession(
            connector=TCPConnector(ssl=anonymous, limit=50),
            timeout=ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await self._session.close()
        await self._anonymous.close()

    def _take(self, method: str, path: str) -> _Rule | None:
        with self._lock:
            for rule in self.rules:
                if (rule.remaining is None or rule.remaining > 0) and rule.match(method, path):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    rule.fired += 1
                    return rule
        return None

    @staticmethod
    def kind_of(method: str, path: str) -> str:
        watch = "watch=true" in path or "watch=1" in path
        resource = path.split("?", 1)[0].rstrip("/").split("/")
        plural = next(
            (p for p in reversed(resource) if p in ("trainjobs", "pods", "events", "log", "jobsets")), "other"
        )
        if plural == "trainjobs" and len(resource) >= 2 and resource[-1] != "trainjobs":
            plural = "trainjob"
        return f"{'WATCH' if watch else method} {plural}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path_qs
        kind = self.kind_of(method, path)
        self.counts[kind] += 1
        rule = self._take(method, path)
        if rule is not None and rule.kind == "fail":
            self.injected[f"{rule.status} {kind}"] += 1
            self.fail_times.append(time.time())
            headers = {"Content-Type": "application/json"}
            if rule.retry_after is not None:
                headers["Retry-After"] = str(int(rule.retry_after))
            body = rule.body or (
                '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by faultproxy",'
                f'"reason":"TooManyRequests","code":{rule.status}}}'
            )
            return web.Response(status=rule.status, text=body, headers=headers)
        if rule is not None and rule.kind == "reset-before":
            self.injected[f"reset-before {kind}"] += 1
            request.transport.abort()  # type: ignore[union-attr]
            return web.Response(status=499)
        if self.latency:
            await asyncio.sleep(self.latency)
        body = await request.read()
        dropped = ("host", "content-length", "authorization")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        session = self._session
        if rule is not None and rule.kind == "reroute" and rule.path is not None:
            self.injected[f"reroute {kind}"] += 1
            path = rule.path(path)
        if rule is not None and rule.kind == "unauthenticate":
            self.injected[f"401 {kind}"] += 1
            session, headers["Authorization"] = self._anonymous, "Bearer not-a-token-the-server-knows"
        async with session.request(method, self.upstream + path, data=body or None, headers=headers) as up:
            if rule is not None and rule.kind == "reset-after":
                await up.read()
                self.injected[f"reset-after {kind}"] += 1
                request.transport.abort()  # type: ignore[union-attr]
                return web.Response(status=499)
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding", "connection"):
                    resp.headers[k] = v
            await resp.prepare(request)
            if rule is not None and rule.kind == "inject" and up.status == 200:
                self.injected[f"inject {kind}"] += 1
                for line in rule.lines:
                    await resp.write(line)
                if rule.then == "close":
                    await resp.write_eof()
                    return resp
            transport = request.transport
            self._streams.add(transport)
            try:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
            finally:
                self._streams.discard(transport)
            await resp.write_eof()
            return resp
