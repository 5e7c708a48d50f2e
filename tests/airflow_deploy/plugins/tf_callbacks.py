"""Callbacks of the deployment's TrainJob tasks (tests/airflow_deploy/dags): each call appends one JSON line
to ``$TRAINFLOW_HOME/callbacks/<TrainJob name>.jsonl`` with the process it ran in, so a test can tell the
triggerer from a worker. A module of the plugins folder: Airflow puts that folder on every process's path, so
the triggerer imports these by name (it does not have the DAG folder on its path)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def _write(kind: str, result: Any) -> None:
    folder = Path(os.environ["TRAINFLOW_HOME"]) / "callbacks"
    folder.mkdir(parents=True, exist_ok=True)
    line = {
        "kind": kind,
        "pid": os.getpid(),
        "ancestors": _ancestors(),  # the Airflow component it ran under is one of them
        "time": time.time(),
        "state": result.state.value,
        "progress": result.progress,
        "eta": result.eta_seconds,
        "seen": result.history.seen,
        "points": len(result.history),
    }
    with open(folder / f"{result.name}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def _ancestors() -> list[int]:
    """This process's parent, grandparent, ... up to init (from /proc)."""
    out, pid = [], os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def record_update(result: Any) -> None:
    _write("update", result)


async def record_update_async(result: Any) -> None:
    _write("update", result)


def record_result(result: Any) -> None:
    _write("result", result)


def raise_update(result: Any) -> None:
    _write("update", result)
    raise RuntimeError("a callback that always fails")


async def hang_update(result: Any) -> None:
    import asyncio

    _write("update", result)
    await asyncio.sleep(3600)


def hang_result(result: Any) -> None:
    _write("result", result)
    time.sleep(3600)
