"""What this machine can start, checked when the local plan is made (submit and dry run), naming the field.

``execve`` refuses one argv or environment string over ``MAX_ARG_STRLEN`` (Linux: 32 pages, 128 KiB) and
argv + environment together over ``ARG_MAX``; a node started with them would fail with E2BIG, reported as
a command that cannot start. Each local node is a process group on this machine, so ``num_nodes`` has a cap
(``TRAINFLOW_LOCAL_MAX_NODES``, default 32). Node logs are capped (``TRAINFLOW_LOCAL_LOG_MAX_BYTES``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from trainflow.core.errors import FieldIssue, InvalidRequest

MAX_NODES_ENV = "TRAINFLOW_LOCAL_MAX_NODES"
DEFAULT_MAX_NODES = 32
MAX_ARG_STRLEN = 32 * 4096 if sys.platform.startswith("linux") else None
POINTER = 8
SLACK = 16 * 1024  # the env the engine adds per node (policy, paths, markers) and the auxiliary vector


LOG_MAX_ENV = "TRAINFLOW_LOCAL_LOG_MAX_BYTES"
DEFAULT_LOG_MAX_BYTES = 1 << 30


def log_cap() -> int:
    """Bytes each node's log may hold (``TRAINFLOW_LOCAL_LOG_MAX_BYTES`` at submit, default 1 GiB)."""
    text = os.environ.get(LOG_MAX_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_LOG_MAX_BYTES


def max_nodes() -> int:
    text = os.environ.get(MAX_NODES_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_NODES


def arg_max() -> int:
    try:
        return int(os.sysconf("SC_ARG_MAX"))
    except (ValueError, OSError, AttributeError):
        return 256 * 1024


def argv_field(argv: list[str], index: int, command_len: int) -> str:
    """The request field behind ``argv[index]`` (argv = command + args)."""
    from trainflow.core.function_trainer import argv_field as function_part

    part = function_part(argv, index)
    if part is not None:
        return part
    return f"command[{index}]" if index < command_len else f"args[{index - command_len}]"


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogateescape")) + 1


def check(
    argv: list[str], command_len: int, env: list[dict[str, Any]], secrets: Path, num_nodes: int
) -> None:
    """Raise InvalidRequest for what ``execve`` or this machine would refuse; ``env`` are plan entries."""
    issues: list[FieldIssue] = []
    if not argv or not argv[0].strip():
        issues.append(FieldIssue("command[0]", "is empty: it must name the program to run", "e.g. python3"))
    cap = max_nodes()
    if num_nodes > cap:
        issues.append(
            FieldIssue(
                "num_nodes",
                f"{num_nodes} nodes: the local engine runs at most {cap} (each is a process group here)",
                f"use fewer nodes, set {MAX_NODES_ENV}, or use the kubernetes backend",
            )
        )
    limit = f"{MAX_ARG_STRLEN // 1024} KiB" if MAX_ARG_STRLEN else ""
    argv_bytes = 0
    for i, arg in enumerate(argv):
        size = _size(arg)
        argv_bytes += size + POINTER
        if MAX_ARG_STRLEN and size > MAX_ARG_STRLEN:
            field = argv_field(argv, i, command_len)
            issues.append(
                FieldIssue(
                    field,
                    f"{size - 1} bytes: one program argument may hold at most {limit} here",
                    "pass large data in a file and its path instead",
                )
            )
    env_bytes = sum(_size(f"{k}={v}") + POINTER for k, v in os.environ.items())
    for item in env:
        name = str(item["name"])
        if "secret" in item:
            path = secrets / item["secret"]["name"] / item["secret"]["key"]
            size = _size(name) + (path.stat().st_size if path.is_file() else 0)
            field = f"secret_env.{name}"
        else:
            size = _size(f"{name}={item['value']}")
            field = f"env.{name}"
        env_bytes += size + POINTER
        if MAX_ARG_STRLEN and size > MAX_ARG_STRLEN:
            issues.append(
                FieldIssue(
                    field,
                    f"{size - 1} bytes: one environment variable may hold at most {limit} here",
                    "pass large data in a file and its path instead",
                )
            )
    total, ceiling = argv_bytes + env_bytes + SLACK, arg_max()
    if not issues and total > ceiling:
        if env_bytes > argv_bytes:
            field = "env"
        else:
            biggest = max(range(len(argv)), key=lambda i: len(argv[i]))
            field = argv_field(argv, biggest, command_len).split("[")[0]
        issues.append(
            FieldIssue(
                field,
                f"argv ({argv_bytes // 1024} KiB) and environment ({env_bytes // 1024} KiB) together exceed "
                f"this machine's ARG_MAX ({ceiling // 1024} KiB)",
                "pass large data in a file and its path instead",
            )
        )
    if issues:
        raise InvalidRequest(issues)
