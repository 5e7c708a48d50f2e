"""Issue 33: observers cannot make a healthy local job end ``SupervisorLost``.

Readers used to test the supervisor's liveness by taking a shared flock on ``.supervisor.lock``; a supervisor
starting while one held it concluded that another owned the job and exited without a word. Now readers
acquire nothing (``F_OFD_GETLK``) and a lost verdict needs the recorded supervisor pid and start time gone
(core/local/store.py). Two tests: a forced interleaving (a reader holding every lock a liveness check could
hold, across the supervisor's start) 100 of 100, and a stress run of ``["true"]`` jobs, each read by several
readers at once, beside CPU hogs (``TRAINFLOW_LIVENESS_JOBS``, default 500; marked ``stress``: minutes, so
``make test-stress`` and the reliability lane run it, not ``make test-fast``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainflow.core import JobState, TrainJobNotFound
from trainflow.core.local import reaper, store
from trainflow.core.local.engine import LocalBackend

pytestmark = pytest.mark.reliability

NS = "liveness"
HANG = 120.0  # a hang detector for one job, far above its start at load (about a second)


class CreatorDied(LocalBackend):
    """A creator that dies between publishing a job and starting its supervisor (what ``adopt`` recovers)."""

    def _spawn(self, job: store.JobDir) -> None:
        pass


def _supervisor_has_open(guard: int, lock: Path) -> bool:
    """The guard's child (the supervisor) has the lock file open: its ownership attempt is under way."""
    for pid in [guard, *reaper.descendants(guard)]:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == str(lock):
                        return True
    return False


@contextlib.contextmanager
def reader_holding_every_lock(lock: Path) -> Iterator[None]:
    """What a reader's liveness check held (a shared flock) and what one could hold (an OFD read lock)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
        yield
    finally:
        os.close(fd)


def run_interleaved(home: Path, index: int) -> tuple[JobState, str]:
    name = f"held-{index}"
    CreatorDied(home, namespace=NS).submit({"name": name, "command": ["true"]})
    backend = LocalBackend(home, namespace=NS)
    job = store.JobDir(backend.job_dir(name))
    with reader_holding_every_lock(job.supervisor_lock):
        backend.adopt(backend.read(NS, name) or {})
        guard = int((store.read_json(job.spawn) or {})["pid"])
        end = time.monotonic() + HANG
        while not _supervisor_has_open(guard, job.supervisor_lock) and store.pid_alive(guard):
            assert time.monotonic() < end, "the supervisor never opened its lock file"
            assert backend.get(name).state is JobState.CREATED  # read while the lock is held: starting
            time.sleep(0.005)
        held = time.monotonic() + 0.1  # across the supervisor's ownership attempt
        while time.monotonic() < held:
            backend.get(name)
            time.sleep(0.005)
    result = backend.wait(name, timeout=HANG, raise_on_failure=False)
    return result.state, result.reason or ""


@pytest.mark.timeout(900)  # a hang detector: 20-35 s at load 10-20 on 2 cores
def test_a_reader_holding_the_liveness_check_across_spawn_never_makes_the_job_lost(tmp_path: Path) -> None:
    home = tmp_path / "home"
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        outcomes = Counter(pool.map(lambda i: run_interleaved(home, i), range(100)))
    print(f"forced interleaving: {dict(outcomes)} in {time.monotonic() - start:.1f} s")
    assert outcomes == {(JobState.COMPLETE, "AllJobsCompleted"): 100}


# --- stress ----------------------------------------------------------------------------------------

JOBS = int(os.environ.get("TRAINFLOW_LIVENESS_JOBS", "500"))
LANES = 4  # jobs in flight at once
READERS = 3  # readers per job, beside the waiter
# busy loops, one per core of the reference machine; make test sets 0: its other lanes are the load there, and
# two more loops for minutes would only lengthen the CI run
HOGS = int(os.environ.get("TRAINFLOW_LIVENESS_HOGS", "2"))


@pytest.fixture
def cpu_hogs() -> Iterator[None]:
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(HOGS)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()


def read_until_done(backend: LocalBackend, name: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            if backend.get(name).state.terminal:
                return
        except TrainJobNotFound:
            pass  # not published yet


def run_observed(home: Path, index: int) -> tuple[JobState, str]:
    backend = LocalBackend(home, namespace=NS, poll_interval=0.01)
    name = f"true-{index}"
    stop = threading.Event()
    readers = [
        threading.Thread(target=read_until_done, args=(LocalBackend(home, namespace=NS), name, stop))
        for _ in range(READERS)
    ]
    for reader in readers:  # reading from before the job exists, through its supervisor's start
        reader.start()
    try:
        backend.submit({"name": name, "command": ["true"]})
        result = backend.wait(name, timeout=HANG, raise_on_failure=False)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    return result.state, result.reason or ""


@pytest.mark.stress
@pytest.mark.timeout(1800)  # a hang detector: about 3.5 min at load 28 on 2 cores
def test_no_true_job_ends_supervisor_lost_under_readers_and_load(tmp_path: Path, cpu_hogs: None) -> None:
    assert JOBS >= 1
    home = tmp_path / "home"
    start = time.monotonic()
    with ThreadPoolExecutor(LANES) as pool:
        outcomes = Counter(pool.map(lambda i: run_observed(home, i), range(JOBS)))
    took = time.monotonic() - start
    print(
        f"{JOBS} true jobs, {READERS} readers each, {LANES} in flight, {HOGS} CPU hogs: {dict(outcomes)} in "
        f"{took:.0f} s, load {os.getloadavg()[0]:.1f}"
    )
    assert outcomes == {(JobState.COMPLETE, "AllJobsCompleted"): JOBS}
