"""Every API call trainflow makes, described once: the sync and async clients (and the plans) only run them.

A ``Call`` says what to send and how to read the answer; ``verb`` decides the retry rule (kube/retry.py:
everything but a create is retried) and the error translation (kube/apierrors.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from trainflow.core.naming import GROUP, VERSION

PLURAL = "trainjobs"
CLUSTER_RUNTIMES = "clustertrainingruntimes"
RUNTIMES = "trainingruntimes"
METHODS = {"create": "POST", "patch": "PATCH", "delete": "DELETE"}
WATCH_SLACK = 30.0  # a watch's read deadline beyond its timeoutSeconds
LOG_FOLLOW_READ = 300.0  # a followed log may stay quiet this long before the read is retried
LOG_TAIL_SECONDS = 15.0  # a log tail read is bounded: diagnostics must not hold a wait's ending back


@dataclass(frozen=True)
class Call:
    """One request: ``verb`` (get, list, watch, create, patch, delete) for retries and errors; ``read`` says how
    the answer is returned: ``json`` (a dict), ``text``, or ``stream`` (the open response)."""

    verb: str
    resource: str
    namespace: str | None
    name: str | None
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    content_type: str | None = None
    read: str = "json"
    timeout: float | None = None  # seconds the whole request may take (streams: between reads)
    attempts: int | None = None  # at most this many tries (None: the retry policy's)
    held: bool = False  # open until the server ends it (a followed log): a connection of its own

    @property
    def method(self) -> str:
        return METHODS.get(self.verb, "GET")

    @property
    def stream(self) -> bool:
        return self.read == "stream"


def path_of(*segments: str) -> str:
    return "/" + "/".join(quote(s, safe="") for s in segments)


def _q(**params: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for key, value in params.items():
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out.append((key, text))
    return tuple(out)


def _jobs(namespace: str, *rest: str) -> str:
    return path_of("apis", GROUP, VERSION, "namespaces", namespace, PLURAL, *rest)


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


# --- TrainJobs -------------------------------------------------------------------------------------------
def get_trainjob(namespace: str, name: str) -> Call:
    return Call("get", PLURAL, namespace, name, _jobs(namespace, name))


def list_trainjobs(
    namespace: str,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    limit: int | None = None,
    continue_token: str | None = None,
) -> Call:
    query = _q(labelSelector=label_selector, fieldSelector=field_selector, limit=limit)
    query += _q(**{"continue": continue_token})
    return Call("list", PLURAL, namespace, None, _jobs(namespace), query)


def watch_trainjobs(
    namespace: str, resource_version: str, timeout_seconds: int, *, field_selector: str | None = None
) -> Call:
    return _watch(
        PLURAL, namespace, _jobs(namespace), resource_version, timeout_seconds, fieldSelector=field_selector
    )


def create_trainjob(namespace: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Call:
    """A create the API server checks strictly: a field its TrainJob schema lacks is refused (400, the path
    named), never pruned silently; the cluster, not trainflow's vendored schema, decides what it accepts."""
    name = str((body.get("metadata") or {}).get("name") or "")
    query = _q(fieldManager="trainflow", fieldValidation="Strict", dryRun="All" if dry_run else None)
    return Call("create", PLURAL, namespace, name, _jobs(namespace), query, _json(body), "application/json")


def patch_trainjob(namespace: str, name: str, patch: Mapping[str, Any]) -> Call:
    query = _q(fieldManager="trainflow")
    return Call(
        "patch",
        PLURAL,
        namespace,
        name,
        _jobs(namespace, name),
        query,
        _json(patch),
        "application/merge-patch+json",
    )


def delete_trainjob(namespace: str, name: str, propagation_policy: str = "Background") -> Call:
    body = _json({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy})
    return Call("delete", PLURAL, namespace, name, _jobs(namespace, name), (), body, "application/json")


def get_trainjob_crd() -> Call:
    """The TrainJob CRD the cluster serves (its schema is what a create is checked against)."""
    return Call(
        "get",
        "customresourcedefinitions",
        None,
        f"{PLURAL}.{GROUP}",
        path_of("apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", f"{PLURAL}.{GROUP}"),
    )


# --- runtimes --------------------------------------------------------------------------------------------
def list_cluster_runtimes() -> Call:
    return Call("list", CLUSTER_RUNTIMES, None, None, path_of("apis", GROUP, VERSION, CLUSTER_RUNTIMES))


def list_runtimes(namespace: str) -> Call:
    return Call(
        "list", RUNTIMES, namespace, None, path_of("apis", GROUP, VERSION, "namespaces", namespace, RUNTIMES)
    )


def get_runtime(name: str, kind: str, namespace: str) -> Call:
    if kind == "TrainingRuntime":
        path = path_of("apis", GROUP, VERSION, "namespaces", namespace, RUNTIMES, name)
        return Call("get", RUNTIMES, namespace, name, path)
    return Call("get", CLUSTER_RUNTIMES, None, name, path_of("apis", GROUP, VERSION, CLUSTER_RUNTIMES, name))


# --- pods, events, logs ----------------------------------------------------------------------------------
def _pods(namespace: str, *rest: str) -> str:
    return path_of("api", "v1", "namespaces", namespace, "pods", *rest)


