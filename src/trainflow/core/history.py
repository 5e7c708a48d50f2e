"""A TrainJob's metrics history: each distinct report (time, progress, ETA, numeric metrics), bounded.

Bound and downsampling (``MAX_POINTS`` = 256): while a job has made at most 256 reports, every one is kept.
When a 257th would be kept, every other kept report is dropped and from then on one report in 2 is kept (then
1 in 4, 1 in 8, ...), so the kept reports stay evenly spread over the job's reports (not over its time). The
latest report is always kept as well: a history holds the first report, the latest, and at most 257 in all
(at least 129 once downsampling started). At most ``MAX_SERIES`` = 16 metric names are recorded (the first
seen); values that are not numbers are not recorded (the result's ``metrics`` keeps their latest value).

Columns of machine floats, shared between a recorder and the views it hands out (a view is a prefix of the
arrays plus the latest report, so handing one out copies nothing). At the bound a job of three metrics costs a
waiter about 13 KiB and 15 KiB of JSON; sixteen series of long names, 51 KiB of JSON (docs/history.md).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

MAX_POINTS = 256
MAX_SERIES = 16
_FIXED = 3  # time, progress, ETA: then one value per series


class HistoryPoint(NamedTuple):
    """One report: epoch seconds, progress 0-100, estimated seconds remaining, numeric metrics."""

    time: float
    progress: int | None
    eta_seconds: float | None
    metrics: dict[str, float]


def finite(value: Any) -> float | None:
    """A finite number as a float, else None (JSON has no NaN; a missing value and a NaN loss both chart as a gap)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _short(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else value


class History:
    """An immutable view of a history (``result.history``): iterate for ``HistoryPoint``s, or read columns."""

    __slots__ = ("_data", "_n", "_names", "_tail", "seen", "stride")

    def __init__(
        self,
        data: array[float],
        names: tuple[str, ...],
        n: int,
        tail: HistoryPoint | None,
        seen: int,
        stride: int,
    ) -> None:
        self._data, self._names, self._n, self._tail = data, names, n, tail
        self.seen = seen  # reports recorded in all, kept or not
        self.stride = stride  # one report in ``stride`` is kept (the latest always)

    def __len__(self) -> int:
        return self._n + (self._tail is not None)

    def __iter__(self) -> Iterator[HistoryPoint]:
        for i in range(self._n):
            yield self._point(i)
        if self._tail is not None:
            yield self._tail

    def _point(self, i: int) -> HistoryPoint:
        width = _FIXED + len(self._names)
        row = self._data[i * width : (i + 1) * width]
        metrics = {k: v for k, v in zip(self._names, row[_FIXED:], strict=True) if not math.isnan(v)}
        progress = _opt(row[1])
        return HistoryPoint(row[0], None if progress is None else int(progress), _opt(row[2]), metrics)

    @property
    def latest(self) -> HistoryPoint | None:
        if self._tail is not None:
            return self._tail
        return self._point(self._n - 1) if self._n else None

    def names(self) -> list[str]:
        """The recorded metric names, in the order they were first reported."""
        return list(self._names)

    def times(self) -> list[float]:
        return [p.time for p in self]

    def progress(self) -> list[int | None]:
        return [p.progress for p in self]

    def eta(self) -> list[float | None]:
        return [p.eta_seconds for p in self]

    def series(self, name: str) -> list[float | None]:
        """One metric's values, None where a report lacked it."""
        return [p.metrics.get(name) for p in self]

    def to_dict(self) -> dict[str, Any]:
        """Columns as JSON: ``time`` (epoch seconds, ms), ``progress``, ``eta_seconds``, ``metrics`` by name
        (6 significant digits: a chart's precision; the result's ``metrics`` has the latest values exactly)."""
        points = list(self)
        return {
            "time": [round(p.time, 3) for p in points],
            "progress": [p.progress for p in points],
            "eta_seconds": [None if p.eta_seconds is None else round(p.eta_seconds) for p in points],
            "metrics": {name: [_short(p.metrics.get(name)) for p in points] for name in self._names},
            "seen": self.seen,
            "stride": self.stride,
        }

    @classmethod
    def from_dict(cls, data: Any) -> History:
        """The inverse of ``to_dict``; anything malformed (an older or foreign payload) gives what is readable."""
        if not isinstance(data, Mapping) or not isinstance(data.get("time"), list):
            return EMPTY
        times = [t for t in data["time"] if finite(t) is not None]
        if len(times) != len(data["time"]):
            return EMPTY
        count = len(times)

        def column(raw: Any) -> list[Any]:
            values = raw if isinstance(raw, list) and len(raw) == count else [None] * count
            return [finite(v) for v in values]

        raw_metrics = data.get("metrics")
        items = list(raw_metrics.items())[:MAX_SERIES] if isinstance(raw_metrics, Mapping) else []
        metrics = {str(k): column(v) for k, v in items}
        progress, eta = column(data.get("progress")), column(data.get("eta_seconds"))
        rec = Recorder()
        keep = rec.append if count <= MAX_POINTS + 1 else rec.add  # never more than the bound
        for i, t in enumerate(times):
            p = progress[i]
            keep(
                HistoryPoint(
                    float(t),
                    int(p) if p is not None and 0 <= p <= 100 else None,
                    eta[i],
                    {k: v[i] for k, v in metrics.items() if v[i] is not None},
                )
            )
        seen, stride = data.get("seen"), data.get("stride")
        rec.seen = seen if isinstance(seen, int) and seen >= rec.seen else max(rec.seen, count)
        rec.stride = stride if isinstance(stride, int) and stride >= rec.stride else rec.stride
        return rec.view()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, History) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:  # immutable: a frozen result holding it may be hashed
        return hash((len(self), self.seen, self.stride))

    def __repr__(self) -> str:
        names = ", ".join(self._names) or "no metrics"
        return f"History({len(self)} points of {self.seen} reports; {names})"


