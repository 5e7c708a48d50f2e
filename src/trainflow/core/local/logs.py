"""Log files of a local job: which file holds a step's log, and following it while the job runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainflow.core.errors import CorruptState, InvalidRequest, TrainJobNotFound
from trainflow.core.local import store
from trainflow.core.logsink import LogSink


def log_path(job: store.JobDir, ref: str, step: str) -> Path:
    """The log file of ``step`` (``node-N``, an initializer, ``supervisor``); MPI rank 0 is the launcher."""
    try:
        plan = store.read_json(job.plan)
    except ValueError as exc:
        raise CorruptState(f"the local state of this job is corrupt ({job.plan}: {str(exc)[:200]})") from None
    if not isinstance(plan, dict):
        namespace, _, name = ref.partition("/")
        raise TrainJobNotFound(namespace, name)
    run_step = str(plan.get("step", "node"))
    nodes = int(plan.get("launched_nodes", 1))
    steps = [f"node-{i}" for i in range(nodes)] if run_step == "node" else [run_step]
    steps += [str(i["step"]) for i in plan.get("initializers") or []] + ["supervisor"]
    if step == "node-0" and run_step != "node":
        step = run_step
    if step not in steps:
        raise InvalidRequest.one(
            "step", f"{step!r} is not a step of {ref}", f"use one of: {', '.join(steps)}"
        )
    return job.log(step)


def read_all(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []


def follow(path: Path, tail: int | None, done: Callable[[], bool], poll: float) -> Iterator[str]:
    """Yield lines as they are written until ``done()`` (the job ended or is gone) and the log is drained."""
    fh = None
    buffer = b""
    try:
        while fh is None:
            try:
                fh = open(path, "rb")  # noqa: SIM115 - closed in finally
            except FileNotFoundError:
                if done():
                    return
                time.sleep(poll)
        if tail is not None:
            lines = store.tail_lines(path, tail)
            fh.seek(0, os.SEEK_END)
            yield from lines
        while True:
            chunk = fh.read(65536)
            if chunk:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield line.decode("utf-8", errors="replace")
                continue
            if done():
                buffer += fh.read()
                for line in buffer.split(b"\n"):
                    if line:
                        yield line.decode("utf-8", errors="replace")
                return
            time.sleep(poll)
    finally:
        if fh is not None:
            fh.close()


class Tails:
    """The log files of a wait's ``LogSink`` steps, read from where the last look stopped: the local engine's
    log following, done between the wait's looks (no thread, no open file between looks)."""

    def __init__(self, job: store.JobDir, ref: str, sink: LogSink) -> None:
        self.sink = sink
        self.paths: dict[str, Path] = {}
        for step in sink.steps:
            try:
                self.paths[step] = log_path(job, ref, step)
            except (InvalidRequest, CorruptState, TrainJobNotFound):
                continue
        self.offsets = dict.fromkeys(self.paths, 0)  # read up to
        self.copied = dict.fromkeys(
            self.paths, 0
        )  # the end of the last line copied: where a restart continues
        self.partial = dict.fromkeys(self.paths, b"")
        for step in self.paths:
            saved = sink.resume(step, self._cursor(step))
            if isinstance(saved.get("offset"), int) and saved["offset"] >= 0:
                self.offsets[step] = self.copied[step] = saved["offset"]

    def _cursor(self, step: str) -> Callable[[], dict[str, Any]]:
        return lambda: {"offset": self.copied[step]}

    def pump(self, final: bool = False) -> None:
        """Copy the complete lines written since the last look (``final``: the last line too)."""
        for step, path in self.paths.items():
            if step in self.sink.broken:
                continue
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[step])
                    data = fh.read(1 << 20)
            except FileNotFoundError:
                continue
            self.offsets[step] += len(data)
            *complete, rest = (self.partial[step] + data).split(b"\n")
            self.partial[step] = rest
            ends = [len(line) + 1 for line in complete]  # bytes each copied line moves the position on
            if final and rest:
                complete.append(rest)
                ends.append(len(rest))
                self.partial[step] = b""
            for line, size in zip(complete, ends, strict=True):
                self.copied[step] += size
                if not self.sink.line(step, line.decode("utf-8", errors="replace")):
                    break
