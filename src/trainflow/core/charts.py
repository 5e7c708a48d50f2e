"""Charts of a metrics history as SVG text, drawn here in Python: no script, no style or font fetched from
anywhere, so a chart works in an air-gapped KFP UI, an Airflow page and a file alike.

One panel per series (progress first, then each metric): x is the time since the first report, y the value,
on a log scale when every value is positive and they span 100x or more (a loss curve). Each run of reported
values is one ``<polyline>`` (a report lacking the metric leaves a gap), so a browser's
``polyline.points.numberOfItems`` summed over a panel is the number of points drawn; the panel's ``<g>``
carries ``data-series`` and ``data-points`` for tools.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from trainflow.core.history import History

WIDTH, HEIGHT = 460, 210
LEFT, RIGHT, TOP, BOTTOM = 58, 26, 30, 34
COLORS = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7f8f", "#57606a")
MARKERS_UP_TO = 64  # points drawn as dots too, when there are few
PROGRESS = "progress"


def duration(seconds: float) -> str:
    """``42s``, ``3m 20s``, ``5m``, ``1h 5m``, ``2d 3h``: a short human duration (two units at most)."""
    s = max(0, round(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            rest = s % size // sub_size
            return f"{s // size}{unit}" + (f" {rest}{sub}" if rest else "")
    return f"{s}s"


def number(value: float) -> str:
    """A value as a chart labels it: 4 significant digits."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


def _nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def linear_ticks(low: float, high: float, target: int = 4) -> tuple[float, float, list[float]]:
    """A range widened to round numbers and the ticks in it."""
    if high <= low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = _nice_step(high - low, target)
    start, end = math.floor(low / step) * step, math.ceil(high / step) * step
    count = round((end - start) / step)
    return start, end, [start + i * step for i in range(count + 1)]


def time_ticks(span: float) -> tuple[float, list[float]]:
    """Ticks of elapsed seconds at round durations; returns the axis end and the ticks."""
    span = max(span, 1.0)
    steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    step = next((s for s in steps if span / s <= 5), 86400 * math.ceil(span / 86400 / 5))
    end = math.ceil(span / step) * step
    return end, [i * step for i in range(round(end / step) + 1)]


def _segments(xs: Sequence[float], ys: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys, strict=True):
        if y is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((x, y))
    return [r for r in runs if r]


def panel(
    title: str, xs: Sequence[float], ys: Sequence[float | None], color: str, *, percent: bool = False
) -> str:
    """One chart: ``xs`` seconds since the first report, ``ys`` values (None: not reported)."""
    values = [y for y in ys if y is not None]
    shown = sum(1 for y in ys if y is not None)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    log = not percent and bool(values) and min(values) > 0 and max(values) / min(values) >= 100
    if percent:
        low, high, yticks = 0.0, 100.0, [0.0, 25.0, 50.0, 75.0, 100.0]
    elif log:
        low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        yticks = [float(e) for e in range(int(low), int(high) + 1)]
        if len(yticks) > 7:
            yticks = yticks[:: math.ceil(len(yticks) / 6)]
    else:
        low, high, yticks = linear_ticks(min(values, default=0.0), max(values, default=1.0))
    xend, xticks = time_ticks(max(xs, default=0.0))

    def sx(x: float) -> float:
        return LEFT + pw * x / xend

    def sy(y: float) -> float:
        v = math.log10(y) if log else y
        return TOP + ph * (1 - (v - low) / ((high - low) or 1.0))

    latest = next((y for y in reversed(ys) if y is not None), None)
    head = (
        f"{title}: {number(latest) + (' %' if percent else '')}"
        if latest is not None
        else f"{title}: no data"
    )
    label = f"{title}, {shown} points" + (", log scale" if log else "")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tf-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(label)}" '
        f'font-family="system-ui, sans-serif" font-size="11">',
        f"<title>{escape(label)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="600" fill="#1f2328">{escape(head)}</text>',
    ]
    if log:
        out.append(f'<text x="{WIDTH - RIGHT}" y="18" text-anchor="end" fill="#656d76">log scale</text>')
    for t in yticks:
        y = TOP + ph * (1 - (t - low) / ((high - low) or 1.0))
        text = f"{t:.0f} %" if percent else (number(10**t) if log else number(t))
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d8dee4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#656d76">{text}</text>')
    for t in xticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + ph}" y2="{TOP + ph + 4}" stroke="#8c959f"/>')
        out.append(
            f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle" fill="#656d76">{duration(t)}</text>'
        )
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#8c959f"/>')
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 4}" text-anchor="middle" fill="#656d76">time since first report</text>'
    )
    out.append(f'<g class="tf-series" data-series="{escape(title)}" data-points="{shown}">')
    for run in _segments(xs, ys):
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in run)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        if shown <= MARKERS_UP_TO or len(run) == 1:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.4" fill="{color}"/>' for x, y in run]
    out.append("</g>")
    if not values:
        out.append(
            f'<text x="{LEFT + pw / 2}" y="{TOP + ph / 2}" text-anchor="middle" fill="#656d76">no reports yet</text>'
        )
    out.append("</svg>")
    return "".join(out)


def panels(history: History, metrics: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(series name, SVG) for progress (when reported) and each metric (``metrics`` chooses and orders them)."""
    points = list(history)
    if not points:
        return []
    t0 = points[0].time
    xs = [p.time - t0 for p in points]
    out: list[tuple[str, str]] = []
    progress = [None if p.progress is None else float(p.progress) for p in points]
    if any(v is not None for v in progress) and (metrics is None or PROGRESS in metrics):
        out.append((PROGRESS, panel(PROGRESS, xs, progress, COLORS[0], percent=True)))
    names = [n for n in (metrics or history.names()) if n in history.names()]
    for i, name in enumerate(names):
        ys = [p.metrics.get(name) for p in points]
        out.append((name, panel(name, xs, ys, COLORS[(i + 1) % len(COLORS)])))
    return out


def document(history: History, title: str, metrics: Sequence[str] | None = None, columns: int = 2) -> str:
    """Every panel in one standalone SVG file (a grid of ``columns``), for ``trainflow chart``."""
    charts = panels(history, metrics)
    rows = max(1, math.ceil(len(charts) / columns))
    width, height = WIDTH * min(columns, max(1, len(charts))), HEIGHT * rows + 28
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" font-family="system-ui, sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="19" font-size="14" font-weight="600" fill="#1f2328">{escape(title)}</text>',
    ]
    if not charts:
        out.append('<text x="8" y="48" font-size="12" fill="#656d76">no reports in this history</text>')
    for i, (_, svg) in enumerate(charts):
        x, y = WIDTH * (i % columns), 28 + HEIGHT * (i // columns)
        out.append(f'<g transform="translate({x},{y})">{svg}</g>')
    out.append("</svg>\n")
    return "".join(out)
