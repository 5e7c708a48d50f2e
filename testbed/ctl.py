"""Fault helpers for a running testbed (reliability tests): restart a component, compact etcd.

    python testbed/ctl.py restart kube-apiserver [--down SECONDS]   # SIGKILL, wait, start again, wait /readyz
    python testbed/ctl.py compact-etcd                               # compact etcd to its current revision

Uses the instance in ``--dir`` / ``TRAINFLOW_TESTBED_DIR``; the component is started again with the argv and
the instance tag ``testbed.py up`` used, so ``down`` still stops it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESTARTABLE = ("kube-apiserver",)  # argv recorded in logs/<name>.cmd has no empty or spaced arguments


def _testbed() -> Any:
    """The testbed's helpers (``toolkit``), from the modules beside this file."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import toolkit

    return toolkit


def restart(run_dir: str, name: str, down: float = 0.0, timeout: float = 240.0) -> dict[str, float]:
    """SIGKILL the component's process group, keep it down ``down`` s, start it again; wait until ready."""
    if name not in RESTARTABLE:
        raise SystemExit(f"restart supports {RESTARTABLE}, not {name!r}")
    tb = _testbed()
    L = tb.Layout(run_dir)
    state = json.loads(L.state_file.read_text())
    argv = (L.logs / f"{name}.cmd").read_text().split()
    pid = tb.pid_of(L, name)
    t0 = time.time()
    if pid and tb.running(L, name):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        while tb.alive(pid):
            time.sleep(0.05)
    killed = time.time()
    time.sleep(down)
    tb.start(L, name, argv)
    port = state["ports"]["apiserver"]
    ssl_ctx = tb.admin_ssl(L)
    deadline = time.time() + timeout
    while not _ok(tb, f"https://127.0.0.1:{port}/readyz", ssl_ctx):
        if time.time() > deadline:
            raise SystemExit(f"{name} not ready {timeout}s after restart")
        time.sleep(0.2)
    ready = time.time()
    return {"kill_seconds": killed - t0, "down_seconds": ready - killed}


def _ok(tb: Any, url: str, ctx: Any) -> bool:
    try:
        return bool(tb.http_ok(url, ctx))
    except OSError:
        return False


def _etcd(run_dir: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    state = json.loads((Path(run_dir) / "state.json").read_text())
    req = urllib.request.Request(
        f"http://127.0.0.1:{state['ports']['etcd']}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def compact_etcd(run_dir: str) -> int:
    """Compact etcd's history up to its current revision (watchers from older revisions get 410 Gone)."""
    rev = int(_etcd(run_dir, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    _etcd(run_dir, "/v3/kv/compaction", {"revision": str(rev), "physical": True})
    return rev


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["restart", "compact-etcd"])
    ap.add_argument("component", nargs="?")
    ap.add_argument("--dir", default=os.environ.get("TRAINFLOW_TESTBED_DIR", "/tmp/trainflow-testbed"))
    ap.add_argument("--down", type=float, default=0.0)
    a = ap.parse_args()
    if a.command == "restart":
        print(json.dumps(restart(a.dir, a.component or "", a.down)))
    else:
        print(json.dumps({"compacted_to": compact_etcd(a.dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
