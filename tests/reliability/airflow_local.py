"""Real Airflow (``dag.test()`` in a subprocess, SQLite metadata DB in tmp) on the real local engine, for the
crash and cancellation tests. Self-contained: nothing in this pytest process imports Airflow or changes its env.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bounds import HANG

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
DAGS = HERE / "dags"
PHASE_RUNNER = HERE / "airflow_phase_runner.py"
DAG_RUNNER = REPO / "tests" / "airflow" / "dag_runner.py"
LOGICAL = "2026-02-01T00:00:00"
LOCAL_CONN = json.dumps({"conn_type": "kubeflow_trainer", "extra": {"backend": "local"}})
JOB_DIR_ENV = b"TRAINFLOW_LOCAL_JOB_DIR="


@functools.cache
def airflow_home() -> Path:
    """A migrated SQLite AIRFLOW_HOME, once per pytest process."""
    home = Path(tempfile.mkdtemp(prefix="trainflow-reliability-airflow-"))
    atexit.register(shutil.rmtree, home, True)
    log = home / "migrate.log"
    with open(log, "w") as fh:
        rc = subprocess.call(
            [str(BIN / "airflow"), "db", "migrate"],
            env=env(home, home / "trainflow"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=HANG,
        )
    assert rc == 0, log.read_text()[-4000:]
    return home


def env(home: Path, trainflow_home: Path) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "TRAINFLOW_HOME": str(trainflow_home),
            "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": LOCAL_CONN,
            "PATH": f"{BIN}{os.pathsep}{e.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return e


def dag_args(dag_id: str, run_after: str, conf: dict[str, Any] | None = None) -> list[str]:
    return [dag_id, LOGICAL, run_after, *([json.dumps(conf)] if conf else [])]


def start(
    trainflow_home: Path, phase: str, marker: Path, args: list[str], log: Path
) -> subprocess.Popen[bytes]:
    """Start ``dag.test()`` (the task runs in this process) in its own process group."""
    with open(log, "w") as fh:
        return subprocess.Popen(
            [sys.executable, str(PHASE_RUNNER), phase, str(marker), *args],
            env=env(airflow_home(), trainflow_home),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run(trainflow_home: Path, args: list[str], log: Path, timeout: float = HANG) -> dict[str, Any]:
    """Run the DAG to the end (no patch) and return its summary plus the log."""
    proc = start(trainflow_home, "none", log.with_suffix(".marker"), args, log)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(f"dag run timed out; log:\n{log.read_text()[-6000:]}") from None
    out = log.read_text()
    assert rc == 0, out[-6000:]
    return {**summary(out), "log": out}


def run_summary(trainflow_home: Path, dag_id: str, log: Path) -> dict[str, Any]:
    """The DAG's latest run as the metadata DB has it (states, XComs), read by another process."""
    with open(log, "w") as fh:
        rc = subprocess.call(
            [sys.executable, str(DAG_RUNNER), "--summary", dag_id],
            env=env(airflow_home(), trainflow_home),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=HANG,
        )
    assert rc == 0, log.read_text()[-4000:]
    return summary(log.read_text())


def summary(output: str) -> dict[str, Any]:
    last = [ln for ln in output.splitlines() if ln.startswith('{"run_id"')]
    assert last, output[-6000:]
    return json.loads(last[-1])  # type: ignore[no-any-return]


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def job_processes(trainflow_home: Path) -> list[int]:
    """Live pids whose environment carries a local-engine job marker under ``trainflow_home``."""
    prefix = JOB_DIR_ENV + str(trainflow_home).encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(item.startswith(prefix) for item in environ):
            found.append(int(entry.name))
    return found


def job_dirs(trainflow_home: Path) -> list[Path]:
    jobs = trainflow_home / "jobs"
    return sorted(p for ns in jobs.iterdir() for p in ns.iterdir()) if jobs.exists() else []


def xcom_keys(dag_id: str, run_after: str, task_id: str = "train") -> dict[str, str]:
    """XCom rows of one task instance straight from the SQLite metadata DB (fast, no Airflow import)."""
    run_id = f"manual__{run_after}+00:00"
    with contextlib.closing(sqlite3.connect(airflow_home() / "airflow.db")) as db:
        rows = db.execute(
            "select key, value from xcom where dag_id=? and run_id=? and task_id=?", (dag_id, run_id, task_id)
        ).fetchall()
    return {key: value for key, value in rows}
