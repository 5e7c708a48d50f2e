"""Local engine state primitives: atomic JSON, conditions in the Trainer's shape, liveness lock, /proc facts."""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import JobState, result_from_trainjob
from trainflow.core.errors import PermissionDenied
from trainflow.core.local import liveness, store


def test_write_json_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    store.write_json(path, {"a": 1})
    store.write_json(path, {"a": 2})
    assert store.read_json(path) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    assert store.read_json(tmp_path / "missing.json") is None
    with pytest.raises(TypeError):
        store.write_json(path, {"bad": object()})
    assert store.read_json(path) == {"a": 2} and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_conditions_upsert_by_type_and_keep_transition_time() -> None:
    status: dict[str, object] = {}
    store.set_condition(status, "Suspended", True, "Suspended", "TrainJob is suspended")
    first = status["conditions"][0]["lastTransitionTime"]  # type: ignore[index]
    time.sleep(0.01)
    store.set_condition(status, "Suspended", True, "Suspended", "again")
    assert status["conditions"][0]["lastTransitionTime"] == first  # type: ignore[index]
    store.set_condition(status, "Suspended", False, "Resumed", "TrainJob is resumed")
    store.set_condition(status, "Failed", True, "NodeFailed", "node 1 exited with code 3")
    conditions = status["conditions"]
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [  # type: ignore[attr-defined]
        ("Suspended", "False", "Resumed"),
        ("Failed", "True", "NodeFailed"),
    ]
    obj = {"metadata": {"name": "j", "namespace": "n"}, "status": status}
    assert store.is_terminal(obj)
    result = result_from_trainjob(obj)
    assert result.state is JobState.FAILED and result.reason == "NodeFailed"


def test_lock_held_sees_another_process_and_its_death(tmp_path: Path) -> None:
    lock = tmp_path / ".supervisor.lock"
    assert liveness.lock_held(lock) is False  # no file yet
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom trainflow.core.local import liveness\n"
        "assert liveness.take_lock(Path(sys.argv[1])) is not None\n"
        "print('locked', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        assert liveness.lock_held(lock) is True
        assert liveness.take_lock(lock) is None  # a second owner gives up
        start = store.proc_start_time(proc.pid)
        assert start is not None and store.pid_alive(proc.pid, start)
        assert not store.pid_alive(proc.pid, start + 1)  # pid reuse guard
    finally:
        proc.kill()
        proc.wait()
    assert liveness.lock_held(lock) is False
    assert not store.pid_alive(proc.pid)


def test_lock_is_per_open_file_so_a_holder_in_this_process_counts(tmp_path: Path) -> None:
    lock = tmp_path / "l"
    fd = liveness.take_lock(lock)
    assert fd is not None
    try:
        assert liveness.lock_held(lock) is True
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        # a reader of an earlier version tests the flock: it sees the owner
        earlier = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(earlier, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(earlier)
    finally:
        os.close(fd)
    assert liveness.lock_held(lock) is False


def test_readers_never_disturb_the_owner_of_the_liveness_lock(tmp_path: Path) -> None:
    """A reader's check acquires nothing: with readers checking in a loop, and with a stray reader holding the
    file's shared flock and a read lock, the owner still takes the lock (issue 33)."""
    lock = tmp_path / ".supervisor.lock"
    lock.touch(mode=0o600)
    stray = os.open(lock, os.O_RDONLY)
    fcntl.flock(stray, fcntl.LOCK_SH)  # what a reader's check used to hold
    fcntl.fcntl(stray, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
    threading.Timer(0.3, os.close, (stray,)).start()  # a read lock is waited out, never taken for an owner
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            liveness.lock_held(lock)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(200):
            fd = liveness.take_lock(lock)
            assert fd is not None
            os.close(fd)
    finally:
        stop.set()
        for thread in readers:
            thread.join()


def test_liveness_lock_refuses_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.touch()
    (tmp_path / ".supervisor.lock").symlink_to(target)
    with pytest.raises(PermissionDenied, match="symbolic link"):
        liveness.take_lock(tmp_path / ".supervisor.lock")
    with pytest.raises(PermissionDenied, match="symbolic link"):
        liveness.lock_held(tmp_path / ".supervisor.lock")


def test_marked_processes_finds_descendants_in_new_sessions() -> None:
    uid = "test-" + os.urandom(4).hex()
    env = {**os.environ, store.JOB_UID_ENV: uid}
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline and len(store.marked_processes(uid)) < 2:
            time.sleep(0.05)
        pids = store.marked_processes(uid)
        assert parent.pid in pids and len(pids) == 2
        assert store.kill_marked(uid) >= 2
        assert store.marked_processes(uid) == []
    finally:
        parent.kill()
        parent.wait()


def test_trainer_status_shape() -> None:
    assert store.trainer_status({}) is None
    shaped = store.trainer_status({"metrics": {"loss": 0.5, "tag": "a"}, "progressPercentage": 30})
    assert shaped is not None
    assert shaped["metrics"] == [{"name": "loss", "value": "0.5"}, {"name": "tag", "value": "a"}]
    assert shaped["progressPercentage"] == 30 and shaped["lastUpdatedTime"].endswith("Z")


def test_torchrun_root_cause_is_parsed() -> None:
    lines = [
        "Failures:",
        "  rank      : 2 (local_rank: 0)",
        "  exitcode  : -15 (pid: 10)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 7 (pid: 11) ",
    ]
    assert store.torchrun_failure(lines) == {"rank": 3, "local_rank": 1, "worker_exit_code": 7}
    assert store.torchrun_failure(["plain output"]) == {}
