"""A small Kubernetes API server on loopback for the watch and fault tests (a test helper, not the real proof).

It speaks enough of the API over real HTTP that urllib3, aiohttp, the client libraries and our retry code all
run: TrainJobs in any namespace (list with label and field selectors, watch from a resourceVersion, get,
create, delete), 410 for compacted versions, dropped watches, ClusterTrainingRuntimes (the vendored
manifests), pods (list, watch, followed logs) and events. Faults are scripted per request (``Rule``):

- ``answer``: a ``Status`` answer for matching requests (403 RBAC, 404 of the resource type, 401, 429, 500),
  N times, every k-th time, or for good; ``forbid`` / ``no_crd`` give the real server's bodies;
- ``redirect``: a redirect to the same URL (a loop: clients that follow redirects give up);
- ``inject``: lines sent at the start of a matching watch (``ERROR`` events, JSON of the wrong shape,
  an oversized line streamed in chunks), then the stream closes or goes on as usual;
- ``tokens``: the bearer tokens accepted (others get the real server's 401);
- ``watch_seconds``: every watch ends cleanly after that long, as a server's ``timeoutSeconds`` does.

Every request is recorded (``requests``) with its status, so tests count 401s, lists or DELETEs.
The real proof is tests/e2e and tests/reliability against the kwok testbed. One file of over 400 lines: other
test folders load it by path, which a module importing a sibling would not survive.
"""

from __future__ import annotations

import copy
import importlib.resources
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlparse

import yaml

from bounds import HANG  # tests/bounds.py: tests/ is on sys.path through tests/conftest.py

GROUP_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
BASE = f"{GROUP_PATH}/namespaces/ns/trainjobs"
_TRAINJOBS = re.compile(rf"^{re.escape(GROUP_PATH)}/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$")
_RUNTIMES = re.compile(
    rf"^{re.escape(GROUP_PATH)}/(?:namespaces/[^/]+/)?(cluster)?trainingruntimes(?:/([^/]+))?$"
)
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$")
_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads"


def kubeconfig(url: str, token: str = "t", namespace: str = "ns") -> dict[str, Any]:
    """An inline kubeconfig for the fake (a bearer token)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": namespace}}],
        "current-context": "fake",
    }


def when(ready: Callable[[], Any], *steps: Any, timeout: float = HANG) -> threading.Thread:
    """Once ``ready()`` holds (polled: the client's pace, not a guess at it), run each ``(fn, *args)`` in turn."""

    def run() -> None:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        for fn, *args in steps:
            fn(*args)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class Req(NamedTuple):
    """One request as the fault rules see it."""

    method: str
    path: str
    query: dict[str, str]
    token: str | None

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "True", "1")

    @property
    def trainjob_collection(self) -> bool:
        m = _TRAINJOBS.match(self.path)
        return bool(m and m.group(2) is None)


# --- matchers ------------------------------------------------------------------------------------------
def any_request(req: Req) -> bool:
    return True


def trainjob_list(req: Req) -> bool:
    return req.method == "GET" and req.trainjob_collection and not req.watch


def trainjob_watch(req: Req) -> bool:
    return req.method == "GET" and req.trainjob_collection and req.watch


def wait_reads(req: Req) -> bool:
    """The TrainJob lists and watches a wait makes (a launch's lookup of earlier attempts has a labelSelector)."""
    return req.method == "GET" and req.trainjob_collection and "labelSelector" not in req.query


@dataclass
class Rule:
    """A scripted answer for matching requests: ``times`` of them (None: all), every ``every``-th one."""

    match: Callable[[Req], bool]
    kind: str  # "status" | "redirect" | "lines"
    times: int | None = 1
    every: int = 1
    status: int = 0
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    lines: Callable[[int], Iterable[bytes]] | None = None  # (resourceVersion) -> chunks to send
    then: str = "close"  # after the lines: "close" the watch or "stream" as usual
    seen: int = 0
    fired: int = 0

    def take(self, req: Req) -> bool:
        if (self.times is not None and self.fired >= self.times) or not self.match(req):
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        self.fired += 1
        return True


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def event_line(event: Any) -> bytes:
    return json.dumps(event).encode() + b"\n"


def error_event(code: int, reason: str, message: str) -> bytes:
    """An ``ERROR`` watch event carrying a Status, as kube-apiserver sends it."""
    return event_line({"type": "ERROR", "object": status_body(code, reason, message)})


