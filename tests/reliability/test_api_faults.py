"""Case 1: API faults while waiting — every waiter (sync ``wait`` and async ``wait_async``) reports the right
terminal state exactly once, within its deadline, and nothing is submitted twice.

Faults: kube-apiserver SIGKILLed and restarted mid-wait (testbed/ctl.py); etcd compacted + API server restart
so watches resume from a compacted resourceVersion (410 Gone); 429 + Retry-After, connection resets (before
the request reaches the server and after it answered) and added latency from tests/reliability/faultproxy.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultProxy

from conftest import held_request, trainjobs
from trainflow.core.kube.backend import KubernetesBackend
from trainflow.core.kube.shared_watch import registry
from trainflow.core.result import JobState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("TRAINFLOW_RELIABILITY_OUT", "/tmp/trainflow-reliability"))
DEADLINE = 240.0


def record(name: str, data: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))
    print(f"\n{name}: {json.dumps(data, default=str)}")


def ctl(testbed: Any, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "testbed" / "ctl.py"), *args, "--dir", str(testbed.dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


class Waiters:
    """N sync waiters (threads) and N async waiters (one event loop thread) on the same jobs."""

    def __init__(self, backend: KubernetesBackend, refs: list[Any]) -> None:
        self.backend, self.refs = backend, refs
        self.results: dict[str, Any] = {}
        self.terminal_updates: dict[str, int] = {}
        self.errors: dict[str, BaseException] = {}
        self.elapsed: dict[str, float] = {}
        self.async_stats: Any = None
        self.threads: list[threading.Thread] = []

    def _counter(self, key: str):
        self.terminal_updates[key] = 0

        def on_update(result: Any) -> None:
            if result.state.terminal:
                self.terminal_updates[key] += 1

        return on_update

    def start(self) -> Waiters:
        t0 = time.time()
        for ref in self.refs:
            key = f"sync:{ref.name}"

            def run(ref: Any = ref, key: str = key) -> None:
                try:
                    self.results[key] = self.backend.wait(ref, timeout=DEADLINE, on_update=self._counter(key))
                except BaseException as exc:
                    self.errors[key] = exc
                self.elapsed[key] = time.time() - t0

            self.threads.append(threading.Thread(target=run, daemon=True))

        async def async_all() -> None:
            async def one(ref: Any) -> None:
                key = f"async:{ref.name}"
                try:
                    self.results[key] = await self.backend.wait_async(
                        ref, timeout=DEADLINE, on_update=self._counter(key)
                    )
                except BaseException as exc:
                    self.errors[key] = exc
                self.elapsed[key] = time.time() - t0

            tasks = [asyncio.create_task(one(r)) for r in self.refs]
            await asyncio.sleep(1)
            await asyncio.gather(*tasks)
            self.async_stats = registry().stats(self.backend.watch_key(self.refs[0].namespace))

        self.threads.append(threading.Thread(target=lambda: asyncio.run(async_all()), daemon=True))
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self.threads:
            t.join(DEADLINE + 60)
        assert not any(t.is_alive() for t in self.threads), "a waiter never returned"

    def check(self, expected: JobState = JobState.COMPLETE) -> None:
        assert not self.errors, {k: repr(v) for k, v in self.errors.items()}
        assert len(self.results) == 2 * len(self.refs)
        assert {k: r.state for k, r in self.results.items()} == {k: expected for k in self.results}
        assert set(self.terminal_updates.values()) == {1}, self.terminal_updates
        assert max(self.elapsed.values()) < DEADLINE


def _submit(backend: KubernetesBackend, prefix: str, n: int, seconds: int) -> list[Any]:
    return [backend.submit(held_request(f"rel/{prefix}-{i}", seconds)) for i in range(n)]


def test_apiserver_killed_and_restarted_mid_wait(testbed, k8s, namespace, kube_backend) -> None:
    refs = _submit(kube_backend, "restart", 3, 20)
    waiters = Waiters(kube_backend, refs).start()
    time.sleep(4)
    restart = ctl(testbed, "restart", "kube-apiserver", "--down", "5")
    waiters.join()
    waiters.check()
    # retried submits after the outage adopt: still exactly one TrainJob per key
    again = _submit(kube_backend, "restart", 3, 20)
    assert [r.name for r in again] == [r.name for r in refs]
    assert len(trainjobs(k8s, namespace)) == 3
    record(
        "api_restart",
        {
            "restart": restart,
            "elapsed": waiters.elapsed,
            "sync_stats": vars(kube_backend.last_wait_stats),
            "async_stats": vars(waiters.async_stats) if waiters.async_stats else None,
        },
    )


def test_etcd_compaction_makes_watches_resume_with_410(testbed, k8s, namespace, kube_backend) -> None:
    # 60 s: the jobs must still run when the compaction and the restart are done (at load 10-13 a 25 s job
    # ended first, so no watch had to resume and no 410 was seen)
    refs = _submit(kube_backend, "gone", 2, 60)
    waiters = Waiters(kube_backend, refs).start()
    time.sleep(4)
    # churn so the watchers' resourceVersion is history, then compact it away and drop the watch cache
    for i in range(30):
        k8s.core.create_namespaced_config_map(namespace, {"metadata": {"name": f"churn-{i}"}})
    compacted = ctl(testbed, "compact-etcd")
    restart = ctl(testbed, "restart", "kube-apiserver", "--down", "1")
    waiters.join()
    waiters.check()
    sync_stats = kube_backend.last_wait_stats
    assert len(trainjobs(k8s, namespace)) == 2
    record(
        "api_410",
        {
            "compacted": compacted,
            "restart": restart,
            "sync_stats(last waiter)": vars(sync_stats),
            "async_stats": vars(waiters.async_stats),
            "elapsed": waiters.elapsed,
        },
    )
    assert sync_stats.relists_410 + waiters.async_stats.relists_410 >= 1, (
        "no 410 was seen: fault not injected"
    )


@pytest.fixture
def proxy(testbed):
    p = FaultProxy(
        upstream=testbed.server,
        ca=testbed.dir / "pki" / "ca.crt",
        cert=testbed.dir / "pki" / "admin.crt",
        key=testbed.dir / "pki" / "admin.key",
    ).start()
    yield p
    p.stop()


@pytest.fixture
def proxied(proxy, namespace):
    b = KubernetesBackend(config_dict=proxy.kubeconfig(namespace), namespace=namespace)
    yield b
    b.close()


def _trainjob_reads(method: str, path: str) -> bool:
    return method == "GET" and "/trainjobs" in path


def test_429_with_retry_after_is_honoured(k8s, namespace, proxy, proxied) -> None:
    # create: a 429 means the server did not take the request, so trainflow may POST again
    proxy.fail(2, 429, retry_after=1, match=lambda m, p: m == "POST" and "/trainjobs" in p)
    t0 = time.time()
    refs = _submit(proxied, "429", 2, 10)
    submit_seconds = time.time() - t0
    assert len(trainjobs(k8s, namespace)) == 2
    assert (
        proxy.counts["POST trainjobs"] - proxy.injected["429 POST trainjobs"] == 2
    )  # one POST reached the server per job
    # reads: 3 x 429 with Retry-After 2 -> a get takes >= 6 s, then succeeds
    proxy.fail(3, 429, retry_after=2, match=_trainjob_reads)
    t0 = time.time()
    proxied.get(refs[0])
    get_seconds = time.time() - t0
    assert get_seconds >= 5.5, get_seconds
    # waiters: every watch open / list / get answered 429 a few times while waiting
    proxy.fail(8, 429, retry_after=1, match=_trainjob_reads)
    waiters = Waiters(proxied, refs).start()
    waiters.join()
    waiters.check()
    record(
        "api_429",
        {
            "submit_seconds_with_2x429": submit_seconds,
            "get_seconds_with_3x429_retry_after_2": get_seconds,
            "injected": dict(proxy.injected),
            "requests": dict(proxy.counts),
            "elapsed": waiters.elapsed,
        },
    )


def test_connection_resets_and_latency(k8s, namespace, proxy, proxied) -> None:
    proxy.latency = 0.2
    # the create's answer is lost after the server made the job: trainflow must adopt, not create twice
    proxy.reset(1, match=lambda m, p: m == "POST" and "/trainjobs" in p, after_forward=True)
    # the next requests never reach the server
    proxy.reset(2, match=lambda m, p: m == "POST" and "/trainjobs" in p)
    refs = _submit(proxied, "reset", 3, 15)
    assert len(trainjobs(k8s, namespace)) == 3
    proxy.reset(4, match=_trainjob_reads)
    waiters = Waiters(proxied, refs).start()
    cuts = 0
    while any(t.is_alive() for t in waiters.threads):
        time.sleep(3)
        cuts += proxy.cut_streams()
    waiters.join()
    waiters.check()
    assert len(trainjobs(k8s, namespace)) == 3
    record(
        "api_resets",
        {
            "latency_s": 0.2,
            "stream_cuts": cuts,
            "injected": dict(proxy.injected),
            "requests": dict(proxy.counts),
            "elapsed": waiters.elapsed,
            "sync_stats(last waiter)": vars(proxied.last_wait_stats),
            "async_stats": vars(waiters.async_stats),
        },
    )
    assert cuts >= 2
