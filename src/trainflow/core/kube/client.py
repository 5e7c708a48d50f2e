"""KubeApi: the API calls trainflow makes, each retried and translated once, at this boundary.

Every call except a create is retried (``retry.call``: 429 with Retry-After, 5xx, connection errors). A create
is POSTed once, and again only after a 429 (refused before it was processed). Every failure leaves as a
trainflow error (``apierrors.translate``): callers never see an ApiException or a status code.
Arguments are passed positionally or by names that kubernetes 30.x and 37.x both accept. Core-API reads use
``_preload_content=False`` and return the server's JSON (camelCase dicts), never the client's models.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from trainflow.core.kube import retry
from trainflow.core.kube.apierrors import translate
from trainflow.core.kube.config import ClusterConfig
from trainflow.core.naming import GROUP, VERSION

PLURAL = "trainjobs"
CLUSTER_RUNTIMES = "clustertrainingruntimes"
RUNTIMES = "trainingruntimes"
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
T = TypeVar("T")


def read_json(resp: Any) -> Any:
    """Body of a raw (``_preload_content=False``) urllib3 response as JSON; releases the connection."""
    try:
        data = resp.read()
    finally:
        release = getattr(resp, "release_conn", None)
        if release is not None:
            release()
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    return json.loads(data) if data else {}


def iter_lines(resp: Any, chunk: int = 16 * 1024) -> Iterator[bytes]:
    """Lines of a streaming urllib3 response (watch events, followed logs), without the newline."""
    buf = b""
    for piece in resp.stream(chunk, decode_content=True):
        if not piece:
            continue
        buf += piece
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line
    if buf:
        yield buf


class KubeApi:
    """The sync calls of one connection, on a private ApiClient made on first use."""

    def __init__(self, cluster: ClusterConfig, policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
        self.cluster = cluster
        self.policy = policy
        self.timeout = (CONNECT_TIMEOUT, READ_TIMEOUT)
        self._client: Any = None
        self._custom: Any = None
        self._core: Any = None

    @property
    def api_client(self) -> Any:
        if self._client is None:
            from kubernetes import client as k8s_client

            self._client = k8s_client.ApiClient(configuration=self.cluster.sync_configuration())
            self._custom = k8s_client.CustomObjectsApi(self._client)
            self._core = k8s_client.CoreV1Api(self._client)
        return self._client

    @property
    def custom(self) -> Any:
        self.api_client  # noqa: B018 - makes the clients
        return self._custom

    @property
    def core(self) -> Any:
        self.api_client  # noqa: B018 - makes the clients
        return self._core

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _call(
        self,
        verb: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        fn: Callable[..., T],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        try:
            return retry.call(fn, *args, policy=self.policy, **kwargs)
        except Exception as exc:
            mapped = translate(exc, verb, resource, namespace, name)
            if mapped is exc:
                raise
            raise mapped from exc

    # --- TrainJobs -------------------------------------------------------------------------------
    def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(
            "get", PLURAL, namespace, name, self.custom.get_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.timeout,
        )  # fmt: skip

    def list_trainjobs(
        self, namespace: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> dict[str, Any]:
        kwargs = {
            k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v
        }
        return self._call(
            "list", PLURAL, namespace, None, self.custom.list_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL, _request_timeout=self.timeout, **kwargs,
        )  # fmt: skip

    def create_trainjob(
        self, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """POST once; only a 429 (refused before it was processed) is POSTed again, after Retry-After."""
        kwargs: dict[str, Any] = {"field_manager": "trainflow"}
        if dry_run:
            kwargs["dry_run"] = "All"
        name = str((body.get("metadata") or {}).get("name") or "")
        throttled = 0
        while True:
            try:
                out: dict[str, Any] = self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, body, _request_timeout=self.timeout, **kwargs
                )
                return out
            except Exception as exc:
                if retry.status_of(exc) == 429 and throttled < self.policy.attempts:
                    throttled += 1
                    time.sleep(retry.wait_seconds(exc, throttled, self.policy))
                    continue
                mapped = translate(exc, "create", PLURAL, namespace, name)
                if mapped is exc:
                    raise
                raise mapped from exc

    def patch_trainjob(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (the content type both client versions send for custom objects)."""
        return self._call(
            "patch", PLURAL, namespace, name, self.custom.patch_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL, name, patch,
            field_manager="trainflow", _request_timeout=self.timeout,
        )  # fmt: skip

    def delete_trainjob(self, namespace: str, name: str, propagation_policy: str = "Background") -> None:
        self._call(
            "delete", PLURAL, namespace, name, self.custom.delete_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL, name,
            propagation_policy=propagation_policy,
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy},
            _request_timeout=self.timeout,
        )  # fmt: skip

    def watch_trainjobs(
        self,
        namespace: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        field_selector: str | None = None,
    ) -> Any:
        """Open a watch and return the raw streaming response (``Gone`` when the version is too old)."""
        kwargs = {"field_selector": field_selector} if field_selector else {}
        return self._call(
            "watch", PLURAL, namespace, None, self.custom.list_namespaced_custom_object,
            GROUP, VERSION, namespace, PLURAL,
            watch=True, resource_version=resource_version, timeout_seconds=int(timeout_seconds),
            allow_watch_bookmarks=True, _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT, float(timeout_seconds) + 30.0), **kwargs,
        )  # fmt: skip

    # --- runtimes --------------------------------------------------------------------------------
    def list_cluster_runtimes(self) -> list[dict[str, Any]]:
        out = self._call(
            "list", CLUSTER_RUNTIMES, None, None, self.custom.list_cluster_custom_object,
            GROUP, VERSION, CLUSTER_RUNTIMES, _request_timeout=self.timeout,
        )  # fmt: skip
        return [dict(i, kind="ClusterTrainingRuntime") for i in out.get("items") or []]

    def list_runtimes(self, namespace: str) -> list[dict[str, Any]]:
        out = self._call(
            "list", RUNTIMES, namespace, None, self.custom.list_namespaced_custom_object,
            GROUP, VERSION, namespace, RUNTIMES, _request_timeout=self.timeout,
        )  # fmt: skip
        return [dict(i, kind="TrainingRuntime") for i in out.get("items") or []]

    def get_runtime(self, name: str, kind: str, namespace: str) -> dict[str, Any]:
        if kind == "TrainingRuntime":
            obj = self._call(
                "get", RUNTIMES, namespace, name, self.custom.get_namespaced_custom_object,
                GROUP, VERSION, namespace, RUNTIMES, name, _request_timeout=self.timeout,
            )  # fmt: skip
        else:
            obj = self._call(
                "get", CLUSTER_RUNTIMES, None, name, self.custom.get_cluster_custom_object,
                GROUP, VERSION, CLUSTER_RUNTIMES, name, _request_timeout=self.timeout,
            )  # fmt: skip
        return dict(obj, kind=kind)

    # --- pods, events, logs (raw JSON) -----------------------------------------------------------
    def list_pods(self, namespace: str, label_selector: str, limit: int = 100) -> list[dict[str, Any]]:
        resp = self._call(
            "list", "pods", namespace, None, self.core.list_namespaced_pod, namespace,
            label_selector=label_selector, limit=limit, _preload_content=False, _request_timeout=self.timeout,
        )  # fmt: skip
        return list(read_json(resp).get("items") or [])

    def list_events(self, namespace: str, field_selector: str, limit: int = 200) -> list[dict[str, Any]]:
        resp = self._call(
            "list", "events", namespace, None, self.core.list_namespaced_event, namespace,
            field_selector=field_selector, limit=limit, _preload_content=False, _request_timeout=self.timeout,
        )  # fmt: skip
        return list(read_json(resp).get("items") or [])

    def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        follow: bool = False,
        tail_lines: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
        limit_bytes: int | None = None,
    ) -> Any:
        """Raw streaming response of a container log (retried on transient errors while opening)."""
        kwargs: dict[str, Any] = {"container": container, "follow": follow, "timestamps": timestamps}
        if tail_lines is not None:
            kwargs["tail_lines"] = int(tail_lines)
        if since_seconds is not None:
            kwargs["since_seconds"] = max(1, int(since_seconds))
        if limit_bytes is not None:
            kwargs["limit_bytes"] = int(limit_bytes)
        timeout: Any = (CONNECT_TIMEOUT, 300.0) if follow else self.timeout
        return self._call(
            "get", "pods/log", namespace, pod, self.core.read_namespaced_pod_log, pod, namespace,
            _preload_content=False, _request_timeout=timeout, **kwargs,
        )  # fmt: skip

    def log_text(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        """The tail of a container log as text."""
        resp = self.pod_log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes)
        try:
            data = resp.read()
        finally:
            resp.release_conn()
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
