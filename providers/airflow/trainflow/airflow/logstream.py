"""Training output in the task log: which nodes' logs to copy, the threads that copy them, and status lines.

A log follow blocks for the job's whole life, so each runs on a thread of its own, never on the event loop's
default executor: a triggerer holds hundreds of waits, and a pool thread held for hours would starve every
trigger (of any provider) that hands short work to ``asyncio.to_thread``. Each thread runs in a copy of its
starter's context, where the triggerer keeps the trigger's log routing.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.core.backend import Backend
    from trainflow.core.result import JobRef, TrainJobResult

LogNodes = int | Sequence[int] | str
Emit = Callable[[str], None]
NODE_STEP = re.compile(r"^node-\d+$")
DRAIN_SECONDS = 5.0  # after the job ended, how long its last lines may take to arrive


def check_log_nodes(log_nodes: Any) -> None:
    """At DAG parse: ``log_nodes`` is a node index, a list of them, or ``"all"``."""

    def index(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and n >= 0

    if log_nodes == "all" or index(log_nodes):
        return
    if isinstance(log_nodes, list | tuple) and log_nodes and all(index(n) for n in log_nodes):
        return
    raise ValueError(f"log_nodes={log_nodes!r}: use a node index (0 = rank 0), a list of them, or 'all'")


def node_count(manifest: Mapping[str, Any], runtime_policy: Mapping[str, Any] | None) -> int:
    """How many nodes the TrainJob runs: its spec, else its runtime's default, else 1."""
    trainer = (manifest.get("spec") or {}).get("trainer") or {}
    count = trainer.get("numNodes") or (runtime_policy or {}).get("numNodes") or 1
    return int(count)


def log_steps(log_nodes: LogNodes, nodes: int) -> list[str]:
    """The steps whose logs go into the task log (``node-N``), within the job's node count."""
    if log_nodes == "all":
        wanted = list(range(nodes))
    elif isinstance(log_nodes, int):
        wanted = [log_nodes]
    else:
        wanted = [int(n) for n in log_nodes]
    return [f"node-{n}" for n in dict.fromkeys(wanted) if n < max(nodes, 1)] or ["node-0"]


def pump_logs(
    backend: Backend,
    ref: JobRef,
    emit: Emit,
    *,
    step: str = "node-0",
    max_lines: int = 1000,
    stop: threading.Event | None = None,
    attempts: int = 30,
) -> int:
    """Copy a step's log into ``emit`` as it is written: incremental, at most ``max_lines`` lines.

    Waits for the step to start (its log may not exist yet) and reconnects after drops, skipping the
    lines it already copied, so nothing is replayed in bulk.
    """
    seen = 0
    for _ in range(attempts):
        if stop is not None and stop.is_set():
            break
        try:
            count = 0
            for line in backend.logs(ref, follow=True, step=step):
                count += 1
                if count <= seen:
                    continue
                seen = count
                if seen > max_lines:
                    emit(f"[{step}] log limit of {max_lines} lines reached; further lines are not copied")
                    return seen
                emit(f"[{step}] {line.rstrip()}")
                if stop is not None and stop.is_set():
                    return seen
            try:
                if backend.get(ref).state.terminal:
                    return seen
            except Exception:
                return seen
        except Exception:
            pass  # step not started yet or stream dropped: retry below
        if stop is not None:
            if stop.wait(2.0):
                break
        else:
            time.sleep(2.0)
    return seen


class LogPumps:
    """One thread per followed step, in a copy of the starter's context; stopped and drained as one."""

    def __init__(
        self, backend: Backend, ref: JobRef, steps: Sequence[str], emit: Emit, max_lines: int
    ) -> None:
        self.stop_event = threading.Event()
        self.threads = [
            threading.Thread(
                target=contextvars.copy_context().run,
                args=(pump_logs, backend, ref, emit),
                kwargs={"step": step, "max_lines": max_lines, "stop": self.stop_event},
                name=f"trainjob-logs-{ref.name}-{step}",
                daemon=True,
            )
            for step in steps
        ]

    def start(self) -> LogPumps:
        for thread in self.threads:
            thread.start()
        return self

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def stop(self) -> None:
        self.stop_event.set()

    def join(self, timeout: float = DRAIN_SECONDS) -> None:
        """Let the last lines arrive (bounded), then stop."""
        end = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))
        self.stop()

    async def drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """``join`` for an event loop: waits without blocking it or any executor thread."""
        end = time.monotonic() + timeout
        while self.alive() and time.monotonic() < end:
            await asyncio.sleep(0.1)
        self.stop()


class StatusLines:
    """State changes always, progress every 10 points at most: a task log is for reading."""

    def __init__(self, ref: str, emit: Callable[..., None]) -> None:
        self.ref = ref
        self.emit = emit
        self.last: tuple[str, int | None] | None = None

    def __call__(self, result: TrainJobResult) -> None:
        bucket = None if result.progress is None else result.progress // 10
        key = (result.state.value, bucket)
        if key == self.last:
            return
        self.last = key
        progress = f", progress {result.progress}%" if result.progress is not None else ""
        self.emit("TrainJob %s: %s%s", self.ref, result.state.value, progress)
