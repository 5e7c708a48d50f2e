"""Every ``report()`` of a local job, in order: ``reports.jsonl`` in its directory (``store.append_line``), one
JSON object a line (the merged report state after that report, as ``metrics.json`` holds it). Waiters replay it into their history, so
a local history misses no report however fast they come, and a waiter that attaches late sees them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainflow.core.local import store
from trainflow.core.observe import Waiter, record

REPORTS_FILE = store.REPORTS_FILE
MAX_READ_BYTES = 256 * 1024  # per look while the job runs: a late waiter catches up without a long stall


class Cursor:
    """Reads the reports appended since the last read; ``last`` is the newest one read so far."""

    def __init__(self, jobdir: Path) -> None:
        self.path = jobdir / REPORTS_FILE
        self.offset = 0
        self.last: dict[str, Any] | None = None

    def read(self, limit: int | None = MAX_READ_BYTES) -> list[dict[str, Any]]:
        """Whole lines appended since the last call (at most ``limit`` bytes of them; None: all)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(limit) if limit is not None else fh.read()
                if limit is not None and len(data) == limit and b"\n" not in data:
                    data += fh.readline()  # one line longer than the limit: read it whole
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                item = json.loads(raw)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
        if out:
            self.last = out[-1]
        return out


def replay(cursor: Cursor, waiter: Waiter, obj: dict[str, Any], now: float) -> None:
    """Put the reports made since the last look into the waiter's history one by one, and the newest into
    ``obj`` as its trainerStatus (what ``observe`` then reads); a finished job's are all read at once."""
    new = cursor.read(None if store.is_terminal(obj) else MAX_READ_BYTES)
    for line in new[:-1]:
        record(waiter, store.trainer_status(line), now)
    if cursor.last is not None:
        obj.setdefault("status", {})["trainerStatus"] = store.trainer_status(cursor.last)
