"""Issue 11.8: the CLI reads KUBECONFIG as kubectl does, speaks CLI in its errors, and fails fast off-line.

Each case runs the ``trainflow`` command as a separate process against loopback sockets only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bounds import HANG

EXE = Path(sys.executable).parent / "trainflow"


def run(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(EXE), "--backend", "kubernetes", *args],
        capture_output=True,
        text=True,
        timeout=HANG,
        env={**clean, **env},
    )
    return proc, time.monotonic() - t0


def split_kubeconfig(tmp_path: Path, server: str) -> str:
    """Cluster and user in one file, the context in another: only a merged read finds the server."""
    first, second = tmp_path / "clusters.yaml", tmp_path / "contexts.yaml"
    first.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
            }
        )
    )
    second.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "contexts": [
                    {"name": "split", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "split",
            }
        )
    )
    return f"{first}{os.pathsep}{second}"


class LoopbackServer:
    """A loopback port that accepts connections and then stays silent or hangs up; counts the connections."""

    def __init__(self, hang_up: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.hang_up, self.accepted, self.held = hang_up, 0, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.sock.accept()[0]
            except OSError:
                continue
            self.accepted += 1
            if self.hang_up:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture(params=["silent", "hang-up"])
def unanswering(request: pytest.FixtureRequest) -> Iterator[LoopbackServer]:
    server = LoopbackServer(hang_up=request.param == "hang-up")
    yield server
    server.close()


def test_errors_speak_cli_not_python_keywords(tmp_path: Path) -> None:
    proc, _ = run({"KUBECONFIG": str(tmp_path / "missing")}, "list")
    assert proc.returncode != 0 and "no kubeconfig found" in proc.stderr
    for python_only in ("kubeconfig=", "config_dict=", "in_cluster=True"):
        assert python_only not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unanswering_server_fails_after_one_attempt_naming_it(
    tmp_path: Path, unanswering: LoopbackServer
) -> None:
    """One probe with a 5 s timeout instead of the retry loop (11 s of silent retries before)."""
    server = f"https://127.0.0.1:{unanswering.port}"
    proc, elapsed = run({"KUBECONFIG": split_kubeconfig(tmp_path, server)}, "list")
    assert proc.returncode != 0
    assert f"cannot reach the Kubernetes API server at {server} (context split)" in proc.stderr
    assert unanswering.accepted == 1
    assert elapsed < HANG  # a hang detector (the probe's 5 s plus process start-up), not a speed target