def huge_line(
    size: int, name: str = "huge-neighbour", chunk: int = 1 << 20
) -> Callable[[int], Iterator[bytes]]:
    """A MODIFIED event of ``size`` bytes for another TrainJob, streamed in chunks (never held whole here)."""

    def gen(rv: int) -> Iterator[bytes]:
        head = json.dumps(
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
             "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}
        )[:-1].encode()  # fmt: skip
        head = b'{"type":"MODIFIED","object":' + head + b',"pad":"'
        tail = b'"}}\n'
        left = size - len(head) - len(tail)
        yield head
        block = b"x" * chunk
        while left > 0:
            piece = block[: min(chunk, left)]
            left -= len(piece)
            yield piece
        yield tail

    return gen


def _runtimes() -> dict[str, dict[str, Any]]:
    folder = importlib.resources.files("trainflow.core") / "data" / "runtimes"
    out = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            doc = yaml.safe_load(entry.read_text(encoding="utf-8"))
            out[doc["metadata"]["name"]] = doc
    return out


class FakeApiServer:
    def __init__(self) -> None:
        self.rv = 0
        self.oldest = 0  # watches from a version below this get 410
        self.store: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> TrainJob
        self.events: list[tuple[int, str, dict[str, Any], str]] = []  # (rv, type, object, resource)
        self.cond = threading.Condition()
        self.watch_requests = 0
        self.open_watches = 0
        self.max_open_watches = 0
        self.list_requests = 0
        self.pod_watch_requests = 0
        self.pod_list_requests = 0
        self.forbid_pod_watch = False  # RBAC without watch on pods
        self.drop_generation = 0
        self.pods: list[dict[str, Any]] = []
        self.log_lines: list[tuple[float, str]] = []  # (epoch seconds, text)
        self.log_requests: list[dict[str, str]] = []
        self.hold_follows = False  # a followed log stays open after its lines (as kwok's does), until close()
        self.workloads: list[dict[str, Any]] = []  # Kueue Workloads (namespace ns)
        self.workload_lists: list[str] = []  # the label selector of each Workload LIST
        self.workload_watches = 0
        self.rules: list[Rule] = []
        self.tokens: set[str] | None = None  # bearer tokens accepted; None: any
        self.watch_seconds: float | None = None
        self.requests: list[tuple[Req, int]] = []  # every request and the status it got
        self.runtimes = _runtimes()
        self._uids = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        """The TrainJobs of namespace ``ns`` by name."""
        return {name: obj for (ns, name), obj in self.store.items() if ns == "ns"}

    def close(self) -> None:
        with self.cond:
            self.drop_generation += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- scripted faults -------------------------------------------------------------------------
    def add_rule(self, rule: Rule) -> Rule:
        with self.cond:
            self.rules.append(rule)
        return rule

    def answer(
        self,
        status: int,
        match: Callable[[Req], bool] = any_request,
        *,
        times: int | None = 1,
        every: int = 1,
        reason: str = "InternalError",
        message: str = "injected",
        retry_after: float | None = None,
    ) -> Rule:
        headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else {}
        body = status_body(status, reason, message)
        return self.add_rule(Rule(match, "status", times, every, status, body, headers))

    def forbid(
        self, match: Callable[[Req], bool] = wait_reads, user: str = "system:serviceaccount:ns:waiter"
    ) -> Rule:
        """403 for good, with kube-apiserver's RBAC message."""
        message = (
            f'trainjobs.trainer.kubeflow.org is forbidden: User "{user}" cannot list resource "trainjobs" '
            'in API group "trainer.kubeflow.org" in the namespace "ns"'
        )
        body = status_body(403, "Forbidden", message, {"group": "trainer.kubeflow.org", "kind": "trainjobs"})
        return self.add_rule(Rule(match, "status", None, 1, 403, body))

    def no_crd(self, match: Callable[[Req], bool] = wait_reads) -> Rule:
        """404 of the resource type for good (no Trainer CRD), with kube-apiserver's body."""
        body = status_body(404, "NotFound", "the server could not find the requested resource")
        return self.add_rule(Rule(match, "status", None, 1, 404, body))

    def redirect(self, match: Callable[[Req], bool] = wait_reads, times: int | None = None) -> Rule:
        return self.add_rule(Rule(match, "redirect", times))

    def inject(
        self,
        lines: list[bytes] | Callable[[int], Iterable[bytes]],
        match: Callable[[Req], bool] = trainjob_watch,
        *,
        times: int | None = 1,
        then: str = "close",
    ) -> Rule:
        gen = lines if callable(lines) else (lambda _rv, fixed=list(lines): fixed)
        return self.add_rule(Rule(match, "lines", times, lines=gen, then=then))

    def statuses(self, match: Callable[[Req], bool] = any_request) -> list[int]:
        with self.cond:
            return [status for req, status in self.requests if match(req)]

    # --- state changes ---------------------------------------------------------------------------
    def _emit(self, kind: str, obj: dict[str, Any], resource: str = "trainjobs") -> dict[str, Any]:
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("namespace", "ns")
            if resource in ("pods", "workloads"):
                kept = self.pods if resource == "pods" else self.workloads
                kept[:] = [p for p in kept if p["metadata"]["name"] != meta["name"]]
                if kind != "DELETED":
                    kept.append(obj)
            elif kind == "DELETED":
                self.store.pop((meta["namespace"], meta["name"]), None)
            else:
                self.store[(meta["namespace"], meta["name"])] = obj
            self.events.append((self.rv, kind, obj, resource))
            self.cond.notify_all()
            return obj

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Add or change a pod (seen by pod lists and pod watches)."""
        known = any(p["metadata"]["name"] == pod["metadata"]["name"] for p in self.pods)
        self._emit("MODIFIED" if known else "ADDED", pod, "pods")

    def put_workload(self, workload: dict[str, Any]) -> None:
        """Add or change a Kueue Workload (seen by Workload lists and watches)."""
        known = any(w["metadata"]["name"] == workload["metadata"]["name"] for w in self.workloads)
        self._emit("MODIFIED" if known else "ADDED", workload, "workloads")

    def delete_pod(self, name: str) -> None:
        (pod,) = [p for p in self.pods if p["metadata"]["name"] == name]
        self._emit("DELETED", pod, "pods")

    def add(self, name: str, namespace: str = "ns") -> None:
        self._emit(
            "ADDED",
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{name}",
                    "creationTimestamp": "2026-11-29T10:00:00Z",
                },
                "spec": {"runtimeRef": {"name": "torch-distributed"}},
                "status": {},
            },
        )

    def get(self, name: str, namespace: str = "ns") -> dict[str, Any] | None:
        with self.cond:
            return copy.deepcopy(self.store.get((namespace, name)))

    def set_condition(self, name: str, ctype: str, reason: str, namespace: str = "ns") -> None:
        obj = copy.deepcopy(self.store[(namespace, name)])
        obj["status"] = {
            "conditions": [
                {
                    "type": ctype,
                    "status": "True",
                    "reason": reason,
                    "message": f"{ctype} {reason}",
                    "lastTransitionTime": "2026-11-29T10:01:00Z",
                }
            ]
        }
        self._emit("MODIFIED", obj)

    def set_status(self, name: str, status: dict[str, Any], namespace: str = "ns") -> None:
        obj = copy.deepcopy(self.store[(namespace, name)])
        obj["status"] = copy.deepcopy(status)
        self._emit("MODIFIED", obj)

    def set_object(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None,
        status: dict[str, Any] | None = None,
        namespace: str = "ns",
    ) -> None:
        """Change a TrainJob's labels, annotations, spec (merged) and status (replaced) in one event."""
        obj = copy.deepcopy(self.store[(namespace, name)])
        obj["metadata"].setdefault("labels", {}).update(labels or {})
        obj["metadata"].setdefault("annotations", {}).update(annotations or {})
        obj["spec"].update(spec or {})
        if status is not None:
            obj["status"] = copy.deepcopy(status)
        self._emit("MODIFIED", obj)

    def set_running(self, name: str, namespace: str = "ns") -> None:
        self.set_status(name, {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}, namespace)

    def delete(self, name: str, namespace: str = "ns") -> None:
        self._emit("DELETED", self.store[(namespace, name)])

    def compact(self) -> None:
        with self.cond:
            self.oldest = self.rv  # a fresh list's version stays watchable

    def drop_watches(self) -> None:
        with self.cond:
            self.drop_generation += 1
            self.cond.notify_all()

    # --- HTTP ------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        return Handler


