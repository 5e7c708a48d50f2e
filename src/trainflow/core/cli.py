"""The ``trainflow`` command: render, submit, status, wait, logs, cancel, list, runtimes.

Exit codes: 0 success, 1 the job failed (or the wait timed out), 2 bad input (nothing was submitted). Never a
traceback for expected errors. click (well kept, composable) for the commands, rich for the live display.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

import click

from trainflow.core import cli_output, cli_progress
from trainflow.core.backend import Backend
from trainflow.core.charts import duration
from trainflow.core.cli_options import BadInput, collect, request_options
from trainflow.core.connection import connection_config, get_backend
from trainflow.core.errors import (
    MAX_ERROR_CHARS,
    MAX_PROBLEM_CHARS,
    InvalidRequest,
    QueueBudgetExceeded,
    TrainflowError,
    TrainJobFailed,
    WaitTimeout,
    clip,
)
from trainflow.core.lifecycle import launch
from trainflow.core.result import JobRef, TrainJobResult
from trainflow.core.schema import describe as schema_line

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _backend(ctx: click.Context) -> Backend:
    opts = ctx.obj
    name, config = connection_config(
        {k: opts[k] for k in ("backend", "namespace", "kubeconfig", "context", "home")}
    )
    backend = get_backend(name, **config)
    if name != "local":  # a command line fails at once on an unreachable server, not after retries
        from trainflow.core.kube.client import check_reachable

        check_reachable(backend.cluster)  # type: ignore[attr-defined]
    return backend


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
        ("Queue", result.queue or ""),
        ("Queued", f"{result.queued_seconds:.1f}s" if result.queued_seconds is not None else ""),
        ("Preempted", str(result.preemptions) if result.preemptions else ""),
        ("Progress", f"{result.progress}%" if result.progress is not None else ""),
        ("ETA", duration(eta) if (eta := cli_progress.eta_now(result)) is not None else ""),
        ("Metrics", ", ".join(f"{k}={v}" for k, v in sorted(result.metrics.items()))),
        (
            "History",
            f"{len(result.history)} points of {result.history.seen} reports" if result.history else "",
        ),
        ("Output", result.output_uri or ""),
    ]
    return "\n".join(f"{k + ':':10} {v}" for k, v in rows if v)


def _wait_and_report(
    backend: Backend,
    ref: JobRef | str,
    timeout: float | None,
    fmt: str | None,
    follow: tuple[str, ...],
    chart: str | None = None,
    metrics: tuple[str, ...] = (),
) -> TrainJobResult:
    result = cli_progress.wait_live(backend, ref, timeout, follow=follow, chart=chart, metrics=metrics)
    if fmt:
        cli_output.emit(result.to_dict(), fmt)
    return result


def _follow_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--step",
        multiple=True,
        metavar="STEP",
        help="With --follow: whose log (node-N, dataset-initializer, model-initializer; repeatable).",
    )(fn)
    return click.option("--follow", is_flag=True, help="Print rank 0's log (or --step's) while waiting.")(fn)


def _followed(follow: bool, steps: tuple[str, ...]) -> tuple[str, ...]:
    if steps and not follow:
        raise BadInput("--step: give --follow too (it chooses whose log --follow prints)")
    for step in steps:
        if not re.fullmatch(r"node-\d+|dataset-initializer|model-initializer", step):
            raise BadInput(f"--step {step!r}: use node-N (rank N), dataset-initializer or model-initializer")
    return (steps or ("node-0",)) if follow else ()


def _chart_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.lower().endswith(".svg"):
        raise click.BadParameter(f"{value!r}: charts are written as SVG; name the file *.svg", ctx, param)
    return value


def _chart_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--chart", callback=_chart_path, metavar="FILE.svg", help="Write the metrics history's charts here."
    )(fn)


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
    cli_output.emit(_backend(ctx).render(collect(kw)), fmt or "yaml")


@cli.command()
@request_options
@click.option("--wait/--no-wait", "wait", default=False, help="Wait for the job to finish.")
@_follow_options
@click.option("--timeout", type=float, callback=_timeout, help="With --wait: give up after SECONDS.")
@_chart_option
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
    step: tuple[str, ...],
    timeout: float | None,
    chart: str | None,
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
        _wait_and_report(backend, launched.ref, timeout, fmt or "yaml", _followed(follow, step), chart)


@cli.command()
@click.argument("name")
@click.option("-w", "--watch", is_flag=True, help="Follow it live (progress, ETA, metrics) until it ends.")
@_output_option
@click.pass_context
def status(ctx: click.Context, name: str, watch: bool, fmt: str | None) -> None:
    """Show one TrainJob: state, reason, times, progress, ETA, metrics, output."""
    backend = _backend(ctx)
    result = cli_progress.wait_live(backend, name, None) if watch else backend.get(name)
    if fmt:
        cli_output.emit(result.to_dict(), fmt)
    else:
        click.echo(_describe(result))


@cli.command()
@click.argument("name")
@click.option("--timeout", type=float, callback=_timeout, help="Give up after SECONDS (exit 1).")
@_follow_options
@_chart_option
@_output_option
@click.pass_context
def wait(
    ctx: click.Context,
    name: str,
    timeout: float | None,
    follow: bool,
    step: tuple[str, ...],
    chart: str | None,
    fmt: str | None,
) -> None:
    """Wait until a TrainJob completes (exit 0) or fails (exit 1), showing its progress live."""
    _wait_and_report(_backend(ctx), name, timeout, fmt or "yaml", _followed(follow, step), chart)


@cli.command()
@click.argument("name", required=False)
@click.option("-o", "--output", required=True, callback=_chart_path, metavar="FILE.svg", help="The SVG file.")
@click.option(
    "-m", "--metric", "metrics", multiple=True, help="Only this series (repeatable; 'progress' too)."
)
@click.option(
    "--result", "result_file", type=click.File("r"), help="A saved result (JSON: XCom, KFP, --json)."
)
@click.option("--timeout", type=float, callback=_timeout, help="Stop following after SECONDS (exit 1).")
@click.pass_context
def chart(
    ctx: click.Context,
    name: str | None,
    output: str,
    metrics: tuple[str, ...],
    result_file: Any,
    timeout: float | None,
) -> None:
    """Write a TrainJob's metrics and progress charts to an SVG file.

    NAME is followed until it ends, then charted: the local engine keeps every report, so its chart is whole
    however late this starts; on a cluster it holds the reports seen while this command ran (and the final
    one). --result charts a saved result (its history) instead."""
    if (name is None) == (result_file is None):
        raise BadInput("give a TrainJob NAME or --result FILE, one of them")
    if result_file is not None:
        try:
            result = TrainJobResult.from_dict(json.load(result_file))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"--result: not a TrainJob result ({exc})") from None
        cli_progress.write_chart(result, output, metrics)
        return
    assert name is not None
    _wait_and_report(_backend(ctx), name, timeout, None, (), output, metrics)


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
        cli_output.emit([r.to_dict() for r in results], fmt)
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
    click.echo(cli_output.table(["name", "state", "reason", "runtime", "attempt", "duration"], rows))


@cli.command()
@_output_option
@click.pass_context
def runtimes(ctx: click.Context, fmt: str | None) -> None:
    """List training runtimes (framework, ML policy, steps); on stderr, the TrainJob schema requests meet."""
    backend = _backend(ctx)
    click.echo(schema_line(backend.schema_picture()), err=True)
    items = [r.summary() for r in backend.runtimes()]
    if fmt:
        cli_output.emit(items, fmt)
        return
    rows = [[i["name"], i["kind"], i["framework"] or "", i["policy"] or ""] for i in items]
    click.echo(cli_output.table(["name", "kind", "framework", "policy"], rows))


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
        if isinstance(exc, QueueBudgetExceeded):
            click.echo(f"still queued: `trainflow cancel {exc.result.name}` deletes the TrainJob", err=True)
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
