"""What the log followers of one event loop share: stream slots, read slots and the pace of polled reads.

An event loop streams at most ``FOLLOW_STREAMS`` logs at once, a connection each; the logs beyond are read every
``poll_interval`` on shared connections. Reads start at most ``POLLS_PER_SECOND`` a second and ``READS_AT_ONCE``
at a time, so copying logs never starves the watch that decides a wait's outcome; the last reads of ended waits
have slots of their own (``FINAL_READS_AT_ONCE``).
"""

from __future__ import annotations

import asyncio
import random
import weakref
from typing import Any

from trainflow.core.kube import calls
from trainflow.core.kube.aio import AsyncKubeApi

FOLLOW_STREAMS = 32  # logs an event loop streams at once (a connection each); the others are polled
POLL_SECONDS = 10.0  # how often a polled log is read (as KubernetesJobTrigger polls a Job)
POLLS_PER_SECOND = 20.0  # polled log reads an event loop starts a second at most
READS_AT_ONCE = 16  # followers' pod lists and polled logs in flight at once on one event loop
FINAL_READS_AT_ONCE = 16  # last reads of ended waits' logs in flight at once (apart from the polls)


class LoopState:
    """One event loop's shares: stream slots, reads in flight, last reads, and how many logs are polled now."""

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(FOLLOW_STREAMS)
        self.reads = asyncio.Semaphore(READS_AT_ONCE)
        self.finals = asyncio.Semaphore(FINAL_READS_AT_ONCE)
        self.polled = 0

    def poll_interval(self) -> float:
        """Seconds until a polled log's next read, jittered so that logs polled together spread out."""
        return poll_interval(self.polled) * random.uniform(0.8, 1.2)


def poll_interval(polled: int) -> float:
    """How often each of ``polled`` logs of one event loop is read: POLL_SECONDS, longer past POLLS_PER_SECOND."""
    return max(POLL_SECONDS, polled / POLLS_PER_SECOND)


_STATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopState] = weakref.WeakKeyDictionary()


def loop_state() -> LoopState:
    """The running event loop's ``LoopState``."""
    loop = asyncio.get_running_loop()
    state = _STATES.get(loop)
    if state is None:
        state = _STATES[loop] = LoopState()
    return state


async def read(api: AsyncKubeApi, call: calls.Call) -> Any:
    """A follower's read (a pod list, a polled log), at most READS_AT_ONCE of them in flight per event loop:
    a thousand followers asking at once would queue in httpcore's pool, whose bookkeeping costs the event loop
    time for every queued request whenever any request starts or ends (seconds, at a thousand)."""
    async with loop_state().reads:
        return await api.run(call)
