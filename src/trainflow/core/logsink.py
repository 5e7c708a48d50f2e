"""Where a wait copies training output as it is written: the steps to follow, and what to do with each line.

Every backend's wait follows the steps of a ``LogSink`` beside the wait itself (tasks on the wait's event loop
on a cluster, file reads between looks on the local engine): no thread per followed log, and the lines stop
when the wait ends (after a short drain for the last ones).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DRAIN_SECONDS = 5.0  # after the job ended, how long its last lines may take to arrive


@dataclass
class LogSink:
    """``emit(step, line)`` for each line of each step in ``steps``, at most ``max_lines`` per step (then one
    line saying so). An ``emit`` that raises is not called again for that step; the wait goes on."""

    emit: Callable[[str, str], None]
    steps: Sequence[str] = ("node-0",)
    max_lines: int = 1000
    counts: dict[str, int] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

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
