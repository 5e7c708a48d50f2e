"""Issue 12, point 1: the local engine adopts only what it made. A job directory planted by another local user
(real processes of another uid) or a symbolic link at the job path fails the submit with a clear message and
nothing runs; every directory the engine creates is 0700 whatever the umask; a TRAINFLOW_HOME in a shared /tmp
that another user made is refused.

Planting as another user needs root (to start the planting process as uid 65534), as on the CI machines."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from trainflow.core.errors import PermissionDenied
from trainflow.core.local.engine import LocalBackend

OTHER_UID = 65534  # nobody
NS = "trust"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (sticky, everyone may write) that another uid can reach."""
    assert os.geteuid() == 0, "acting as another uid needs root (the CI machines run the suite as root)"
    path = Path(tempfile.mkdtemp(prefix="tf-trust-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def request(marker: Path) -> dict[str, Any]:
    return {"idempotency_key": "nightly/run", "command": ["touch", str(marker)]}


def plant(backend: LocalBackend, marker: Path, planted: Path, *, as_uid: int | None) -> Path:
    """Write a job at the name ``request`` will use whose plan touches ``planted`` instead of ``marker``."""
    manifest = backend.render(request(marker))
    root = backend.home / "jobs" / NS / manifest["metadata"]["name"]
    manifest["metadata"].update(namespace=NS, uid="planted")
    plan = backend._plan(manifest, backend._job(f"{NS}/{manifest['metadata']['name']}")[1])
    plan["argv"] = ["touch", str(planted)]
    script = 'mkdir -p "$1/logs" && printf %s "$2" > "$1/trainjob.json" && printf %s "$3" > "$1/plan.json"'
    args = ["sh", "-c", script, "sh", str(root), json.dumps(manifest), json.dumps(plan)]
    subprocess.run(args, check=True, user=as_uid, cwd="/", timeout=HANG)
    return root


def assert_nothing_ran(root: Path, marker: Path, planted: Path) -> None:
    assert not planted.exists() and not marker.exists()
    assert not (root / "spawn.json").exists() and not (root / "supervisor.json").exists()


def test_a_job_planted_by_another_user_is_refused_and_nothing_runs(shared_tmp: Path, umask_000: None) -> None:
    tmp_path = shared_tmp
    home = tmp_path / "home"
    backend = LocalBackend(home, namespace=NS)
    # jobs/<ns>/ writable by everyone, as an engine that followed the umask (000) left it
    (home / "jobs" / NS).mkdir(parents=True, mode=0o777)
    for path in (home, home / "jobs", home / "jobs" / NS):
        path.chmod(0o777 if path != home else 0o755)
    outbox = tmp_path / "outbox"
    outbox.mkdir(mode=0o777)
    marker, planted = outbox / "real-ran", outbox / "planted-ran"
    root = plant(backend, marker, planted, as_uid=OTHER_UID)
    assert root.stat().st_uid == OTHER_UID
    with pytest.raises(PermissionDenied) as info:
        backend.submit(request(marker))
    text = str(info.value)
    assert str(root) in text and f"uid {OTHER_UID}" in text and "TRAINFLOW_HOME" in text
    assert_nothing_ran(root, marker, planted)
    # the engine tightened its own directories: nobody else can plant there any more
    assert stat.S_IMODE((home / "jobs" / NS).stat().st_mode) == 0o700
    with pytest.raises(PermissionDenied):
        backend.get(f"{NS}/{root.name}")
    with pytest.raises(PermissionDenied):
        backend.cancel(f"{NS}/{root.name}")  # never signals the pids a planted nodes.json could name
    assert root.exists()


def test_a_symlink_at_the_job_path_is_refused(
    tmp_path: Path, umask_000: None, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LocalBackend(tmp_path / "home", namespace=NS)
    marker, planted = tmp_path / "real-ran", tmp_path / "planted-ran"
    elsewhere = LocalBackend(tmp_path / "elsewhere", namespace=NS)
    target = plant(elsewhere, marker, planted, as_uid=None)  # a complete job directory, ours
    link = backend.home / "jobs" / NS / target.name
    link.parent.mkdir(parents=True)
    backend.home.chmod(0o700)  # (made here under umask 000; a home others may write is refused on its own)
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(PermissionDenied) as info:
        backend.submit(request(marker))
    assert "symbolic link" in str(info.value) and str(link) in str(info.value)
    assert_nothing_ran(target, marker, planted)
    with caplog.at_level(logging.WARNING):
        assert backend.list() == []
    assert "skipping" in caplog.text and "symbolic link" in caplog.text


def test_directories_are_private_whatever_the_umask(tmp_path: Path, umask_000: None) -> None:
    home = tmp_path / "shared-tmp" / "tfhome"
    backend = LocalBackend(home, namespace=NS)
    ref = backend.submit({"command": ["true"]})
    backend.wait(ref, timeout=HANG)
    for path in (home, home / "jobs", home / "jobs" / NS, backend.job_dir(ref)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    backend.cancel(ref)
    assert stat.S_IMODE((home / "jobs" / ".trash").stat().st_mode) == 0o700


def test_a_home_another_user_made_in_a_shared_tmp_is_refused(shared_tmp: Path) -> None:
    home = shared_tmp / "tfhome"
    subprocess.run(["mkdir", "-m", "777", str(home)], check=True, user=OTHER_UID, timeout=HANG)
    with pytest.raises(PermissionDenied) as info:
        LocalBackend(home, namespace=NS).submit({"command": ["true"]})
    assert str(home) in str(info.value) and f"uid {OTHER_UID}" in str(info.value)
    assert not (home / "jobs").exists()
