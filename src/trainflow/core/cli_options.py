"""The CLI's request options, derived from ``TrainJobRequest.model_fields``, and request files.

Each request field is an option of the same name (``num_nodes`` -> ``--num-nodes``), typed by the field:
text, whole numbers, flags, repeatable ``KEY=VALUE`` for mappings, repeatable values for lists, and a YAML/JSON
value for structured fields. ``command`` is the trailing ``-- ARGV...``. A field added to the request is an
option at once; ``--set FIELD=YAML`` reaches any field too.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from trainflow.core.errors import InvalidRequest
from trainflow.core.request import TrainJobRequest
from trainflow.core.request_text import MAX_REQUEST_FILE_BYTES, parse_request_text
from trainflow.core.validation import parse_request

SINGULAR = {
    "args": "arg",
    "labels": "label",
    "annotations": "annotation",
    "image_pull_secrets": "image-pull-secret",
}
ALIASES = {"function_kwargs": ("--kwargs",)}


class BadInput(click.ClickException):
    """Bad command-line input: exit code 2, nothing was submitted."""

    exit_code = 2


def _kind(annotation: Any) -> str:
    """'pairs' (mapping of text), 'list' (list of text), 'flag', 'int', 'text' or 'yaml' for one field type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])
    if origin in (typing.Union, types.UnionType) and any(
        a is str or typing.get_origin(a) is typing.Literal for a in args
    ):
        return "text"  # 'module:function' or a callable; a number or 'auto'
    if origin is dict:
        return "pairs" if args[1] is str or typing.get_origin(args[1]) is typing.Annotated else "yaml"
    if origin is list:
        return "list" if args == [str] else "yaml"
    if annotation is bool:
        return "flag"
    if annotation is int:
        return "int"
    if annotation is str or origin is typing.Literal:
        return "text"
    return "yaml"


def _option_name(field: str) -> str:
    return "--" + SINGULAR.get(field, field).replace("_", "-")


def request_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with one option per request field, a request file, ``--set`` and ``-- COMMAND``."""
    options = [
        click.argument("command", nargs=-1),
        click.option("-f", "--file", "request_file", help="Request file (YAML or JSON; - for stdin)."),
        click.option(
            "--set", "set_values", multiple=True, help="Any request field: FIELD=YAML-VALUE (repeatable)."
        ),
    ]
    for field, info in TrainJobRequest.model_fields.items():
        if field == "command":
            continue
        kind = _kind(info.annotation)
        text = (info.description or field).rstrip(".")
        decls = [_option_name(field), *ALIASES.get(field, ()), f"opt_{field}"]
        if kind == "pairs":
            options.append(click.option(*decls, multiple=True, help=f"{text}: KEY=VALUE (repeatable)."))
        elif kind == "list":
            options.append(click.option(*decls, multiple=True, help=f"{text} (repeatable)."))
        elif kind == "flag":
            options.append(click.option(*decls, is_flag=True, default=None, help=f"{text}."))
        elif kind == "int":
            options.append(click.option(*decls, type=int, help=f"{text}."))
        elif kind == "text":
            options.append(click.option(*decls, help=f"{text}."))
        else:
            options.append(click.option(*decls, help=f"{text}: a YAML or JSON value."))
    for option in reversed(options):
        fn = option(fn)
    return fn


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"{option} {item[:80]!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _yaml(text: str, option: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise BadInput(f"{option}: not a valid YAML or JSON value") from None


def _flag_value(field: str, value: Any) -> Any:
    """One parsed option value as the request field's value."""
    info = TrainJobRequest.model_fields[field]
    option = _option_name(field)
    kind = _kind(info.annotation)
    if kind == "pairs":
        return _pairs(value, option)
    if kind == "list":
        return list(value)
    if kind == "yaml":
        if field == "function_kwargs":
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise BadInput(f"--kwargs: not valid JSON ({exc.msg})") from None
        return _yaml(value, option)
    if field == "proc_per_node" and value != "auto":
        try:
            return int(value)
        except ValueError:
            raise BadInput(f"--proc-per-node: {value[:40]!r} is not a whole number or 'auto'") from None
    return value


def collect(kw: dict[str, Any]) -> TrainJobRequest:
    """The request a command's options describe: the file, then the options, then ``--set``, then COMMAND."""
    data: dict[str, Any] = load_request_file(kw["request_file"]) if kw.get("request_file") else {}
    for field in TrainJobRequest.model_fields:
        value = kw.get(f"opt_{field}")
        if value is None or value == ():
            continue
        parsed = _flag_value(field, value)
        if isinstance(parsed, dict) and isinstance(data.get(field), dict):
            data[field] = {**data[field], **parsed}
        else:
            data[field] = parsed
    for key, text in _pairs(kw.get("set_values") or (), "--set").items():
        data[key] = _yaml(text, f"--set {key[:40]}")
    if kw.get("command"):
        data["command"] = list(kw["command"])
    return parse_request(data)


def load_request_file(path: str) -> dict[str, Any]:
    """Read a request from YAML or JSON (``-`` for stdin); errors name the file and line."""
    try:
        raw = sys.stdin.buffer.read(MAX_REQUEST_FILE_BYTES + 1) if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read request file {path}: {exc.strerror}") from None
    if len(raw) > MAX_REQUEST_FILE_BYTES:
        raise BadInput(f"request file {path}: larger than {MAX_REQUEST_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"request file {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return parse_request_text(text, f"request file {path}")
    except InvalidRequest as exc:
        raise BadInput(exc.issues[0].problem) from None
