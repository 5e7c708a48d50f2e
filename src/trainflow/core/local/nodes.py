"""One local node of a job: the process running the trainer command, its log, its exit as the Trainer reports it."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
from typing import IO, Any

from trainflow.core.local import store

LOG_MAX_ENV = "TRAINFLOW_LOCAL_LOG_MAX_BYTES"


class LogCopier(threading.Thread):
    """Copies a node's output (a pipe) into its log up to ``cap`` bytes, notes the cut, then discards the rest.

    A write error (a full disk) stops the writing, never the node: the pipe is drained to the end.
    """

    def __init__(self, source: IO[bytes], log: IO[bytes], cap: int) -> None:
        super().__init__(name="trainflow-log", daemon=True)
        self.source, self.log, self.cap = source, log, cap
        self.error: OSError | None = None

    def _write(self, data: bytes) -> bool:
        try:
            self.log.write(data)
            return True
        except OSError as exc:
            self.error = exc
            return False

    def run(self) -> None:
        written, writing = self.log.tell(), True
        try:
            while chunk := os.read(self.source.fileno(), 65536):
                if not writing:
                    continue
                piece = chunk[: max(self.cap - written, 0)]
                writing = self._write(piece)
                written += len(piece)
                if writing and written >= self.cap:
                    self._write(
                        f"\n[trainflow: log truncated at {self.cap} bytes ({LOG_MAX_ENV})]\n".encode()
                    )
                    writing = False
        finally:
            for fh in (self.source, self.log):
                with contextlib.suppress(OSError):
                    fh.close()


class Node:
    """One local node: a process running the trainer command, its log, its exit."""

    def __init__(
        self, index: int, step: str, proc: subprocess.Popen[bytes], log: IO[bytes], log_cap: int
    ) -> None:
        self.index = index
        self.step = step
        self.proc = proc
        self.log = log
        self.start_time = store.proc_start_time(proc.pid)
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stopped = False  # stopped by the engine (cancel, fail-fast, deadline), not failed by itself
        self.copier: LogCopier | None = None
        if proc.stdout is not None:
            self.copier = LogCopier(proc.stdout, log, log_cap)
            self.copier.start()

    @property
    def log_error_no_space(self) -> bool:
        error = self.copier.error if self.copier is not None else None
        return error is not None and error.errno in (errno.ENOSPC, errno.EDQUOT)

    def poll(self) -> int | None:
        if self.exit_code is None:
            code = self.proc.poll()
            if code is not None:
                self.signal = -code if code < 0 else None
                self.exit_code = 128 + self.signal if self.signal else code
                if self.copier is not None:
                    self.copier.join(timeout=0.5)  # its last words reach the log before anyone reads it
                else:
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


def jobs_status(plan: dict[str, Any], nodes: list[Node], *, suspended: bool = False) -> list[dict[str, Any]]:
    """``status.jobsStatus`` in the Trainer's shape: initializers done, then the trainer step's nodes."""
    step = str(plan.get("step", "node"))
    active = sum(1 for n in nodes if n.exit_code is None)
    succeeded = sum(1 for n in nodes if n.exit_code == 0)
    failed = sum(1 for n in nodes if n.exit_code not in (None, 0) and not n.stopped)
    out = [
        {"name": i["step"], "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}
        for i in plan.get("initializers") or []
    ]
    out.append(
        {
            "name": step,
            "active": active,
            "ready": active,
            "succeeded": succeeded,
            "failed": failed,
            "suspended": 1 if suspended else 0,
        }
    )
    return out
