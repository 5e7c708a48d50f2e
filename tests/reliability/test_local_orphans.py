"""Issues 12 (points 2 and 3) and 33: no process of a local job outlives it. After a SIGKILL of the supervisor its
ranks stop within 5 s with nobody reading the job (the guard process, a child subreaper, stops them), and the
next read marks the job Failed; a rank's grandchild that starts a new session with an empty environment is
stopped on completion and on cancel (the supervisor is a child subreaper too: see core/local/reaper.py); a
SIGKILL of the supervisor's whole process group (supervisor and guard) stops every rank within a stated bound
with nobody reading (each node's wrapper holds a lifeline: core/local/lifeline.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import JobState
from trainflow.core.local import store
from trainflow.core.local.engine import LocalBackend

NS = "orphans"
HOLD = str(int(2 * HANG))  # how long a test job's processes run: longer than any wait of the test


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "home", namespace=NS)


def wait_file(path: Path, timeout: float = HANG) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and (text := path.read_text()).strip():
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def seconds_until_gone(pids: list[int], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout and any(store.pid_alive(p) for p in pids):
        time.sleep(0.02)
    alive = [p for p in pids if store.pid_alive(p)]
    for pid in alive:  # never leave them behind, even when the test fails
        store.signal_pid(pid, signal.SIGKILL)
    assert not alive, f"still running after {timeout} s: {alive}"
    return time.monotonic() - start


def test_ranks_stop_within_5s_of_a_supervisor_sigkill_with_nobody_reading(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "killed", "command": ["sleep", HOLD], "num_nodes": 2})
    job = backend.job_dir(ref)
    nodes = json.loads(wait_file(job / store.NODES_FILE))
    pids = [n["pid"] for n in nodes]
    supervisor = json.loads(wait_file(job / store.SUPERVISOR_FILE))["pid"]
    assert len(pids) == 2 and all(store.pid_alive(p) for p in pids)
    os.kill(supervisor, signal.SIGKILL)
    took = seconds_until_gone(pids, 5.0)  # no get/wait/list in between
    result = backend.get(ref)
    assert result.state is JobState.FAILED and result.reason == "SupervisorLost", result
    print(f"ranks stopped {took:.2f} s after the supervisor's SIGKILL")


# Each rank is a tree: a child in its group, and a child in a new session with an empty environment (no job
# marker) that ignores SIGTERM (once it says so); it writes the three pids, then waits (HOLD seconds: longer
# than the test's wait for the other rank's tree).
TREE = (
    "import os, subprocess, sys, time; "
    f"a = subprocess.Popen(['/bin/sleep', '{HOLD}']); "
    "b = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    f"signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep({HOLD})'], "
    "env={}, start_new_session=True, stdout=subprocess.PIPE); b.stdout.readline(); "
    "out = os.path.join(sys.argv[1], str(os.getpid())); "
    "open(out + '.tmp', 'w').write(f'{os.getpid()} {a.pid} {b.pid}'); os.rename(out + '.tmp', out + '.pids'); "
    f"time.sleep({HOLD})"
)
LIFELINE_BOUND_SECONDS = 5.0  # docs/reliability.md, issue 33: SIGTERM at once, SIGKILL 1 s later, with margin


def test_ranks_stop_within_the_bound_of_a_sigkill_of_supervisor_and_guard_together(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """``kill -KILL -<pgid>`` of the supervisor and its guard (a container runtime's, systemd's or a shell's
    stop): each node's wrapper reads its lifeline's end-of-file and stops its rank tree, no engine call."""
    out = tmp_path / "trees"
    out.mkdir()
    ref = backend.submit({"name": "group", "command": ["python3", "-c", TREE, str(out)], "num_nodes": 2})
    job = backend.job_dir(ref)
    end = time.monotonic() + HANG
    while len(trees := list(out.glob("*.pids"))) < 2:
        assert time.monotonic() < end, "the ranks never started their trees"
        time.sleep(0.02)
    pids = [int(pid) for tree in trees for pid in tree.read_text().split()]
    assert len(pids) == 6 and all(store.pid_alive(p) for p in pids)
    guard = json.loads(wait_file(job / store.SPAWN_FILE))["pid"]
    supervisor = json.loads(wait_file(job / store.SUPERVISOR_FILE))["pid"]
    group = os.getpgid(guard)
    assert os.getpgid(supervisor) == group and all(os.getpgid(p) != group for p in pids)
    os.killpg(group, signal.SIGKILL)
    took = seconds_until_gone(pids, LIFELINE_BOUND_SECONDS)  # no get/wait/list in between
    assert not store.pid_alive(supervisor) and not store.pid_alive(guard)
    result = backend.get(ref)
    assert result.state is JobState.FAILED and result.reason == "SupervisorLost", result
    print(f"6 rank processes stopped {took:.2f} s after the SIGKILL of the supervisor's process group")


def test_a_killed_wrapper_fails_its_node_and_its_rank_tree_stops(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The lifeline's wrapper itself SIGKILLed: the rank's first process dies with it (PR_SET_PDEATHSIG), the
    rest of its tree is re-parented to the supervisor (a subreaper), which stops it with the failed node."""
    out = tmp_path / "trees"
    out.mkdir()
    ref = backend.submit({"name": "wrapper", "command": ["python3", "-c", TREE, str(out)]})
    job = backend.job_dir(ref)
    end = time.monotonic() + HANG
    while not (trees := list(out.glob("*.pids"))):
        assert time.monotonic() < end, "the rank never started its tree"
        time.sleep(0.02)
    pids = [int(pid) for pid in trees[0].read_text().split()]
    wrapper = json.loads(wait_file(job / store.NODES_FILE))[0]["pid"]
    assert wrapper not in pids and all(store.pid_alive(p) for p in pids)
    os.kill(wrapper, signal.SIGKILL)
    took = seconds_until_gone(pids, LIFELINE_BOUND_SECONDS)
    result = backend.wait(ref, timeout=HANG, raise_on_failure=False)
    assert result.state is JobState.FAILED and result.reason == "NodeFailed", result
    assert "SIGKILL" in (result.message or ""), result
    print(f"the rank tree stopped {took:.2f} s after its wrapper's SIGKILL")


# The rank starts a grandchild in a new session with an empty environment (no job marker), writes its pid,
# then exits at once (completion) or keeps running (cancel).
ESCAPE = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen(['/bin/sleep', '60'], env={}, start_new_session=True); "
    "open(sys.argv[1], 'w').write(str(p.pid)); "
    "time.sleep(float(sys.argv[2]))"
)


def test_an_escaped_grandchild_is_stopped_on_completion(backend: LocalBackend, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    ref = backend.submit({"name": "done", "command": ["python3", "-c", ESCAPE, str(pidfile), "0"]})
    result = backend.wait(ref, timeout=HANG)
    assert result.state is JobState.COMPLETE
    grandchild = int(wait_file(pidfile))
    assert not store.pid_alive(grandchild), "the grandchild outlived the completed job"
    seconds_until_gone([grandchild], 0.0)


def test_an_escaped_grandchild_is_stopped_on_cancel(backend: LocalBackend, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    ref = backend.submit({"name": "cancelled", "command": ["python3", "-c", ESCAPE, str(pidfile), "60"]})
    grandchild = int(wait_file(pidfile))
    assert store.pid_alive(grandchild)
    assert backend.cancel(ref) is True
    seconds_until_gone([grandchild], 2.0)
