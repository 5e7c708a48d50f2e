"""The ``trainflow`` command: render, submit, status, wait, logs, cancel, list, runtimes.

Exit codes: 0 success, 1 the job failed (or the wait timed out), 2 bad input (nothing was submitted). Never a
traceback for expected errors. click (well kept, composable) for the commands, rich for the live display.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import click
import yaml

from trainflow.core.backend import Backend, get_backend
from trainflow.core.cli_request import BadInput, collect, request_options
from trainflow.core.errors import (
    MAX_ERROR_CHARS,
    MAX_PROBLEM_CHARS,
    InvalidRequest,
    TrainflowError,
    TrainJobFailed,
    WaitTimeout,
    clip,
)
from trainflow.core.lifecycle import launch
from trainflow.core.result import JobRef, TrainJobResult

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _backend(ctx: click.Context) -> Backend:
    opts = ctx.obj
    config: dict[str, Any] = {}
    if opts["namespace"]:
        config["namespace"] = opts["namespace"]
    if opts["backend"] == "local":
        if opts["home"]:
            config["home"] = opts["home"]
    else:
        for key in ("kubeconfig", "context"):
            if opts[key]:
                config[key] = opts[key]
    backend = get_backend(opts["backend"], **config)
    if opts["backend"] != "local":  # a command line fails at once on an unreachable server, not after retries
        from trainflow.core.kube.config import check_reachable

        check_reachable(backend.cluster)  # type: ignore[attr-defined]
    return backend


def _emit(data: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def _summary(result: TrainJobResult) -> str:
    parts = [f"{result.namespace}/{result.name}", result.state.value]
    if result.reason:
        parts.append(result.reason)
    if result.progress is not None:
        parts.append(f"{result.progress}%")
    if result.duration_seconds is not None:
        parts.append(f"{result.duration_seconds:.1f}s")
    return "  ".join(parts)


def _describe(result: TrainJobResult) -> str:
    """A readable multi-line status for people (``--json``/``--yaml`` give the data)."""
    rows = [
        ("TrainJob", f"{result.namespace}/{result.name}"),
        ("State", result.state.value + (f" ({result.reason})" if result.reason else "")),
        ("Message", result.message or ""),
        ("Runtime", result.runtime or ""),
        ("Attempt", str(result.attempt or "")),
        ("Created", result.created_at.isoformat() if result.created_at else ""),
        ("Finished", result.finished_at.isoformat() if result.finished_at else ""),
        ("Duration", f"{result.duration_seconds:.1f}s" if result.duration_seconds is not None else ""),
        ("Progress", f"{result.progress}%" if result.progress is not None else ""),
        ("Metrics", ", ".join(f"{k}={v}" for k, v in sorted(result.metrics.items()))),
        ("Output", result.output_uri or ""),
    ]
    return "\n".join(f"{k + ':':10} {v}" for k, v in rows if v)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


@contextmanager
def _progress_display(started: float) -> Iterator[Callable[[TrainJobResult], None]]:
    """A live line on a terminal; plain lines on state changes otherwise (logs, CI); both show elapsed time."""
    if sys.stdout.isatty():
        from rich.console import Console

        with Console(stderr=True).status("waiting...") as status:
            yield lambda r: status.update(f"{_summary(r)}  [{time.monotonic() - started:.0f}s]")
    else:
        last: list[tuple[str, int | None]] = []

        def plain(result: TrainJobResult) -> None:
            key = (result.state.value, result.progress)
            if not last or last[-1] != key:
                last.append(key)
                click.echo(f"{_summary(result)}  (elapsed {time.monotonic() - started:.1f}s)", err=True)

        yield plain


def _follow_logs(backend: Backend, ref: JobRef | str) -> threading.Thread:
    def pump() -> None:
        try:
            for line in backend.logs(ref, follow=True):
                click.echo(line.rstrip("\n"))
        except TrainflowError as exc:
            click.echo(f"(logs: {exc})", err=True)

    thread = threading.Thread(target=pump, name="trainflow-cli-logs", daemon=True)
    thread.start()
    return thread


def _wait_and_report(
    backend: Backend, ref: JobRef | str, timeout: float | None, fmt: str, follow: bool
) -> None:
    started = time.monotonic()
    pump = _follow_logs(backend, ref) if follow else None
    with _progress_display(started) as on_update:
        result = backend.wait(ref, timeout, on_update=on_update)
    if pump is not None:
        pump.join(timeout=5)
    click.echo(f"{result.state.value} after {time.monotonic() - started:.1f}s", err=True)
    _emit(result.to_dict(), fmt)


def _timeout(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise click.BadParameter("give a finite number of seconds > 0", ctx, param)
    return value


def _output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--yaml", "fmt", flag_value="yaml", help="YAML output.")(fn)
    return click.option("--json", "fmt", flag_value="json", help="JSON output.")(fn)


def _version() -> str:
    try:
        return metadata.version("trainflow")
    except metadata.PackageNotFoundError:
        return "unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(_version(), "--version", prog_name="trainflow")
@click.option(
    "--backend",
    type=click.Choice(["local", "kubernetes"]),
    default="local",
    envvar="TRAINFLOW_BACKEND",
    show_default=True,
    help="Where TrainJobs run: the embedded local engine or a Kubernetes cluster.",
)
@click.option("-n", "--namespace", envvar="TRAINFLOW_NAMESPACE", help="Namespace (default: the context's).")
@click.option(
    "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file(s), ':'-separated (default: $KUBECONFIG)."
)
@click.option("--context", help="Kubeconfig context (default: the current one).")
@click.option(
    "--home", envvar="TRAINFLOW_HOME", help="Local engine state directory (default: $TRAINFLOW_HOME)."
)
@click.pass_context
def cli(ctx: click.Context, /, **opts: Any) -> None:
    """Run Kubeflow Trainer TrainJobs on a cluster or on this machine."""
    ctx.obj = opts


@cli.command()
@request_options
@_output_option
@click.pass_context
def render(ctx: click.Context, /, fmt: str | None, **kw: Any) -> None:
    """Print the TrainJob manifest for a request; creates nothing."""
    _emit(_backend(ctx).render(collect(kw)), fmt or "yaml")


@cli.command()
@request_options
@click.option("--wait/--no-wait", "wait", default=False, help="Wait for the job to finish.")
@click.option("--follow", is_flag=True, help="With --wait: print rank 0's log while waiting.")
@click.option("--timeout", type=float, callback=_timeout, help="With --wait: give up after SECONDS.")
@click.option(
    "--dry-run", is_flag=True, help="Validate (on a cluster: a server-side dry run); create nothing."
)
@_output_option
@click.pass_context
def submit(
    ctx: click.Context,
    /,
    wait: bool,
    follow: bool,
    timeout: float | None,
    dry_run: bool,
    fmt: str | None,
    **kw: Any,
) -> None:
    """Create a TrainJob, or reattach to / reuse the one with the same identity."""
    request = collect(kw)
    backend = _backend(ctx)
    launched = launch(backend, request, dry_run=dry_run)
    for line in launched.history():
        click.echo(line, err=True)
    click.echo(launched.summary, err=bool(fmt))
    if wait and not dry_run:
        _wait_and_report(backend, launched.ref, timeout, fmt or "yaml", follow)


@cli.command()
@click.argument("name")
@_output_option
@click.pass_context
def status(ctx: click.Context, name: str, fmt: str | None) -> None:
    """Show one TrainJob: state, reason, times, progress, metrics, output."""
    result = _backend(ctx).get(name)
    if fmt:
        _emit(result.to_dict(), fmt)
    else:
        click.echo(_describe(result))


@cli.command()
@click.argument("name")
@click.option("--timeout", type=float, callback=_timeout, help="Give up after SECONDS (exit 1).")
@click.option("--follow", is_flag=True, help="Print rank 0's log while waiting.")
@_output_option
@click.pass_context
def wait(ctx: click.Context, name: str, timeout: float | None, follow: bool, fmt: str | None) -> None:
    """Wait until a TrainJob completes (exit 0) or fails (exit 1)."""
    _wait_and_report(_backend(ctx), name, timeout, fmt or "yaml", follow)


@cli.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the job ends.")
@click.option(
    "--step", default="node-0", show_default=True, help="node-N, dataset-initializer, model-initializer."
)
@click.option("--tail", "tail_lines", type=click.IntRange(min=0), help="Only the last N lines.")
@click.pass_context
def logs(ctx: click.Context, name: str, follow: bool, step: str, tail_lines: int | None) -> None:
    """Print (or follow) the log of one step; node-0 is rank 0."""
    for line in _backend(ctx).logs(name, follow=follow, step=step, tail_lines=tail_lines):
        click.echo(line.rstrip("\n"))


@cli.command()
@click.argument("name")
@click.pass_context
def cancel(ctx: click.Context, name: str) -> None:
    """Stop and delete a TrainJob (idempotent)."""
    deleted = _backend(ctx).cancel(name)
    click.echo(f"cancelled {name}" if deleted else f"{name} was already gone")


@cli.command(name="list")
@click.option("-l", "--label", multiple=True, help="KEY=VALUE filter (repeatable).")
@_output_option
@click.pass_context
def list_jobs(ctx: click.Context, label: tuple[str, ...], fmt: str | None) -> None:
    """List TrainJobs."""
    labels = dict(item.partition("=")[::2] for item in label)
    if any(not k for k in labels):
        raise BadInput("--label: expected KEY=VALUE")
    results = _backend(ctx).list(labels or None)
    if fmt:
        _emit([r.to_dict() for r in results], fmt)
        return
    rows = [
        [
            r.name,
            r.state.value,
            r.reason or "",
            r.runtime or "",
            str(r.attempt or ""),
            f"{r.duration_seconds:.0f}s" if r.duration_seconds is not None else "",
        ]
        for r in results
    ]
    click.echo(_table(["name", "state", "reason", "runtime", "attempt", "duration"], rows))


@cli.command()
@_output_option
@click.pass_context
def runtimes(ctx: click.Context, fmt: str | None) -> None:
    """List training runtimes (framework, ML policy, steps)."""
    items = [r.summary() for r in _backend(ctx).runtimes()]
    if fmt:
        _emit(items, fmt)
        return
    rows = [[i["name"], i["kind"], i["framework"] or "", i["policy"] or ""] for i in items]
    click.echo(_table(["name", "kind", "framework", "policy"], rows))


def main(argv: list[str] | None = None) -> int:
    """Entry point with the documented exit codes."""
    try:
        cli.main(args=argv, standalone_mode=False, prog_name="trainflow")
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.message = clip(exc.message, MAX_PROBLEM_CHARS)  # type: ignore[misc]  # click echoes the bad value
        exc.show()
        return EXIT_BAD_INPUT if isinstance(exc, click.UsageError) else exc.exit_code
    except InvalidRequest as exc:
        click.echo(f"error: {clip(str(exc), MAX_ERROR_CHARS)}", err=True)
        return EXIT_BAD_INPUT
    except (TrainJobFailed, WaitTimeout, TrainflowError) as exc:
        click.echo(f"error: {clip(str(exc), 2 * MAX_ERROR_CHARS)}", err=True)
        return EXIT_FAILED
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except Exception as exc:  # an unexpected failure: one line, the traceback only on request
        if os.environ.get("TRAINFLOW_DEBUG"):
            raise
        text = clip(str(exc), MAX_ERROR_CHARS)
        click.echo(
            f"internal error: {type(exc).__name__}: {text} (set TRAINFLOW_DEBUG=1 for details)", err=True
        )
        return EXIT_FAILED
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
