"""The shared watch's registry and the line splitter, at the interleavings and sizes that broke them.

The end-to-end faults (403/404 on the first list, 401s, ERROR events, malformed lines) run through the public
waits in tests/reliability/test_watch_faults.py; here are the two things a public wait cannot force: a waiter
subscribing while the last waiter tears the watch down, and the cost of a line far over the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import AsyncIterator
from typing import Any

from bounds import HANG
from trainflow.core.kube import calls
from trainflow.core.kube.lines import MAX_LINE, LineBuffer
from trainflow.core.kube.shared_watch import WatchRegistry


class StubResponse:
    """A watch response that stays open until closed, then ends."""

    def __init__(self, lines: list[bytes], closed: asyncio.Event) -> None:
        self.lines, self.closed = lines, closed
        self.content = self

    async def iter_any(self) -> AsyncIterator[bytes]:
        for line in self.lines:
            yield line + b"\n"
        await self.closed.wait()

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self.iter_any()

    async def aclose(self) -> None:
        pass

    async def aread(self) -> bytes:
        return json.dumps(self.body).encode()


class StubTransport:
    """Answers lists with one TrainJob and watches with an open stream; counts what it was asked."""

    cluster = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = asyncio.Event()
        self.asked: list[str] = []

    async def send(self, call: calls.Call) -> Any:
        self.asked.append(f"{call.verb} {call.resource}")
        if call.verb == "watch":
            return StubResponse([], self.closed)
        resp = StubResponse([], self.closed)
        if call.resource == "pods":
            resp.body = {"metadata": {"resourceVersion": "1"}, "items": []}
        else:
            job = {"metadata": {"name": self.name, "namespace": "ns", "resourceVersion": "1"}, "status": {}}
            resp.body = {"metadata": {"resourceVersion": "1"}, "items": [job]}
        return resp


async def test_a_waiter_subscribing_during_teardown_starts_a_new_watch() -> None:
    """Forced interleaving: the last waiter of watch 1 leaves, and while watch 1's connection is still closing
    (its transport's exit is held open), a new waiter subscribes. It must get a new watch, and its news."""
    registry = WatchRegistry()
    release_exit = asyncio.Event()
    exits_entered = asyncio.Event()
    transports: list[StubTransport] = []

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[StubTransport]:
        transport = StubTransport("job")
        transports.append(transport)
        try:
            yield transport
        finally:
            if len(transports) == 1:  # watch 1 only: hold its teardown until the test says so
                exits_entered.set()
                await release_exit.wait()

    key = ("id", "ns", None)
    first_done = asyncio.Event()
    watches: list[Any] = []

    async def first_waiter() -> None:
        async with registry.subscribe(key, connect, "job") as box:
            watches.append(box.watch)
            update = await registry.next_update(box, HANG)
            assert update is not None and update.obj is not None
        first_done.set()

    first = asyncio.create_task(first_waiter())
    await asyncio.wait_for(exits_entered.wait(), HANG)  # watch 1 is inside its teardown now
    assert not first_done.is_set()
    async with registry.subscribe(key, connect, "job") as box:
        assert box.watch is not watches[0] and watches[0].closing  # a new watch, not the one being torn down
        update = await registry.next_update(box, HANG)
        assert update is not None and update.obj is not None and update.obj["metadata"]["name"] == "job"
        assert len(transports) == 2
        release_exit.set()
        await asyncio.wait_for(first, HANG)
    assert registry.active_watches == 0


def test_a_line_far_over_the_cap_costs_bounded_memory_and_linear_time() -> None:
    """A 64 MiB line (fed in 64 KiB chunks, as a socket delivers it) is dropped and counted; the events around
    it still come out; peak memory grows by far less than the line; the time is linear (no ``buf += chunk``)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lines = LineBuffer()
    out: list[bytes] = []
    chunk = b"x" * 65536
    started = time.process_time()  # this process's CPU time: what the buffering costs, not the machine's load
    out += lines.feed(b'{"type":"ADDED"}\n')
    for _ in range(1024):  # 64 MiB
        out += lines.feed(chunk)
    out += lines.feed(b'\n{"type":"MODIFIED"}\n')
    took = time.process_time() - started
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert out == [b'{"type":"ADDED"}', b'{"type":"MODIFIED"}']
    assert lines.oversized == 1
    assert grown_mib < 2 * MAX_LINE / (1 << 20) + 8, grown_mib
    assert took < 5.0, took  # quadratic buffering took seconds of CPU for this; linear takes milliseconds


def test_lines_split_across_chunks_and_a_last_line_without_newline() -> None:
    lines = LineBuffer(cap=16)
    assert list(lines.feed(b"ab")) == []
    assert list(lines.feed(b"c\nde")) == [b"abc"]
    assert list(lines.feed(b"f\n" + b"y" * 20 + b"\nz")) == [b"def"]
    assert lines.oversized == 1
    assert lines.flush() == b"z"
