"""The ``trainflow`` command: render, submit, status, wait, logs, cancel, list, runtimes.

Exit codes: 0 success, 1 the job failed (or the wait timed out), 2 bad input. Never a traceback for
expected errors. Uses click (well kept, composable) and rich for the live display on a terminal.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml

from trainflow.core.backend import Backend, get_backend
from trainflow.core.errors import InvalidRequest, TrainflowError, TrainJobFailed, WaitTimeout
from trainflow.core.request import TrainJobRequest
from trainflow.core.result import TrainJobResult
from trainflow.core.validation import parse_request

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def load_request_file(path: str) -> dict[str, Any]:
    """Read a request from YAML or JSON (``-`` for stdin); errors name the file and line."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read request file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"request file {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except RecursionError:
        raise BadInput(f"request file {path}: nested too deeply to be a request") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BadInput(
            f"request file {path}{where}: not valid YAML/JSON ({getattr(exc, 'problem', exc)})"
        ) from None
    if not isinstance(data, dict):
        raise BadInput(
            f"request file {path}: expected a mapping of request fields, got {type(data).__name__}"
        )
    return data


def _set_values(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, text in _pairs(values, "--set").items():
        try:
            out[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise BadInput(f"--set {key}: value is not valid YAML") from None
    return out


def build_request(file: str | None, flags: dict[str, Any], command: tuple[str, ...]) -> TrainJobRequest:
    data: dict[str, Any] = load_request_file(file) if file else {}
    for key, value in flags.items():
        if value in (None, (), {}):
            continue
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    if command:
        data["command"] = list(command)
    return parse_request(data)


def _backend(ctx: click.Context) -> Backend:
    opts = ctx.obj
    config: dict[str, Any] = {}
    if opts["namespace"]:
        config["namespace"] = opts["namespace"]
    if opts["backend"] == "local":
        if opts["home"]:
            config["home"] = opts["home"]
    else:
        if opts["kubeconfig"]:
            config["kubeconfig"] = opts["kubeconfig"]
        if opts["context"]:
            config["context"] = opts["context"]
    backend = get_backend(opts["backend"], **config)
    if opts["backend"] != "local":  # a command line fails at once on an unreachable server, not after retries
        from trainflow.core.kube.config import check_reachable

        check_reachable(backend.cluster)  # type: ignore[attr-defined]
    return backend


def _emit(data: Any, as_json: bool) -> None:
    if as_json:
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


@contextmanager
def _progress_display() -> Iterator[Callable[[TrainJobResult], None]]:
    """A live line on a terminal; plain lines on state changes otherwise (logs, CI)."""
    if sys.stdout.isatty():
        from rich.console import Console

        console = Console()
        with console.status("waiting...") as status:
            yield lambda r: status.update(_summary(r))
    else:
        last: list[tuple[str, int | None]] = []

        def plain(result: TrainJobResult) -> None:
            key = (result.state.value, result.progress)
            if not last or last[-1] != key:
                last.append(key)
                click.echo(_summary(result))

        yield plain


def _wait_and_report(backend: Backend, ref: Any, timeout: float | None, as_json: bool) -> None:
    with _progress_display() as on_update:
        result = backend.wait(ref, timeout, on_update=on_update)
    _emit(result.to_dict(), as_json)


def _request_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("command", nargs=-1),
        click.option("-f", "--file", "file", help="Request file (YAML or JSON; - for stdin)."),
        click.option("--runtime"),
        click.option("--runtime-kind", type=click.Choice(["ClusterTrainingRuntime", "TrainingRuntime"])),
        click.option("--name"),
        click.option("--idempotency-key"),
        click.option("--image"),
        click.option("--arg", "args", multiple=True, help="Trainer argument (repeatable)."),
        click.option("--function", help="module:function to run as the trainer."),
        click.option("--kwargs", "function_kwargs", help="JSON object of function keyword arguments."),
        click.option("--num-nodes", type=int),
        click.option("--proc-per-node"),
        click.option("--env", multiple=True, help="KEY=VALUE (repeatable)."),
        click.option("--secret-env", multiple=True, help="KEY=secret-name/key (repeatable)."),
        click.option("--label", multiple=True, help="KEY=VALUE (repeatable)."),
        click.option("--dataset-uri"),
        click.option("--model-uri"),
        click.option("--output-uri"),
        click.option("--queue"),
        click.option("--suspend", is_flag=True, default=None),
        click.option("--deadline-seconds", type=int),
        click.option("--set", "set_values", multiple=True, help="Any request field: FIELD=YAML-VALUE."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _collect(kw: dict[str, Any]) -> TrainJobRequest:
    kwargs_text = kw.pop("function_kwargs")
    flags: dict[str, Any] = {
        "runtime": kw["runtime"],
        "runtime_kind": kw["runtime_kind"],
        "name": kw["name"],
        "idempotency_key": kw["idempotency_key"],
        "image": kw["image"],
        "args": list(kw["args"]) or None,
        "function": kw["function"],
        "num_nodes": kw["num_nodes"],
        "env": _pairs(kw["env"], "--env"),
        "secret_env": _pairs(kw["secret_env"], "--secret-env"),
        "labels": _pairs(kw["label"], "--label"),
        "dataset_uri": kw["dataset_uri"],
        "model_uri": kw["model_uri"],
        "output_uri": kw["output_uri"],
        "queue": kw["queue"],
        "suspend": kw["suspend"],
        "deadline_seconds": kw["deadline_seconds"],
    }
    ppn = kw["proc_per_node"]
    if ppn is not None:
        flags["proc_per_node"] = ppn if ppn == "auto" else _int(ppn, "--proc-per-node")
    if kwargs_text:
        try:
            flags["function_kwargs"] = json.loads(kwargs_text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"--kwargs: not valid JSON ({exc.msg})") from None
    flags.update(_set_values(kw["set_values"]))
    return build_request(kw["file"], flags, kw["command"])


def _int(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"{option}: {text!r} is not a whole number or 'auto'") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--backend",
    type=click.Choice(["local", "kubernetes"]),
    default="local",
    envvar="TRAINFLOW_BACKEND",
    show_default=True,
    help="Where TrainJobs run: the embedded local engine or a Kubernetes cluster.",
)
@click.option("-n", "--namespace", envvar="TRAINFLOW_NAMESPACE")
@click.option("--kubeconfig", envvar="KUBECONFIG")
@click.option("--context")
@click.option("--home", envvar="TRAINFLOW_HOME", help="Local engine state directory.")
@click.pass_context
def cli(ctx: click.Context, /, **opts: Any) -> None:
    """Run Kubeflow Trainer TrainJobs from the command line, a cluster or this machine."""
    ctx.obj = opts


@cli.command()
@_request_options
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
@click.pass_context
def render(ctx: click.Context, /, as_json: bool, **kw: Any) -> None:
    """Print the TrainJob manifest for a request; submits nothing."""
    request = _collect(kw)
    _emit(_backend(ctx).render(request), as_json)


@cli.command()
@_request_options
@click.option("--wait/--no-wait", "wait", default=False, help="Wait for the job to finish.")
@click.option("--timeout", type=float)
@click.option(
    "--dry-run", is_flag=True, help="Validate with the backend (server-side dry run); create nothing."
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def submit(
    ctx: click.Context, /, wait: bool, timeout: float | None, dry_run: bool, as_json: bool, **kw: Any
) -> None:
    """Validate and submit a TrainJob (adopting an existing one with the same identity)."""
    request = _collect(kw)
    backend = _backend(ctx)
    ref = backend.submit(request, dry_run=dry_run)
    if dry_run:
        click.echo(f"dry run ok: {ref}")
        return
    click.echo(f"submitted {ref}", err=as_json)
    if wait:
        _wait_and_report(backend, ref, timeout, as_json)


@cli.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show one TrainJob's state, times, progress and metrics."""
    _emit(_backend(ctx).get(name).to_dict(), as_json)


@cli.command()
@click.argument("name")
@click.option("--timeout", type=float)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def wait(ctx: click.Context, name: str, timeout: float | None, as_json: bool) -> None:
    """Wait until a TrainJob completes (exit 0) or fails (exit 1)."""
    _wait_and_report(_backend(ctx), name, timeout, as_json)


@cli.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True)
@click.option(
    "--step", default="node-0", show_default=True, help="node-N, dataset-initializer, model-initializer"
)
@click.option("--tail", "tail_lines", type=int)
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
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_jobs(ctx: click.Context, label: tuple[str, ...], as_json: bool) -> None:
    """List TrainJobs."""
    results = _backend(ctx).list(_pairs(label, "--label") or None)
    if as_json:
        _emit([r.to_dict() for r in results], True)
    else:
        for result in results:
            click.echo(_summary(result))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def runtimes(ctx: click.Context, as_json: bool) -> None:
    """List training runtimes (framework, policy, steps)."""
    items = [r.summary() for r in _backend(ctx).runtimes()]
    if as_json:
        _emit(items, True)
    else:
        for item in items:
            click.echo(
                f"{item['name']:32} {item['kind']:24} {item['framework'] or '-':10} {item['policy'] or '-'}"
            )


def main(argv: list[str] | None = None) -> int:
    """Entry point with the documented exit codes."""
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except InvalidRequest as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_BAD_INPUT
    except TrainJobFailed as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_FAILED
    except WaitTimeout as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_FAILED
    except TrainflowError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_FAILED
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except Exception as exc:  # an unexpected failure: one line, the traceback only on request
        if os.environ.get("TRAINFLOW_DEBUG"):
            raise
        click.echo(
            f"internal error: {type(exc).__name__}: {exc} (set TRAINFLOW_DEBUG=1 for details)", err=True
        )
        return EXIT_FAILED
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