def _labels_match(selector: str | None, obj: dict[str, Any]) -> bool:
    """Equality label selectors (``a=b,c=d``), the only kind trainflow sends."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


def _selected(q: dict[str, str], obj: dict[str, Any]) -> bool:
    sel = q.get("fieldSelector")
    if sel and sel != f"metadata.name={obj['metadata']['name']}":
        return False
    return _labels_match(q.get("labelSelector"), obj)


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386)."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeApiServer
    req: Req

    def log_message(self, *args: Any) -> None:
        pass

    # --- answers ---------------------------------------------------------------------------------
    def _record(self, status: int) -> None:
        with self.server_fake.cond:
            self.server_fake.requests.append((self.req, status))

    def _json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self._record(code)

    def _status(self, code: int, reason: str, message: str | None = None, **details: Any) -> None:
        self._json(code, status_body(code, reason, message or reason, details))

    def _not_found(self, resource: str, name: str) -> None:
        group = "" if resource in ("pods", "events") else ".trainer.kubeflow.org"
        message = f'{resource}{group} "{name}" not found'
        self._status(404, "NotFound", message, name=name, kind=resource)

    def _stream(self, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")  # as kube-apiserver streams watches and logs
        self.send_header("Connection", "close")
        self.end_headers()
        self._record(200)

    def _send(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self._send(b"")
        self.close_connection = True

    # --- routing ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def _route(self, method: str) -> None:
        fake = self.server_fake
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        auth = self.headers.get("Authorization") or ""
        self.req = Req(method, url.path, q, auth[7:] if auth.startswith("Bearer ") else None)
        with fake.cond:
            rejected = fake.tokens is not None and self.req.token not in fake.tokens
            rule = None if rejected else next((r for r in fake.rules if r.take(self.req)), None)
        if rejected:
            return self._status(401, "Unauthorized", "Unauthorized")
        if rule is not None and rule.kind == "status":
            return self._json(rule.status, rule.body, rule.headers)
        if rule is not None and rule.kind == "redirect":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return self._record(302)
        if m := _TRAINJOBS.match(url.path):
            return self._trainjobs(method, m.group(1), m.group(2), q, body, rule)
        if method != "GET":
            return self._status(405, "MethodNotAllowed")
        if m := _RUNTIMES.match(url.path):
            return self._runtime(bool(m.group(1)), m.group(2))
        if m := _PODS.match(url.path):
            return self._log(q) if m.group(2) else self._pods(q)
        if url.path == WORKLOADS:
            return self._workloads(q)
        if _EVENTS.match(url.path):
            return self._json(200, {"kind": "EventList", "items": [], "metadata": {}})
        if url.path == "/version":
            return self._json(200, {"major": "1", "minor": "36", "gitVersion": "v1.36.2-fake"})
        return self._status(404, "NotFound", "the server could not find the requested resource")

    def _trainjobs(
        self, method: str, ns: str, name: str | None, q: dict[str, str], body: bytes, rule: Rule | None
    ) -> None:
        fake = self.server_fake
        if name is None and method == "GET":
            return self._watch(q, "trainjobs", ns, rule) if self.req.watch else self._list(q, ns)
        if name is None and method == "POST":
            return self._create(ns, json.loads(body), q)
        obj = fake.get(name or "", ns)
        if obj is None:
            return self._not_found("trainjobs", name or "")
        if method == "GET":
            return self._json(200, obj)
        if method == "DELETE":
            fake._emit("DELETED", obj)
            return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if method == "PATCH":
            return self._json(200, fake._emit("MODIFIED", _merge(obj, json.loads(body))))
        return self._status(405, "MethodNotAllowed")

    def _create(self, ns: str, obj: dict[str, Any], q: dict[str, str]) -> None:
        fake = self.server_fake
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = ns
        name = str(meta.get("name") or "")
        if fake.get(name, ns) is not None:
            return self._status(
                409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{name}" already exists'
            )
        meta.update(
            uid=f"uid-{name}-{next(fake._uids)}",
            generation=1,
            creationTimestamp=_stamp(time.time())[:19] + "Z",
        )
        obj.setdefault("status", {})
        if q.get("dryRun"):
            return self._json(201, obj)
        self._json(201, fake._emit("ADDED", obj))

    def _runtime(self, cluster: bool, name: str | None) -> None:
        known = self.server_fake.runtimes if cluster else {}
        if name is None:
            return self._json(200, {"kind": "List", "items": list(known.values()), "metadata": {}})
        if name not in known:
            return self._not_found("clustertrainingruntimes" if cluster else "trainingruntimes", name)
        return self._json(200, known[name])

    def _list(self, q: dict[str, str], ns: str) -> None:
        fake = self.server_fake
        with fake.cond:
            fake.list_requests += 1
            items = [o for (n, _), o in fake.store.items() if n == ns and _selected(q, o)]
            body = {"kind": "TrainJobList", "metadata": {"resourceVersion": str(fake.rv)}, "items": items}
        self._json(200, body)

    def _pods(self, q: dict[str, str]) -> None:
        fake = self.server_fake
        if self.req.watch and fake.forbid_pod_watch:
            fake.pod_watch_requests += 1
            return self._status(403, "Forbidden")
        if self.req.watch:
            return self._watch(q, "pods", "ns", None)
        with fake.cond:
            start = int(q.get("continue") or 0)
            end = start + int(q["limit"]) if "limit" in q else len(fake.pods)
            meta = {"resourceVersion": str(fake.rv)}
            if end < len(fake.pods):
                meta["continue"] = str(end)
            fake.pod_list_requests += 1
            body = {"kind": "List", "items": fake.pods[start:end], "metadata": meta}
        self._json(200, body)

    def _workloads(self, q: dict[str, str]) -> None:
        """Kueue's Workloads (v1beta2) in namespace ns: lists by label, watches."""
        fake = self.server_fake
        if self.req.watch:
            fake.workload_watches += 1
            return self._watch(q, "workloads", "ns", None)
        with fake.cond:
            fake.workload_lists.append(q.get("labelSelector", ""))
            items = [w for w in fake.workloads if _labels_match(q.get("labelSelector"), w)]
            body = {"kind": "WorkloadList", "items": items, "metadata": {"resourceVersion": str(fake.rv)}}
        self._json(200, body)

    def _log(self, q: dict[str, str]) -> None:
        """Follow: first connection sends everything then tears; the next ends with the container."""
        fake = self.server_fake
        fake.log_requests.append(q)
        follow = q.get("follow") in ("true", "True", "1")
        first = sum(1 for r in fake.log_requests if "follow" in r) == 1
        self._stream("text/plain")
        lines = list(fake.log_lines)
        if "sinceSeconds" in q:
            cutoff = time.time() - int(q["sinceSeconds"])
            lines = [entry for entry in lines if entry[0] >= cutoff]
        if "tailLines" in q:
            lines = lines[-int(q["tailLines"]) :]
        for ts, text in lines:
            self._send(f"{_stamp(ts)} {text}\n".encode())
        if not follow:
            return self._end()
        if fake.hold_follows:
            with fake.cond:
                generation = fake.drop_generation
                fake.cond.wait_for(lambda: fake.drop_generation != generation, timeout=HANG)
            return
        if first:
            self._send(b"2026-11-29T10:00")  # torn line, then the connection drops
            self.connection.shutdown(2)
            return
        now = time.time()
        fake.log_lines += [(now, "line 6"), (now + 0.001, "line 7")]
        for ts, text in fake.log_lines[-2:]:
            self._send(f"{_stamp(ts)} {text}\n".encode())
        fake.pods[0]["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0}}
        self._end()

    def _watch(self, q: dict[str, str], resource: str, ns: str, inject: Rule | None) -> None:
        fake = self.server_fake
        since = int(q.get("resourceVersion") or 0)
        seconds = float(q.get("timeoutSeconds") or 30)
        if fake.watch_seconds is not None:
            seconds = min(seconds, fake.watch_seconds)
        deadline = time.time() + seconds
        self._stream()
        trainjobs = resource == "trainjobs"  # the counters are of TrainJob watches
        with fake.cond:
            if trainjobs:
                fake.watch_requests += 1
                fake.open_watches += 1
                fake.max_open_watches = max(fake.max_open_watches, fake.open_watches)
            elif resource == "pods":
                fake.pod_watch_requests += 1
            generation = fake.drop_generation
        try:
            if inject is not None and inject.lines is not None:
                for piece in inject.lines(since):
                    self._send(piece)
                if inject.then == "close":
                    return self._end()
            if since < fake.oldest:
                self._send(error_event(410, "Expired", "too old resource version"))
                return self._end()
            sent = since
            while time.time() < deadline:
                with fake.cond:
                    pending = [e for e in fake.events if e[0] > sent and e[3] == resource]
                    sent = max([sent] + [e[0] for e in fake.events])
                    if not pending:
                        fake.cond.wait(0.2)
                    if fake.drop_generation != generation:
                        self._send(b'{"type": "MODIFIED", "obj')  # torn line, then gone
                        self.connection.shutdown(2)
                        return
                for _, kind, obj, _ in pending:
                    if obj["metadata"].get("namespace", "ns") == ns and (not trainjobs or _selected(q, obj)):
                        self._send(event_line({"type": kind, "object": obj}))
            self._end()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            with fake.cond:
                fake.open_watches -= trainjobs
            self.close_connection = True
