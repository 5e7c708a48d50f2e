"""One local node of a job: the process running the trainer command, its log, its exit as the Trainer reports it."""

from __future__ import annotations

import signal
import subprocess
from typing import IO, Any

from trainflow.core.local import store


class Node:
    """One local node: a process running the trainer command, its log, its exit."""

    def __init__(self, index: int, step: str, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.index = index
        self.step = step
        self.proc = proc
        self.log = log
        self.start_time = store.proc_start_time(proc.pid)
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stopped = False  # stopped by the engine (cancel, fail-fast, deadline), not failed by itself

    def poll(self) -> int | None:
        if self.exit_code is None:
            code = self.proc.poll()
            if code is not None:
                self.signal = -code if code < 0 else None
                self.exit_code = 128 + self.signal if self.signal else code
                self.log.close()
        return self.exit_code

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.index,
            "step": f"{self.step}-{self.index}" if self.step == "node" else self.step,
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "start_time": self.start_time,
            "exit_code": self.exit_code,
        }
        if self.signal:
            out["signal"] = signal.Signals(self.signal).name
        if self.stopped:
            out["stopped"] = True
        return out
