"""Where a wait copies training output as it is written: the steps to follow, and what to do with each line.

Every backend's wait follows the steps of a ``LogSink`` beside the wait itself (tasks on the wait's event loop
on a cluster, file reads between looks on the local engine): no thread per followed log, and the lines stop
when the wait ends (after a short drain for the last ones).

A sink also says where each log got to (``position``: the backend's own cursor per step, and the lines copied),
and continues from such a position when given one (``start``): a waiter that is replaced mid-log (a triggerer
restarted) copies each line once, and reads only what was written after that point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DRAIN_SECONDS = 5.0  # after the job ended, how long its last lines may go without a new one before they stop


@dataclass
class LogSink:
    """``emit(step, line)`` for each line of each step in ``steps``, at most ``max_lines`` per step (then one
    line saying so). An ``emit`` that raises is not called again for that step; the wait goes on."""

    emit: Callable[[str, str], None]
    steps: Sequence[str] = ("node-0",)
    max_lines: int = 1000
    counts: dict[str, int] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    start: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cursors: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)

    def resume(self, step: str, cursor: Callable[[], dict[str, Any]]) -> Mapping[str, Any]:
        """A backend starts following ``step``: ``cursor()`` will say where it got to (JSON). Returns where to
        continue (the saved position, its line count restored; {} for the start of the log)."""
        self.cursors[step] = cursor
        saved = self.start.get(step) or {}
        lines = saved.get("lines")
        if isinstance(lines, int) and step not in self.counts:
            self.counts[step] = lines
            if lines > self.max_lines:  # the limit was reached, and said, before
                self.broken.add(step)
        return saved

    def position(self) -> dict[str, dict[str, Any]]:
        """Where each followed step's log got to: what ``start`` takes to continue after the last copied line."""
        return {
            step: {**cursor(), "lines": self.counts.get(step, 0)} for step, cursor in self.cursors.items()
        }

    def line(self, step: str, text: str) -> bool:
        """Copy one line; False once this step needs no more lines (its limit reached, or ``emit`` failed)."""
        if step in self.broken:
            return False
        count = self.counts.get(step, 0) + 1
        self.counts[step] = count
        if count > self.max_lines:
            self._emit(step, f"log limit of {self.max_lines} lines reached; further lines are not copied")
            self.broken.add(step)
            return False
        return self._emit(step, text.rstrip("\r\n"))

    def note(self, step: str, text: str) -> None:
        """A line about the log itself (a pod that never started), not counted against the limit."""
        self._emit(step, text)

    def _emit(self, step: str, text: str) -> bool:
        try:
            self.emit(step, text)
        except Exception:
            self.broken.add(step)
            return False
        return True
