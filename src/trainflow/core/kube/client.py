"""Thin sync wrapper over the kubernetes client for what trainflow touches: TrainJobs, runtimes, pods, events, logs.

Arguments are passed positionally or by names that kubernetes 30.x and 37.x both accept. Core-API reads use
``_preload_content=False`` and return the server's JSON (camelCase dicts), never the client's snake_case models.
Every call except create goes through ``retry.call``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s_client

from trainflow.core.kube import retry
from trainflow.core.runtimes import GROUP, VERSION

PLURAL = "trainjobs"
CLUSTER_RUNTIMES = "clustertrainingruntimes"
RUNTIMES = "trainingruntimes"
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0


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
    """The API calls trainflow makes, bound to one private ApiClient."""

    def __init__(
        self, api_client: k8s_client.ApiClient, policy: retry.RetryPolicy = retry.DEFAULT_POLICY
    ) -> None:
        self.api_client = api_client
        self.custom = k8s_client.CustomObjectsApi(api_client)
        self.core = k8s_client.CoreV1Api(api_client)
        self.policy = policy
        self.timeout = (CONNECT_TIMEOUT, READ_TIMEOUT)

    # --- TrainJobs -------------------------------------------------------------------------------
    def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = retry.call(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return out

    def list_trainjobs(
        self, namespace: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        out: dict[str, Any] = retry.call(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            _request_timeout=self.timeout,
            policy=self.policy,
            **kwargs,
        )
        return out

    def create_trainjob(
        self, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """POST once. Never retried here: the caller decides after looking at what exists."""
        kwargs: dict[str, Any] = {"field_manager": "trainflow"}
        if dry_run:
            kwargs["dry_run"] = "All"
        out: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, _request_timeout=self.timeout, **kwargs
        )
        return out

    def patch_trainjob(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (the content type both client versions send for custom objects)."""
        out: dict[str, Any] = retry.call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            patch,
            field_manager="trainflow",
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return out

    def delete_trainjob(
        self, namespace: str, name: str, propagation_policy: str = "Background"
    ) -> dict[str, Any]:
        out: dict[str, Any] = retry.call(
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            propagation_policy=propagation_policy,
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy},
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return out

    def watch_trainjobs(
        self,
        namespace: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        field_selector: str | None = None,
    ) -> Any:
        """Open a watch (retried on transient errors) and return the raw streaming response."""
        kwargs: dict[str, Any] = {}
        if field_selector:
            kwargs["field_selector"] = field_selector
        return retry.call(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            watch=True,
            resource_version=resource_version,
            timeout_seconds=int(timeout_seconds),
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT, float(timeout_seconds) + 30.0),
            policy=self.policy,
            **kwargs,
        )

    # --- runtimes --------------------------------------------------------------------------------
    def list_cluster_runtimes(self) -> list[dict[str, Any]]:
        out = retry.call(
            self.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            CLUSTER_RUNTIMES,
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return [dict(i, kind="ClusterTrainingRuntime") for i in out.get("items") or []]

    def list_runtimes(self, namespace: str) -> list[dict[str, Any]]:
        out = retry.call(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            RUNTIMES,
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return [dict(i, kind="TrainingRuntime") for i in out.get("items") or []]

    def get_runtime(self, name: str, kind: str, namespace: str) -> dict[str, Any]:
        if kind == "TrainingRuntime":
            obj = retry.call(
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                RUNTIMES,
                name,
                _request_timeout=self.timeout,
                policy=self.policy,
            )
        else:
            obj = retry.call(
                self.custom.get_cluster_custom_object,
                GROUP,
                VERSION,
                CLUSTER_RUNTIMES,
                name,
                _request_timeout=self.timeout,
                policy=self.policy,
            )
        return dict(obj, kind=kind)

    # --- pods, events, logs (raw JSON) -----------------------------------------------------------
    def list_pods(self, namespace: str, label_selector: str, limit: int = 100) -> list[dict[str, Any]]:
        resp = retry.call(
            self.core.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            limit=limit,
            _preload_content=False,
            _request_timeout=self.timeout,
            policy=self.policy,
        )
        return list(read_json(resp).get("items") or [])

    def list_events(self, namespace: str, field_selector: str, limit: int = 200) -> list[dict[str, Any]]:
        resp = retry.call(
            self.core.list_namespaced_event,
            namespace,
            field_selector=field_selector,
            limit=limit,
            _preload_content=False,
            _request_timeout=self.timeout,
            policy=self.policy,
        )
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
        return retry.call(
            self.core.read_namespaced_pod_log,
            pod,
            namespace,
            _preload_content=False,
            _request_timeout=timeout,
            policy=self.policy,
            **kwargs,
        )
