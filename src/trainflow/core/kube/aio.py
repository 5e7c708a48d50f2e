"""AsyncKubeApi: the calls an event loop makes (the shared watch, finishing reads), retried and translated once.

The async twin of ``KubeApi`` on kubernetes_asyncio: same retry policy, same error translation, same raw
JSON. A waiter on an event loop never falls back to the sync client (nor loads it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import translate
from trainflow.core.kube.client import PLURAL
from trainflow.core.naming import GROUP, VERSION

T = TypeVar("T")
WATCH_SLACK = 30.0


class AsyncKubeApi:
    """Calls of one connection on one kubernetes_asyncio ApiClient (one aiohttp session, one event loop)."""

    def __init__(self, api_client: Any, policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        self.api_client = api_client
        self.custom = CustomObjectsApi(api_client)
        self.core = CoreV1Api(api_client)
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

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call(
            "get", PLURAL, namespace, name, self.custom.get_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL, name,
        )  # fmt: skip

    async def list_trainjobs(self, namespace: str) -> dict[str, Any]:
        return await self._call(
            "list", PLURAL, namespace, None, self.custom.list_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL,
        )  # fmt: skip

    async def watch_trainjobs(self, namespace: str, resource_version: str, timeout_seconds: int) -> Any:
        """Open a namespace watch; returns the raw aiohttp response (``Gone`` when the version is too old)."""
        resp = await self._call(
            "watch", PLURAL, namespace, None, self.custom.list_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL,
            watch=True, resource_version=resource_version, timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True, _preload_content=False, _request_timeout=timeout_seconds + WATCH_SLACK,
        )  # fmt: skip
        if not 200 <= resp.status <= 299:
            body = await resp.text()
            resp.release()
            from kubernetes_asyncio.client.exceptions import ApiException

            error = ApiException(status=resp.status, reason=resp.reason)
            error.body = body
            mapped = translate(error, "watch", PLURAL, namespace)
            raise mapped from error
        return resp

    async def list_pods(self, namespace: str, label_selector: str, limit: int = 100) -> list[dict[str, Any]]:
        resp = await self._call(
            "list", "pods", namespace, None, self.core.list_namespaced_pod, namespace,
            label_selector=label_selector, limit=limit, _preload_content=False,
        )  # fmt: skip
        return list((await _json(resp)).get("items") or [])

    async def list_events(
        self, namespace: str, field_selector: str, limit: int = 200
    ) -> list[dict[str, Any]]:
        resp = await self._call(
            "list", "events", namespace, None, self.core.list_namespaced_event, namespace,
            field_selector=field_selector, limit=limit, _preload_content=False,
        )  # fmt: skip
        return list((await _json(resp)).get("items") or [])

    async def log_text(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int
    ) -> str:
        resp: Any = await self._call(
            "get", "pods/log", namespace, pod, self.core.read_namespaced_pod_log, pod, namespace,
            container=container, tail_lines=tail_lines, limit_bytes=limit_bytes, _preload_content=False,
        )  # fmt: skip
        try:
            data = await resp.read()
        finally:
            resp.release()
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


async def _json(resp: Any) -> dict[str, Any]:
    try:
        data = await resp.read()
    finally:
        resp.release()
    out = json.loads(data) if data else {}
    return out if isinstance(out, dict) else {}
