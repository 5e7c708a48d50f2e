"""How log following shares one event loop with the waits (kube/logfollow.py): polls are paced, and an ended
wait's last read never queues behind them. Unit tests of those two rules; the whole follower against a
loopback API server is in test_kube_watch_loopback.py, at scale in benchmarks/triggerer_scale.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from bounds import HANG
from trainflow.core.kube import follow_pace, logfollow
from trainflow.core.kube.logs import Resume, StepTarget
from trainflow.core.logsink import LogSink

TARGET = StepTarget("node-0", "jobset=j", "node")


class OneLine:
    """An API whose every call answers one timestamped log line."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, call: Any) -> httpx.Response:
        self.calls += 1
        return httpx.Response(200, content=b"2026-12-03T11:00:00.000000000Z last words\n")


def test_poll_interval_grows_past_the_loops_poll_budget() -> None:
    async def intervals(polled: int) -> list[float]:
        state = follow_pace.loop_state()
        state.polled = polled
        return [state.poll_interval() for _ in range(200)]

    few = asyncio.run(intervals(10))
    assert min(few) >= follow_pace.POLL_SECONDS * 0.8 and max(few) <= follow_pace.POLL_SECONDS * 1.2
    many = asyncio.run(intervals(1000))
    expected = 1000 / follow_pace.POLLS_PER_SECOND
    assert expected > follow_pace.POLL_SECONDS
    assert min(many) >= expected * 0.8 and max(many) <= expected * 1.2


def test_last_read_of_an_ended_wait_does_not_queue_behind_the_polls() -> None:
    """Every poll slot taken (a thousand polled logs): the final read still runs, and copies its line."""

    async def scenario() -> tuple[bool, list[str], bool]:
        state = follow_pace.loop_state()
        for _ in range(follow_pace.READS_AT_ONCE):
            await state.reads.acquire()
        lines: list[str] = []
        sink = LogSink(lambda step, text: lines.append(text))
        api: Any = OneLine()
        final = await asyncio.wait_for(
            logfollow._read_since(api, "ns", "pod", TARGET, sink, Resume(), True),
            HANG,
        )
        poll = asyncio.ensure_future(logfollow._read_since(api, "ns", "pod", TARGET, sink, Resume(), False))
        await asyncio.sleep(0.2)
        queued = not poll.done()
        poll.cancel()
        return final, lines, queued

    final, lines, queued = asyncio.run(scenario())
    assert final and lines == ["last words"]
    assert queued  # a poll does wait for a slot
