"""A private PostgreSQL (Debian's package) for one Airflow deployment: own data dir, socket dir and loopback port.

initdb, pg_ctl and postgres refuse to run as root, so as root every command runs as the ``postgres`` system
user (``runuser``); as any other user they run as that user. The database ``airflow`` is owned by the role
``airflow``, so PostgreSQL 15's public-schema rule does not get in the way of ``airflow db migrate``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

USER = "airflow"
PASSWORD = "airflow"
DATABASE = "airflow"


def bindir() -> Path:
    """The newest installed server (``/usr/lib/postgresql/<major>/bin``); not on PATH in Debian."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError(
            "PostgreSQL server not installed: apt-get install postgresql (tests/airflow_deploy)"
        )
    return Path(found[-1]).parent


def _as_owner(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _own(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def url(port: int, driver: str = "psycopg2") -> str:
    return f"postgresql+{driver}://{USER}:{PASSWORD}@127.0.0.1:{port}/{DATABASE}"


def start(root: Path, port: int, log: Path) -> int:
    """initdb (first time), start on 127.0.0.1:``port``, create role and database; returns the postmaster pid."""
    data, sock = root / "data", root / "sock"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    _own(sock, 0o755)
    b = bindir()
    if not (data / "PG_VERSION").exists():
        _own(data, 0o700)
        subprocess.run(
            _as_owner([str(b / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8"]),
            check=True,
            capture_output=True,
            text=True,
        )
    if os.geteuid() == 0:
        log.touch()
        shutil.chown(log, "postgres", "postgres")
    # fsync off: a test database on a shared machine; a crash only loses test state.
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run(
        _as_owner(
            [str(b / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "120", "-o", opts, "start"]
        ),
        check=True,
        capture_output=True,
        text=True,
    )
    sql = (
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='{USER}') THEN "
        f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'; END IF; END$$;"
    )
    psql = [
        str(b / "psql"),
        "-h",
        str(sock),
        "-p",
        str(port),
        "-U",
        "postgres",
        "-v",
        "ON_ERROR_STOP=1",
        "-q",
    ]
    subprocess.run(_as_owner([*psql, "-c", sql]), check=True, capture_output=True, text=True)
    exists = subprocess.run(
        _as_owner([*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'"]),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if exists != "1":
        subprocess.run(
            _as_owner([*psql, "-c", f"CREATE DATABASE {DATABASE} OWNER {USER}"]),
            check=True,
            capture_output=True,
            text=True,
        )
    return postmaster_pid(root) or 0


def postmaster_pid(root: Path) -> int | None:
    try:
        return int((root / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop(root: Path, timeout: float = 60.0) -> None:
    """Fast shutdown (disconnects clients); SIGKILL the postmaster if it does not go in time."""
    data = root / "data"
    pid = postmaster_pid(root)
    if pid is None:
        return
    subprocess.run(
        _as_owner(
            [str(bindir() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", str(int(timeout)), "stop"]
        ),
        capture_output=True,
        text=True,
    )
    end = time.monotonic() + 5
    while time.monotonic() < end and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
