"""Splitting a byte stream into lines, in linear time and bounded memory (watch events, followed logs).

A line longer than the cap is dropped whole, and counted, rather than buffered: a watch event is bounded by
the API server's object size limit (about 1.5 MiB in etcd), so a longer line is garbage or an attack.
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_LINE = 4 << 20


class LineBuffer:
    """Feed chunks, get complete lines (without the newline). ``oversized`` counts the lines dropped."""

    def __init__(self, cap: int = MAX_LINE) -> None:
        self.cap = cap
        self._buf = bytearray()
        self._skipping = False
        self.oversized = 0

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._keep(chunk[start:])
                return
            piece = chunk[start:end]
            start = end + 1
            if self._skipping:
                self._skipping = False
                continue
            if len(self._buf) + len(piece) > self.cap:
                self._buf.clear()
                self.oversized += 1
                continue
            if self._buf:
                self._buf += piece
                line = bytes(self._buf)
                self._buf.clear()
                yield line
            else:
                yield bytes(piece)

    def _keep(self, rest: bytes) -> None:
        if self._skipping or not rest:
            return
        if len(self._buf) + len(rest) > self.cap:
            self._buf.clear()
            self._skipping = True
            self.oversized += 1
            return
        self._buf += rest

    def flush(self) -> bytes | None:
        """What is left after the stream ended (a last line without a newline), if any."""
        if self._skipping or not self._buf:
            return None
        line = bytes(self._buf)
        self._buf.clear()
        return line
