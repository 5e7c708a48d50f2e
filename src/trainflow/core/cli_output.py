"""How the CLI prints what it read: one document as JSON or YAML, many as an aligned table."""

from __future__ import annotations

import json
from typing import Any

import click
import yaml


def emit(data: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)
