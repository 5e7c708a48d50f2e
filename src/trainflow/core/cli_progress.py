"""How the CLI waits: the logs of the steps it follows alongside (the wait copies them), the chart file at the end, and how it shows the wait: a live progress bar on a terminal (rich), plain lines otherwise (logs, CI).

The bar shows the job, its state, the trainer's progress, the time remaining (the trainer's
``estimatedRemainingSeconds``, counted down from when it was reported; not rich's own guess), the latest
numeric metrics and the elapsed time. Plain lines are written when the state or the whole percentage changes,
so a trainer reporting every step does not flood a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from trainflow.core.backend import Backend
from trainflow.core.charts import document, duration, number
from trainflow.core.result import JobRef, JobState, TrainJobResult

if TYPE_CHECKING:
    from trainflow.core.logsink import LogSink

MAX_METRICS_SHOWN = 4
MAX_FOLLOWED_LINES = 10**9  # a terminal shows every line


def eta_now(result: TrainJobResult, now: float | None = None) -> float | None:
    """The reported ETA less the time since it was reported (never below 0); None when unknown or finished."""
    if result.eta_seconds is None or result.state.terminal:
        return None
    now = time.time() if now is None else now
    since = now - result.reported_at.timestamp() if result.reported_at is not None else 0.0
    return max(0.0, result.eta_seconds - max(0.0, since))


def metrics_text(result: TrainJobResult) -> str:
    """``loss=0.0123 acc=0.91``: the latest numeric metrics, history order first (the trainer's own order)."""
    numeric = {k: v for k, v in result.metrics.items() if isinstance(v, float)}
    order = [n for n in result.history.names() if n in numeric] + sorted(
        set(numeric) - set(result.history.names())
    )
    return " ".join(f"{k}={number(numeric[k])}" for k in order[:MAX_METRICS_SHOWN])


def line(result: TrainJobResult, elapsed: float) -> str:
    """One plain line: ``ns/name  Running  40%  ETA 1m 20s  loss=0.5  (elapsed 12.3s)``."""
    parts = [f"{result.namespace}/{result.name}", result.status_text]
    if result.reason and result.state is not JobState.QUEUED:  # a queued job's status_text says why
        parts.append(result.reason)
    if result.progress is not None:
        parts.append(f"{result.progress}%")
    eta = eta_now(result)
    if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    if metrics := metrics_text(result):
        parts.append(metrics)
    return "  ".join(parts) + f"  (elapsed {elapsed:.1f}s)"


@contextmanager
def display(started: float, *, tty: bool | None = None) -> Iterator[Callable[[TrainJobResult], None]]:
    """Yields the ``on_update`` callback of a wait; a live bar on a terminal, plain lines on stderr otherwise."""
    if sys.stderr.isatty() if tty is None else tty:
        with _bar(started) as update:
            yield update
        return
    last: list[tuple[str, int | None]] = []  # state (and why it waits), progress

    def plain(result: TrainJobResult) -> None:
        key = (result.status_text, result.progress)
        if not last or last[-1] != key:
            last.append(key)
            click.echo(line(result, time.monotonic() - started), err=True)

    yield plain


@contextmanager
def _bar(started: float) -> Iterator[Callable[[TrainJobResult], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
    from rich.text import Text

    seen: list[TrainJobResult | None] = [None]

    class Eta(ProgressColumn):
        def render(self, task: Task) -> Text:
            eta = eta_now(seen[0]) if seen[0] is not None else None
            return Text(f"ETA {duration(eta)}" if eta is not None else "ETA -", style="cyan")

    class Elapsed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(duration(time.monotonic() - started), style="dim")

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=30),
        TextColumn("{task.fields[pct]}"),
        Eta(),
        TextColumn("{task.fields[metrics]}"),
        Elapsed(),
        console=Console(stderr=True),
        refresh_per_second=4,
    )
    fields: dict[str, Any] = {"pct": "  -", "metrics": ""}
    with progress:
        task = progress.add_task("waiting...", total=100, **fields)

        def update(result: TrainJobResult) -> None:
            seen[0] = result
            description = f"{result.namespace}/{result.name} {result.status_text}"
            completed = result.progress if result.progress is not None else (100 if result.succeeded else 0)
            pct = f"{result.progress:3d}%" if result.progress is not None else "  -"
            progress.update(
                task, description=description, completed=completed, pct=pct, metrics=metrics_text(result)
            )

        yield update


def log_sink(steps: tuple[str, ...]) -> LogSink:
    """Print the followed steps' lines on stdout as the wait copies them (prefixed by step when several)."""
    from trainflow.core.logsink import LogSink

    def emit(step: str, text: str) -> None:
        click.echo(f"[{step}] {text}" if len(steps) > 1 else text)

    return LogSink(emit, steps or ("node-0",), max_lines=MAX_FOLLOWED_LINES)


def wait_live(
    backend: Backend,
    ref: JobRef | str,
    timeout: float | None,
    *,
    follow: tuple[str, ...] = (),
    chart: str | None = None,
    metrics: tuple[str, ...] = (),
) -> TrainJobResult:
    """Wait with the live display, copying the logs of the ``follow`` steps; write the chart (also of a failed
    or timed-out wait: what was seen); the Complete result, or the ending's typed error."""
    started = time.monotonic()
    seen: list[TrainJobResult | None] = [None]
    sink = log_sink(follow) if follow else None
    with display(started) as show:

        def on_update(result: TrainJobResult) -> None:
            seen[0] = result
            show(result)

        ending = backend.wait_ending(ref, timeout, on_update=on_update, logs=sink)
    last = ending.result or seen[0]
    if ending.succeeded and last is not None:
        click.echo(f"{last.state.value} after {time.monotonic() - started:.1f}s", err=True)
    if chart and last is not None:
        write_chart(last, chart, metrics)
    return ending.outcome()  # any other ending: its typed error, which ``cli.main`` turns into exit 1


def write_chart(result: TrainJobResult, path: str, metrics: tuple[str, ...] = ()) -> None:
    """The history's charts as one SVG file (``charts.document``)."""
    title = f"TrainJob {result.namespace}/{result.name}: {result.state.value}"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(document(result.history, title, list(metrics) or None))
    click.echo(f"chart of {len(result.history)} history points written to {path}", err=True)