class Recorder:
    """Builds a history report by report (a waiter owns one); ``view()`` is an O(1) immutable snapshot.

    One array of rows (time, progress, ETA, one value per series; NaN where there is none), appended to in
    place: a view reads only its first rows. Halving and a new series build a new array, so views handed out
    earlier keep theirs. The latest report off the stride is held apart (``tail``), never written in place."""

    __slots__ = ("_data", "_n", "_names", "_tail", "_view", "seen", "stride")

    def __init__(self) -> None:
        self._data: array[float] = array("d")
        self._names: tuple[str, ...] = ()
        self._n = 0
        self._tail: HistoryPoint | None = None
        self.seen = 0
        self.stride = 1
        self._view: History | None = None

    def add(self, point: HistoryPoint) -> None:
        """Record one report: kept if its number falls on the stride, else it is the latest until the next."""
        self._view = None
        index, self.seen = self.seen, self.seen + 1
        if index % self.stride:
            self._tail = point
            return
        self._tail = None
        self.append(point)
        if self._n > MAX_POINTS:
            self._halve()

    def append(self, point: HistoryPoint) -> None:
        """Keep ``point`` as the next row (``add`` decides which reports get here)."""
        self._view = None
        new = tuple(k for k in point.metrics if k not in self._names)[: MAX_SERIES - len(self._names)]
        if new:
            self._widen(new)
        nan = math.nan
        self._data.extend(
            (
                point.time,
                nan if point.progress is None else point.progress,
                nan if point.eta_seconds is None else point.eta_seconds,
                *(point.metrics.get(name, nan) for name in self._names),
            )
        )
        self._n += 1

    def _rows(self, step: int = 1) -> Iterator[array[float]]:
        width = _FIXED + len(self._names)
        for i in range(0, self._n, step):
            yield self._data[i * width : (i + 1) * width]

    def _widen(self, names: tuple[str, ...]) -> None:
        """New series: a new array with a NaN column each for the rows so far."""
        pad = array("d", [math.nan]) * len(names)
        data = array("d")
        for row in self._rows():
            data.extend(row)
            data.extend(pad)
        self._data, self._names = data, self._names + names

    def _halve(self) -> None:
        """Keep every other row, in a new array."""
        data = array("d")
        for row in self._rows(2):
            data.extend(row)
        self._data, self._n = data, (self._n + 1) // 2
        self.stride *= 2

    def view(self) -> History:
        if self._view is None:
            self._view = History(self._data, self._names, self._n, self._tail, self.seen, self.stride)
        return self._view


EMPTY = Recorder().view()
