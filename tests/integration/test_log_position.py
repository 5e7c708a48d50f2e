"""A followed log continues where an earlier waiter stopped (``LogSink.position`` / ``start``): a waiter replaced
mid-log (a restarted triggerer) copies every line once, in order, and reads only what came after. Real local
engine jobs and their supervisors; the waiter is stopped as a triggerer's trigger is, by cancelling it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bounds import HANG
from trainflow.core.local.engine import LocalBackend
from trainflow.core.logsink import LogSink

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

LINES = 40
PRINT = f"""
import sys, time
for i in range(1, {LINES} + 1):
    print(f"line {{i}}/{LINES}", flush=True)
    time.sleep(0.05 if i % 10 else 0.5)
"""


@pytest.fixture
def backend(tests_backend: LocalBackend) -> LocalBackend:
    return tests_backend  # conftest's: a local engine of this test's own, its jobs cancelled afterwards


async def _wait_until(sink: LogSink, copied: list[str], count: int, backend: LocalBackend, ref) -> None:  # type: ignore[no-untyped-def]
    wait = asyncio.ensure_future(backend.wait_async(ref, logs=sink))
    try:
        while len(copied) < count and not wait.done():
            await asyncio.sleep(0.01)
    finally:
        wait.cancel()  # what a triggerer's shutdown does to its triggers
        await asyncio.gather(wait, return_exceptions=True)


@pytest.mark.parametrize("stops", [1, 3])
def test_a_replaced_waiter_continues_the_log_where_the_last_one_stopped(
    backend: LocalBackend, stops: int
) -> None:
    ref = backend.submit({"name": f"log-position-{stops}", "command": [sys.executable, "-c", PRINT]})
    copied: list[str] = []
    position: dict[str, dict[str, object]] = {}
    for n in range(stops):
        sink = LogSink(lambda _step, text: copied.append(text), start=position)
        asyncio.run(_wait_until(sink, copied, (n + 1) * LINES // (stops + 1), backend, ref))
        position = sink.position()
        assert position["node-0"]["lines"] == len(copied), (position, copied)
    last = LogSink(lambda _step, text: copied.append(text), start=position)
    result = backend.wait(ref, timeout=HANG, logs=last)
    assert result.succeeded, result
    assert copied == [f"line {i}/{LINES}" for i in range(1, LINES + 1)], copied
    assert last.counts["node-0"] == LINES  # the limit counts across waiters too


def test_the_line_limit_holds_across_waiters(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "log-position-limit", "command": [sys.executable, "-c", PRINT]})
    copied: list[str] = []
    first = LogSink(lambda _step, text: copied.append(text), max_lines=15)
    asyncio.run(_wait_until(first, copied, 10, backend, ref))
    second = LogSink(lambda _step, text: copied.append(text), max_lines=15, start=first.position())
    backend.wait(ref, timeout=HANG, logs=second)
    assert copied[:15] == [f"line {i}/{LINES}" for i in range(1, 16)], copied
    assert copied[15:] == ["log limit of 15 lines reached; further lines are not copied"], copied
