"""Waiting for readiness: poll a check with a deadline while watching the processes it depends on."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from layout import Layout, TestbedError
from procs import running


def wait_for(
    desc: str,
    fn: Callable[[], Any],
    timeout: float,
    interval: float = 0.5,
    watch: list[str] | None = None,
    L: Layout | None = None,
) -> Any:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        if watch and L is not None:
            for name in watch:
                if not running(L, name):
                    raise TestbedError(f"{name} exited while waiting for {desc}")
        try:
            r = fn()
            if r:
                return r
            last = r
        except Exception as e:
            last = e
        time.sleep(interval)
    raise TestbedError(f"timed out after {timeout:.0f}s waiting for {desc} (last: {last!r})")


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def admin_ssl(L: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(L.pki / "ca.crt"))
    ctx.load_cert_chain(str(L.pki / "admin.crt"), str(L.pki / "admin.key"))
    return ctx


def insecure_ssl() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
