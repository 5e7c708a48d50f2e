"""A loopback HTTP proxy in front of the testbed's S3 store that fails chosen requests: the real store and the
real client, with a fault where a network or a store would put one (a 503 answer, or a connection cut in the
middle of a request body). Requests pass unchanged (the Host header too, so SigV4 signatures still verify).

It runs in a process of its own: OpenDAL's blocking lister holds the GIL while it waits for an answer, so a
proxy thread in the client's process could never answer it.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class Rule:
    """Fail every request whose method and path+query match: ``503`` answers SlowDown (which the client retries
    a bounded number of times, then reports); ``cut`` reads ``after`` bytes of the body and drops the connection."""

    method: str
    path: str  # a regex searched in path?query
    action: str = "503"
    after: int = 0


@dataclass
class FaultProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)
    log: Path = Path("/dev/null")  # one line per request: "<method> <target>", "FAULT " first when failed
    endpoint: str = ""

    def match(self, method: str, target: str) -> Rule | None:
        rule = next((r for r in self.rules if r.method == method and re.search(r.path, target)), None)
        with self.log.open("a") as out:
            out.write(f"{'FAULT ' if rule else ''}{method} {target}\n")
        return rule

    @property
    def seen(self) -> list[str]:
        return self.log.read_text().splitlines()

    @property
    def faults(self) -> int:
        return sum(1 for line in self.seen if line.startswith("FAULT "))


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>injected</Message></Error>'
)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _relay(self) -> None:
            method, target = self.command, self.path
            length = int(self.headers.get("Content-Length") or 0)
            assert "chunked" not in (self.headers.get("Transfer-Encoding") or ""), "chunked body: not relayed"
            rule = proxy.match(method, target)
            if rule is not None and rule.action == "cut":
                self.rfile.read(min(rule.after, length))
                self.close_connection = True
                self.connection.shutdown(2)
                return
            body = self.rfile.read(length) if length else b""
            if rule is not None:
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.send_header("Connection", "close")  # a fault ends its connection: none is reused after
                self.end_headers()
                self.wfile.write(SLOW_DOWN)
                self.close_connection = True
                return
            conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status)
            for key, value in resp.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    return Handler


@contextmanager
def fault_proxy(upstream: str, *rules: Rule) -> Iterator[FaultProxy]:
    """A proxy process to ``upstream`` (the store's endpoint URL) on a free loopback port."""
    log = Path(tempfile.mkstemp(prefix="s3faults-", suffix=".log")[1])
    proc = subprocess.Popen(
        [sys.executable, __file__, upstream, json.dumps([asdict(r) for r in rules]), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield FaultProxy(upstream, list(rules), log, f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink(missing_ok=True)


def serve(upstream: str, rules: list[Rule], log: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(FaultProxy(upstream, rules, log)))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], [Rule(**r) for r in json.loads(sys.argv[2])], Path(sys.argv[3]))
