"""Training output in the task log: which nodes' logs to copy, the sink the wait copies them into, and status
lines. The wait itself follows the logs (trainflow.core.logsink): on the triggerer's event loop for a deferred
task, beside the wait on a worker; never a thread per task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.core.logsink import LogSink
    from trainflow.core.result import TrainJobResult
    from trainflow.core.runtimes import Runtime

LogNodes = int | Sequence[int] | str
Emit = Callable[[str], None]
NODE_STEP = re.compile(r"^node-\d+$")
DRAIN_SECONDS = 5.0  # after the job ended, how long its last lines may take to arrive


INITIALIZERS = ("dataset-initializer", "model-initializer")


def log_node_ok(n: Any) -> bool:
    """One entry of ``log_nodes``: a node index, ``"all"`` or an initializer step."""
    return (isinstance(n, int) and not isinstance(n, bool) and n >= 0) or n == "all" or n in INITIALIZERS


def initializer_steps(manifest: Mapping[str, Any], runtime: Any) -> set[str]:
    """The initializer steps the TrainJob runs: asked for in its spec, or part of its runtime."""
    asked = (manifest.get("spec") or {}).get("initializer") or {}
    out = {f"{kind}-initializer" for kind in ("dataset", "model") if asked.get(kind)}
    for step in INITIALIZERS:
        if runtime is not None and runtime.ancestor_job(step) is not None:
            out.add(step)
    return out


def node_count(manifest: Mapping[str, Any], runtime: Runtime | None) -> int:
    """How many nodes the TrainJob runs (``trainflow.core.runtimes.node_count``: its spec, else its runtime's)."""
    from trainflow.core.runtimes import node_count as nodes

    trainer = (manifest.get("spec") or {}).get("trainer") or {}
    return nodes(trainer.get("numNodes"), runtime)


def log_steps(
    log_nodes: LogNodes, nodes: int, initializers: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The steps whose logs go into the task log: initializers the job runs first, then ``node-N`` within the
    job's node count (rank 0 when none of those asked for is there)."""
    asked = [log_nodes] if isinstance(log_nodes, int | str) else list(log_nodes)
    steps = [s for s in INITIALIZERS if s in asked and s in initializers]
    for n in asked:
        for index in range(nodes) if n == "all" else [n] if isinstance(n, int) else []:
            if index < max(nodes, 1):
                steps.append(f"node-{index}")
    return list(dict.fromkeys(steps)) or ["node-0"]


def task_log_sink(emit: Callable[..., None], steps: Sequence[str], max_lines: int) -> LogSink:
    """The wait's log sink for a task log: each line prefixed ``[node-N]``."""
    from trainflow.core.logsink import LogSink

    return LogSink(lambda step, line: emit("[%s] %s", step, line), list(steps), max_lines)


class StatusLines:
    """State changes always, progress every 10 points at most: a task log is for reading."""

    def __init__(self, ref: str, emit: Callable[..., None]) -> None:
        self.ref = ref
        self.emit = emit
        self.last: tuple[str, int | None] | None = None

    def __call__(self, result: TrainJobResult) -> None:
        bucket = None if result.progress is None else result.progress // 10
        key = (result.status_text, bucket)  # a queued job's Kueue reason is news too
        if key == self.last:
            return
        self.last = key
        progress = f", progress {result.progress}%" if result.progress is not None else ""
        self.emit("TrainJob %s: %s%s", self.ref, result.status_text, progress)


def both(
    first: Callable[[TrainJobResult], None], second: Callable[[TrainJobResult], None]
) -> Callable[..., None]:
    """One ``on_update`` that calls two (the status lines, then the user's callback)."""

    def call(result: TrainJobResult) -> None:
        first(result)
        second(result)

    return call
