"""Exec-plugin credentials under load and rejection (issue 19), as client-go handles them.

Against the loopback API server (tests/unit/fake_apiserver.py), with a kubeconfig whose user is an exec
plugin (tests/e2e/credential_helpers.py) that counts its runs in a file:

- after the token expired, 30 concurrent requests (async: 30 waiters in 30 namespaces, so 30 shared watches;
  sync: 30 threads reading a job) run the plugin once: one refresh, the others wait for it (client-go's mutex);
- a 401 (the server stopped accepting the token mid-wait) leads to exactly one refresh and a retry, on the
  sync and the async path, and the wait still ends Complete.

Run (no testbed needed, about 15 s):

    uv run --frozen --extra dev --no-sync pytest tests/reliability/test_credential_refresh.py
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from credential_helpers import ExecPlugin, exec_plugin, write_kubeconfig
from fake_apiserver import FakeApiServer, when

from trainflow.core import get_backend
from trainflow.core.result import JobState

pytestmark = pytest.mark.timeout(120)

PREFIX = "canary-exec-3b9e41"
LIFETIME = 4.0  # seconds: the first token's expirationTimestamp (whole seconds, so 3-4 s in effect)
# the refreshed token's: it outlives the burst of requests at any load, so a second refresh in the burst can
# only be a refresh that was not shared (with 4 s, a burst slowed past 4 s at load 17 rightly refreshed again)
LATER_LIFETIME = 3600.0
BOUND = 30.0
CONCURRENT = 30


@pytest.fixture
def fake():
    server = FakeApiServer()
    yield server
    server.close()


def plugin_backend(fake: FakeApiServer, tmp_path: Path, lifetime: float | None) -> tuple[Any, ExecPlugin]:
    later = LATER_LIFETIME if lifetime is not None else None
    plugin = exec_plugin(tmp_path / "plugin", prefix=PREFIX, lifetime=lifetime, later_lifetime=later)
    config = write_kubeconfig(tmp_path / "kubeconfig", fake.url, {"exec": plugin.entry}, namespace="ns")
    return get_backend("kubernetes", kubeconfig=str(config), namespace="ns"), plugin


def complete(fake: FakeApiServer, name: str, namespace: str = "ns") -> None:
    fake.add(name, namespace)
    fake.set_condition(name, "Complete", "AllJobsCompleted", namespace)


def test_concurrent_async_requests_after_expiry_run_the_plugin_once(fake, tmp_path):
    namespaces = [f"ns{i}" for i in range(CONCURRENT)]
    for ns in namespaces:
        complete(fake, "a", ns)
    backend, plugin = plugin_backend(fake, tmp_path, LIFETIME)

    async def scenario() -> list[Any]:
        first = await backend.wait_async("ns0/a", timeout=BOUND)
        assert first.state is JobState.COMPLETE
        assert plugin.runs() == 1, f"the first wait ran the plugin {plugin.runs()} times"
        await asyncio.sleep(max(0.0, plugin.run_times()[0] + LIFETIME + 0.5 - time.time()))  # expired
        waits = [backend.wait_async(f"{ns}/a", timeout=BOUND) for ns in namespaces]
        return await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), BOUND)

    try:
        results = asyncio.run(scenario())
    finally:
        backend.close()
    assert [getattr(r, "state", r) for r in results] == [JobState.COMPLETE] * CONCURRENT, results
    assert plugin.runs() == 2, (
        f"{CONCURRENT} concurrent requests after expiry ran the plugin {plugin.runs() - 1} times (client-go: once)"
    )


def test_concurrent_sync_requests_after_expiry_run_the_plugin_once(fake, tmp_path):
    complete(fake, "a")
    backend, plugin = plugin_backend(fake, tmp_path, LIFETIME)
    try:
        assert backend.get("a").state is JobState.COMPLETE
        assert plugin.runs() == 1, f"the first read ran the plugin {plugin.runs()} times"
        time.sleep(max(0.0, plugin.run_times()[0] + LIFETIME + 0.5 - time.time()))
        results: list[Any] = []
        start = threading.Barrier(CONCURRENT)

        def read() -> None:
            start.wait()
            try:
                results.append(backend.get("a").state)
            except Exception as exc:
                results.append(exc)

        threads = [threading.Thread(target=read, daemon=True) for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
        assert not any(t.is_alive() for t in threads), f"reads had no outcome within {BOUND:.0f}s"
    finally:
        backend.close()
    assert results == [JobState.COMPLETE] * CONCURRENT, results
    assert plugin.runs() == 2, (
        f"{CONCURRENT} concurrent reads after expiry ran the plugin {plugin.runs() - 1} times (client-go: once)"
    )


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_401_refreshes_the_credential_once_and_retries(fake, tmp_path, path):
    """The token is revoked mid-wait (the server accepts only the plugin's next one) and the watch drops:
    the next request gets 401, the plugin runs once more, the request is retried, the wait goes on."""
    fake.add("a")
    fake.set_running("a")
    fake.tokens = {f"{PREFIX}-1"}
    backend, plugin = plugin_backend(fake, tmp_path, None)  # no expiry: only the 401 can cause a refresh

    def revoke() -> None:
        fake.tokens = {f"{PREFIX}-2"}
        fake.drop_watches()

    when(lambda: fake.open_watches and plugin.runs() == 1, (revoke,))
    refused_then_ok = lambda: 401 in fake.statuses() and fake.open_watches  # noqa: E731
    when(refused_then_ok, (fake.set_condition, "a", "Complete", "AllJobsCompleted"))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            if path == "sync":
                outcome["result"] = backend.wait("a", timeout=BOUND - 5)
            else:
                outcome["result"] = asyncio.run(backend.wait_async("a", timeout=BOUND - 5))
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    backend.close()
    assert not thread.is_alive(), f"the {path} wait had no outcome within {BOUND:.0f}s"
    assert "error" not in outcome, f"{type(outcome['error']).__name__}: {outcome['error']}"
    assert outcome["result"].state is JobState.COMPLETE
    assert fake.statuses().count(401) >= 1, "the revoked token was never refused: the test proved nothing"
    assert plugin.runs() == 2, f"a 401 ran the plugin {plugin.runs() - 1} times (one refresh expected)"


def test_a_401_on_a_read_refreshes_once_and_retries_it(fake, tmp_path):
    """The sync client's plain reads: a 401 refreshes the credential and the same read succeeds."""
    complete(fake, "a")
    fake.tokens = {f"{PREFIX}-1"}
    backend, plugin = plugin_backend(fake, tmp_path, None)
    try:
        assert backend.get("a").state is JobState.COMPLETE
        fake.tokens = {f"{PREFIX}-2"}
        assert backend.get("a").state is JobState.COMPLETE
    finally:
        backend.close()
    assert fake.statuses().count(401) == 1
    assert plugin.runs() == 2
