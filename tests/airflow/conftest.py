"""Airflow test setup: a per-session SQLite AIRFLOW_HOME in tmp, set before anything imports Airflow.

Airflow-level runs (``airflow dags test``, ``dag.test()``) happen in subprocesses with their own
``TRAINFLOW_HOME`` and the ``kubeflow_trainer_default`` connection pointed at the local engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounds import HANG

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="trainflow-airflow-tests-"))
AIRFLOW_HOME = _SESSION_TMP / "airflow"
AIRFLOW_HOME.mkdir()
# Before Airflow is imported anywhere in this session: never touch ~/airflow.
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags_examples")
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")

LOCAL_CONN = json.dumps({"conn_type": "kubeflow_trainer", "extra": {"backend": "local"}})
TEST_DAGS = Path(__file__).resolve().parent / "dags"


def airflow_env(trainflow_home: Path, dags_folder: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(AIRFLOW_HOME),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder or REPO / "dags_examples"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "TRAINFLOW_HOME": str(trainflow_home),
            "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": LOCAL_CONN,
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> subprocess.CompletedProcess[str]:
    """Run an Airflow command in its own process group; keep its output in ``log`` for failures."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(
                f"{' '.join(cmd)} timed out after {timeout}s; log:\n{log.read_text()[-6000:]}"
            ) from None
    return subprocess.CompletedProcess(cmd, rc, log.read_text(), "")


class AirflowTools:
    """What the Airflow tests need from this conftest (fixtures, not imports: conftest is not a module)."""

    repo = REPO
    bin = BIN
    home = AIRFLOW_HOME
    test_dags = TEST_DAGS
    env = staticmethod(airflow_env)
    run = staticmethod(run)


@pytest.fixture(scope="session")
def af() -> AirflowTools:
    return AirflowTools()


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """``airflow db migrate`` once per session (SQLite, in tmp)."""
    log = _SESSION_TMP / "migrate.log"
    result = run([str(BIN / "airflow"), "db", "migrate"], airflow_env(_SESSION_TMP / "trainflow"), HANG, log)
    assert result.returncode == 0, result.stdout[-4000:]
    return AIRFLOW_HOME


@pytest.fixture
def trainflow_home(tmp_path: Path) -> Path:
    home = tmp_path / "trainflow"
    home.mkdir()
    return home


@pytest.fixture
def local_backend(trainflow_home: Path) -> Iterator[object]:
    from trainflow.core import get_backend

    backend = get_backend("local", home=str(trainflow_home))
    yield backend
    for job in backend.list():  # never leave training processes behind
        if not job.state.terminal:
            backend.cancel(job.ref)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
