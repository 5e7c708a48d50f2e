"""AsyncKubeApi: the calls an event loop makes (the shared watch, finishing reads), retried and translated once.

The async twin of ``KubeApi``: same retry policy, same error translation, same raw JSON, over the transport
of kube/transport.py. A waiter on an event loop never falls back to the sync client (nor loads it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import translate
from trainflow.core.kube.client import PLURAL
from trainflow.core.kube.transport import Query, Transport, path_of
from trainflow.core.naming import GROUP, VERSION

T = TypeVar("T")
WATCH_SLACK = 30.0


class AsyncKubeApi:
    """Calls of one connection (one aiohttp session, one event loop)."""

    def __init__(self, transport: Transport, policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
        self.transport = transport
        self.policy = policy

    async def _call(
        self,
        verb: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        try:
            return await retry.acall(fn, *args, policy=self.policy, **kwargs)
        except Exception as exc:
            mapped = translate(exc, verb, resource, namespace, name)
            if mapped is exc:
                raise
            raise mapped from exc

    async def _get_json(self, path: str, query: Query) -> dict[str, Any]:
        data = await _read(await self.transport.get(path, query))
        out = json.loads(data) if data else {}
        return out if isinstance(out, dict) else {}

    async def _get_text(self, path: str, query: Query) -> str:
        return (await _read(await self.transport.get(path, query))).decode("utf-8", "replace")

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        path = path_of("apis", GROUP, VERSION, "namespaces", namespace, PLURAL, name)
        return await self._call("get", PLURAL, namespace, name, self._get_json, path, {})

    async def list_trainjobs(self, namespace: str) -> dict[str, Any]:
        path = path_of("apis", GROUP, VERSION, "namespaces", namespace, PLURAL)
        return await self._call("list", PLURAL, namespace, None, self._get_json, path, {})

    async def watch_trainjobs(self, namespace: str, resource_version: str, timeout_seconds: int) -> Any:
        """Open a namespace watch; returns the unread response (``Gone`` when the version is too old)."""
        path = path_of("apis", GROUP, VERSION, "namespaces", namespace, PLURAL)
        return await self._watch(PLURAL, namespace, path, {}, resource_version, timeout_seconds)

    async def list_pods_page(
        self, namespace: str, label_selector: str, limit: int, continue_token: str | None = None
    ) -> dict[str, Any]:
        """One page of a pod list, with its metadata (resourceVersion to watch from, continue token)."""
        path = path_of("api", "v1", "namespaces", namespace, "pods")
        query: Query = {"labelSelector": label_selector, "limit": limit}
        if continue_token:
            query = {**query, "continue": continue_token}
        return await self._call("list", "pods", namespace, None, self._get_json, path, query)

    async def watch_pods(
        self, namespace: str, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> Any:
        path = path_of("api", "v1", "namespaces", namespace, "pods")
        query: Query = {"labelSelector": label_selector}
        return await self._watch("pods", namespace, path, query, resource_version, timeout_seconds)

    async def _watch(
        self, resource: str, namespace: str, path: str, query: Query, resource_version: str, timeout: int
    ) -> Any:
        query = {
            **query,
            "watch": True,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout,
            "allowWatchBookmarks": True,
        }
        return await self._call(
            "watch", resource, namespace, None, self.transport.get, path, query, timeout=timeout + WATCH_SLACK
        )

    async def list_pods(self, namespace: str, label_selector: str, limit: int = 100) -> list[dict[str, Any]]:
        path = path_of("api", "v1", "namespaces", namespace, "pods")
        query: Query = {"labelSelector": label_selector, "limit": limit}
        return list(
            (await self._call("list", "pods", namespace, None, self._get_json, path, query)).get("items")
            or []
        )

    async def list_events(
        self, namespace: str, field_selector: str, limit: int = 200
    ) -> list[dict[str, Any]]:
        path = path_of("api", "v1", "namespaces", namespace, "events")
        query: Query = {"fieldSelector": field_selector, "limit": limit}
        return list(
            (await self._call("list", "events", namespace, None, self._get_json, path, query)).get("items")
            or []
        )

    async def log_text(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int
    ) -> str:
        path = path_of("api", "v1", "namespaces", namespace, "pods", pod, "log")
        query: Query = {"container": container, "tailLines": tail_lines, "limitBytes": limit_bytes}
        return await self._call("get", "pods/log", namespace, pod, self._get_text, path, query)


async def _read(resp: Any) -> bytes:
    """The whole body; the connection goes back to the pool either way."""
    try:
        return bytes(await resp.read())
    finally:
        resp.release()
