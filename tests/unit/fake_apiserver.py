"""A tiny Kubernetes API server on loopback for the watch tests (development aid, not the real proof).

It speaks just enough of the list/watch protocol over real HTTP (so urllib3 and aiohttp, the real
kubernetes/kubernetes_asyncio clients and our retry code all run): resourceVersions, field selectors, 410 for
compacted versions, dropped connections, pod lists and followed logs. The real proof is tests/e2e.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def kubeconfig(url: str) -> dict[str, Any]:
    """An inline kubeconfig for the fake (namespace ``ns``, a bearer token)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "ns"}}],
        "current-context": "fake",
    }


BASE = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs"


class FakeApiServer:
    def __init__(self) -> None:
        self.rv = 0
        self.oldest = 0  # watches from a version below this get 410
        self.objects: dict[str, dict[str, Any]] = {}
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
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        with self.cond:
            self.drop_generation += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- state changes ---------------------------------------------------------------------------
    def _emit(self, kind: str, obj: dict[str, Any], resource: str = "trainjobs") -> None:
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            if resource == "pods":
                self.pods = [p for p in self.pods if p["metadata"]["name"] != obj["metadata"]["name"]]
                if kind != "DELETED":
                    self.pods.append(obj)
            elif kind == "DELETED":
                self.objects.pop(obj["metadata"]["name"], None)
            else:
                self.objects[obj["metadata"]["name"]] = obj
            self.events.append((self.rv, kind, obj, resource))
            self.cond.notify_all()

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Add or change a pod (seen by pod lists and pod watches)."""
        known = any(p["metadata"]["name"] == pod["metadata"]["name"] for p in self.pods)
        self._emit("MODIFIED" if known else "ADDED", pod, "pods")

    def delete_pod(self, name: str) -> None:
        (pod,) = [p for p in self.pods if p["metadata"]["name"] == name]
        self._emit("DELETED", pod, "pods")

    def add(self, name: str) -> None:
        self._emit(
            "ADDED",
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "uid": f"uid-{name}",
                    "creationTimestamp": "2026-11-29T10:00:00Z",
                },
                "spec": {"runtimeRef": {"name": "torch-distributed"}},
                "status": {},
            },
        )

    def set_condition(self, name: str, ctype: str, reason: str) -> None:
        obj = copy.deepcopy(self.objects[name])
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

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        obj = copy.deepcopy(self.objects[name])
        obj["status"] = copy.deepcopy(status)
        self._emit("MODIFIED", obj)

    def set_running(self, name: str) -> None:
        obj = copy.deepcopy(self.objects[name])
        obj["status"] = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}
        self._emit("MODIFIED", obj)

    def delete(self, name: str) -> None:
        self._emit("DELETED", self.objects[name])

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

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str) -> None:
                self._json(
                    code,
                    {
                        "kind": "Status",
                        "status": "Failure",
                        "reason": reason,
                        "code": code,
                        "message": reason,
                    },
                )

            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                watch = q.get("watch") in ("true", "True", "1")
                if url.path == BASE:
                    return self._watch(q, "trainjobs") if watch else self._list(q)
                if url.path.startswith(BASE + "/"):
                    name = url.path[len(BASE) + 1 :]
                    with fake.cond:
                        obj = fake.objects.get(name)
                    return self._json(200, obj) if obj else self._status(404, "NotFound")
                if url.path == "/api/v1/namespaces/ns/pods":
                    if watch and fake.forbid_pod_watch:
                        fake.pod_watch_requests += 1
                        return self._status(403, "Forbidden")
                    if watch:
                        return self._watch(q, "pods")
                    with fake.cond:
                        start = int(q.get("continue") or 0)
                        end = start + int(q["limit"]) if "limit" in q else len(fake.pods)
                        meta = {"resourceVersion": str(fake.rv)}
                        if end < len(fake.pods):
                            meta["continue"] = str(end)
                        fake.pod_list_requests += 1
                        body = {"kind": "List", "items": fake.pods[start:end], "metadata": meta}
                    return self._json(200, body)
                if url.path == "/api/v1/namespaces/ns/events":
                    return self._json(200, {"kind": "List", "items": [], "metadata": {}})
                if url.path.startswith("/api/v1/namespaces/ns/pods/") and url.path.endswith("/log"):
                    return self._log(q)
                return self._status(404, "NotFound")

            def _log(self, q: dict[str, str]) -> None:
                """Follow: first connection sends everything then tears; the next ends with the container."""
                fake.log_requests.append(q)
                follow = q.get("follow") in ("true", "True", "1")
                first = sum(1 for r in fake.log_requests if "follow" in r) == 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()

                def send(data: bytes) -> None:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                lines = list(fake.log_lines)
                if "sinceSeconds" in q:
                    cutoff = time.time() - int(q["sinceSeconds"])
                    lines = [entry for entry in lines if entry[0] >= cutoff]
                if "tailLines" in q:
                    lines = lines[-int(q["tailLines"]) :]
                for ts, text in lines:
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z"
                    send(f"{stamp} {text}\n".encode())
                if not follow:
                    send(b"")
                    self.close_connection = True
                    return
                if first:
                    send(b"2026-11-29T10:00")  # torn line, then the connection drops
                    self.connection.shutdown(2)
                    return
                now = time.time()
                fake.log_lines += [(now, "line 6"), (now + 0.001, "line 7")]
                for ts, text in fake.log_lines[-2:]:
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e9):09d}Z"
                    send(f"{stamp} {text}\n".encode())
                fake.pods[0]["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0}}
                send(b"")
                self.close_connection = True

            def _selected(self, q: dict[str, str], obj: dict[str, Any]) -> bool:
                sel = q.get("fieldSelector")
                return not sel or sel == f"metadata.name={obj['metadata']['name']}"

            def _list(self, q: dict[str, str]) -> None:
                with fake.cond:
                    fake.list_requests += 1
                    items = [o for o in fake.objects.values() if self._selected(q, o)]
                    body = {
                        "kind": "TrainJobList",
                        "metadata": {"resourceVersion": str(fake.rv)},
                        "items": items,
                    }
                self._json(200, body)

            def _watch(self, q: dict[str, str], resource: str) -> None:
                since = int(q.get("resourceVersion") or 0)
                deadline = time.time() + int(q.get("timeoutSeconds") or 30)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")  # as kube-apiserver streams watches
                self.send_header("Connection", "close")
                self.end_headers()

                def send(data: bytes) -> None:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                trainjobs = resource == "trainjobs"  # the counters are of TrainJob watches
                with fake.cond:
                    if trainjobs:
                        fake.watch_requests += 1
                        fake.open_watches += 1
                        fake.max_open_watches = max(fake.max_open_watches, fake.open_watches)
                    else:
                        fake.pod_watch_requests += 1
                    generation = fake.drop_generation
                try:
                    if since < fake.oldest:
                        err = {
                            "type": "ERROR",
                            "object": {
                                "kind": "Status",
                                "code": 410,
                                "reason": "Expired",
                                "message": "too old resource version",
                            },
                        }
                        send(json.dumps(err).encode() + b"\n")
                        send(b"")
                        return
                    sent = since
                    while time.time() < deadline:
                        with fake.cond:
                            pending = [e for e in fake.events if e[0] > sent and e[3] == resource]
                            sent = max([sent] + [e[0] for e in fake.events])
                            if not pending:
                                fake.cond.wait(0.2)
                            if fake.drop_generation != generation:
                                send(b'{"type": "MODIFIED", "obj')  # torn line, then gone
                                self.connection.shutdown(2)
                                return
                        for _, kind, obj, _ in pending:
                            if not trainjobs or self._selected(q, obj):
                                send(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                    send(b"")
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
                finally:
                    with fake.cond:
                        fake.open_watches -= trainjobs
                    self.close_connection = True

        return Handler
