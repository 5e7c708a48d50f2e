"""Issue 12, point 4: a full disk. With TRAINFLOW_HOME on a real 1 MiB tmpfs and a job writing 3 MB, the job
is marked Failed with a reason naming ENOSPC; status, list and wait still work; cancel frees the space. Node
logs have a configurable size cap (TRAINFLOW_LOCAL_LOG_MAX_BYTES) and the cut is noted in the log.

Mounting a tmpfs needs root, as on the CI machines."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import JobState, TrainJobFailed
from trainflow.core.local.engine import LocalBackend

NS = "full"
WRITE_3MB = ["python3", "-c", "import sys\nfor _ in range(300): sys.stdout.write('x' * 9999 + '\\n')"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "mounting a tmpfs needs root (the CI machines run the suite as root)"
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True, timeout=HANG)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=HANG)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_fails_the_job_naming_enospc_and_cancel_frees_it(small_disk: Path) -> None:
    backend = LocalBackend(small_disk / "home", namespace=NS)
    ref = backend.submit({"name": "big", "command": WRITE_3MB})
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=HANG)
    result = info.value.result
    assert result.reason == "DiskFull" and "ENOSPC" in (result.message or ""), (result.reason, result.message)
    assert backend.get(ref).state is JobState.FAILED  # status, list and wait still work on the full disk
    assert [r.name for r in backend.list()] == ["big"]
    assert backend.wait(ref, timeout=5, raise_on_failure=False).state is JobState.FAILED
    assert free_bytes(small_disk) < 300 * 1024
    assert backend.cancel(ref) is True
    assert free_bytes(small_disk) > 900 * 1024, "cancel did not free the space"
    assert backend.list() == []


def test_node_logs_have_a_configurable_cap_noted_in_the_log(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINFLOW_LOCAL_LOG_MAX_BYTES", "100000")
    backend = LocalBackend(small_disk / "home", namespace=NS)
    ref = backend.submit({"name": "capped", "command": WRITE_3MB})
    assert backend.wait(ref, timeout=HANG).state is JobState.COMPLETE
    log = backend.job_dir(ref) / "logs" / "node-0.log"
    text = log.read_text()
    assert 100000 <= log.stat().st_size < 100200
    assert text.endswith("[trainflow: log truncated at 100000 bytes (TRAINFLOW_LOCAL_LOG_MAX_BYTES)]\n")