def list_pods(
    namespace: str, label_selector: str, limit: int = 100, continue_token: str | None = None
) -> Call:
    query = _q(labelSelector=label_selector, limit=limit, **{"continue": continue_token})
    return Call("list", "pods", namespace, None, _pods(namespace), query)


def watch_pods(namespace: str, label_selector: str, resource_version: str, timeout_seconds: int) -> Call:
    return _watch(
        "pods", namespace, _pods(namespace), resource_version, timeout_seconds, labelSelector=label_selector
    )


def list_events(namespace: str, field_selector: str, limit: int = 200) -> Call:
    path = path_of("api", "v1", "namespaces", namespace, "events")
    return Call("list", "events", namespace, None, path, _q(fieldSelector=field_selector, limit=limit))


def pod_log(
    namespace: str,
    pod: str,
    container: str,
    *,
    follow: bool = False,
    tail_lines: int | None = None,
    since_seconds: int | None = None,
    since_time: str | None = None,
    timestamps: bool = False,
    limit_bytes: int | None = None,
    stream: bool = False,
    previous: bool = False,
) -> Call:
    """A container's log: its text, or (``follow``/``stream``) the open response to read line by line;
    ``previous``: the instance before its last restart."""
    query = _q(
        container=container,
        previous=previous or None,
        follow=follow or None,
        timestamps=timestamps or None,
        tailLines=tail_lines,
        sinceSeconds=max(1, int(since_seconds)) if since_seconds is not None else None,
        sinceTime=since_time,
        limitBytes=limit_bytes,
    )
    path = _pods(namespace, pod, "log")
    if follow:
        return Call(
            "get", "pods/log", namespace, pod, path, query, read="stream", timeout=LOG_FOLLOW_READ, held=True
        )
    if stream:
        return Call("get", "pods/log", namespace, pod, path, query, read="stream")
    # a tail (diagnostics, metrics): bounded in time and tried twice at most, so reading it never holds a
    # failure's report back for minutes
    return Call(
        "get", "pods/log", namespace, pod, path, query, read="text", timeout=LOG_TAIL_SECONDS, attempts=2
    )


# --- Kueue (kueue.x-k8s.io): Workloads, LocalQueues, WorkloadPriorityClasses ---------------------------
KUEUE_GROUP = "kueue.x-k8s.io"


def _kueue(version: str, plural: str, namespace: str | None, *rest: str) -> str:
    where = ("namespaces", namespace) if namespace else ()
    return path_of("apis", KUEUE_GROUP, version, *where, plural, *rest)


def list_workloads(
    namespace: str,
    label_selector: str | None,
    version: str,
    limit: int | None = None,
    continue_token: str | None = None,
) -> Call:
    query = _q(labelSelector=label_selector, limit=limit, **{"continue": continue_token})
    return Call(
        "list", f"workloads.{KUEUE_GROUP}", namespace, None, _kueue(version, "workloads", namespace), query
    )


def watch_workloads(namespace: str, version: str, resource_version: str, timeout_seconds: int) -> Call:
    path = _kueue(version, "workloads", namespace)
    return _watch(f"workloads.{KUEUE_GROUP}", namespace, path, resource_version, timeout_seconds)


def get_kueue_object(plural: str, name: str, version: str, namespace: str | None = None) -> Call:
    """A LocalQueue (namespaced) or a WorkloadPriorityClass (cluster-scoped)."""
    return Call("get", f"{plural}.{KUEUE_GROUP}", namespace, name, _kueue(version, plural, namespace, name))


def list_kueue_objects(plural: str, version: str, namespace: str | None = None) -> Call:
    return Call("list", f"{plural}.{KUEUE_GROUP}", namespace, None, _kueue(version, plural, namespace))


def version() -> Call:
    return Call("get", "version", None, None, "/version")


def _watch(resource: str, namespace: str, path: str, rv: str, timeout: int, **selector: str | None) -> Call:
    query = _q(**selector) + _q(
        watch=True, resourceVersion=rv, timeoutSeconds=int(timeout), allowWatchBookmarks=True
    )
    return Call(
        "watch", resource, namespace, None, path, query, read="stream", timeout=float(timeout) + WATCH_SLACK
    )


class ApiException(Exception):
    """A non-2xx answer: status, reason, body and headers (kube/retry.py and kube/apierrors.py read these).

    The message names the status only: bodies and headers can be large, and headers can carry secrets.
    """

    def __init__(
        self,
        status: int,
        reason: str | None,
        body: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"({status}) {reason}")
        self.status, self.reason, self.body, self.headers = status, reason, body, headers


USER_AGENT = "trainflow"


def request_headers(call: Call, auth: Mapping[str, str]) -> dict[str, str]:
    """The headers of one request: the credentials' (Authorization, impersonation), Accept, Content-Type."""
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **auth}
    if call.read == "text":
        headers["Accept"] = "*/*"
    if call.content_type:
        headers["Content-Type"] = call.content_type
    return headers


def url_of(base: str, call: Call) -> str:
    from urllib.parse import urlencode

    return base.rstrip("/") + call.path + (f"?{urlencode(call.query)}" if call.query else "")
