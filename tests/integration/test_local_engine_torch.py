"""Local engine with real torch distributed (gloo, CPU) under unmodified torchrun commands.

2 nodes x 2 processes all-reduce read from another process; a failing rank; cancel of torchrun jobs,
whose workers run in their own sessions (so killing process groups alone would leave orphans), and a SIGKILL
of the supervisor's process group (supervisor and guard) that leaves none either.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import JobState, TrainJobFailed, TrainJobNotFound, get_backend
from trainflow.core.local import store
from trainflow.core.local.engine import LocalBackend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * HANG)]  # a backstop above the waits' hang detector

SCRIPTS = Path(__file__).parent / "scripts"
RANK_LINE = re.compile(r"rank=(\d) world=4 ")
READY = re.compile(r"rank=\d pid=\d+ ready")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "tfhome"
    path.mkdir()
    return path


@pytest.fixture
def backend(home: Path) -> Iterator[LocalBackend]:
    be = get_backend("local", home=home, namespace="tests")
    assert isinstance(be, LocalBackend)
    yield be
    for job in be.list():
        be.cancel(job.name)


def cli(home: Path, *args: str) -> str:
    """Run the ``trainflow`` console script (another process) against this test's home."""
    exe = Path(sys.executable).parent / "trainflow"
    proc = subprocess.run(
        [str(exe), "--backend", "local", "--home", str(home), "-n", "tests", *args],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def train_here(x: int, out_name: str = "fn.json") -> None:
    """A function trainer: shipped as source, called with JSON kwargs under torchrun."""
    import json as _json
    import os as _os

    from trainflow.core import output_dir, report

    if _os.environ.get("RANK", "0") == "0":
        (output_dir() / out_name).write_text(_json.dumps({"x": x, "world": _os.environ.get("WORLD_SIZE")}))
    report(metrics={"x": float(x)})


def test_two_by_two_allreduce_completes_and_is_read_from_another_process(
    backend: LocalBackend, home: Path
) -> None:
    start = time.monotonic()
    backend.submit(
        {
            "name": "allreduce",
            "command": ["torchrun", str(SCRIPTS / "allreduce.py")],
            "num_nodes": 2,
            "proc_per_node": 2,
        }
    )
    code = textwrap.dedent(
        """
        import json
        from trainflow.core import get_backend
        backend = get_backend("local", home=sys.argv[1], namespace="tests")
        result = backend.wait("allreduce", timeout=float(sys.argv[2]))
        logs = {s: list(backend.logs("allreduce", step=s)) for s in ("node-0", "node-1")}
        print(json.dumps({"result": result.to_dict(), "logs": logs}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code, str(home), str(HANG)],
        capture_output=True,
        text=True,
        timeout=2 * HANG,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    result = seen["result"]
    assert result["state"] == "Complete", result
    assert result["metrics"] == {"sum": 10.0, "world": 4.0, "note": "ok"}  # 1+2+3+4 over 4 ranks
    # the ranks of a node share its stdout, as the processes of a pod's container do, so another rank's
    # multi-write stderr message (gloo's connect notice) can land mid-line: find the lines, not line starts
    ranks = {node: sorted(RANK_LINE.findall("\n".join(lines))) for node, lines in seen["logs"].items()}
    assert ranks == {"node-0": ["0", "1"], "node-1": ["2", "3"]}, seen["logs"]
    out = Path(result["output_uri"].removeprefix("file://"))
    assert json.loads((out / "result.json").read_text()) == {"sum": 10.0, "world": 4}
    # the same, through the CLI in yet another process
    status = json.loads(cli(home, "status", "allreduce", "--json"))
    assert status["state"] == "Complete" and status["metrics"]["sum"] == 10.0
    node1 = cli(home, "logs", "allreduce", "--step", "node-1").splitlines()
    assert sorted(RANK_LINE.findall("\n".join(node1))) == ["2", "3"], node1
    print(f"2x2 torch job end-to-end: {elapsed:.1f}s")


def test_failing_rank_fails_the_job_with_rank_exit_code_and_log_tail(backend: LocalBackend) -> None:
    ref = backend.submit(
        {
            "name": "rankfail",
            "command": ["torchrun", str(SCRIPTS / "failing_rank.py")],
            "num_nodes": 2,
            "proc_per_node": 2,
            "env": {"FAIL_RANK": "3", "FAIL_CODE": "7"},
        }
    )
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=HANG)
    err = info.value
    assert err.result.reason == "NodeFailed" and "node 1" in (err.result.message or "")
    assert "rank 3 exited with code 7" in (err.result.message or "")
    (failed,) = err.diagnostics.failed_ranks
    assert failed["node"] == 1 and failed["exit_code"] == 1  # torchrun's own exit code
    assert failed["rank"] == 3 and failed["worker_exit_code"] == 7  # from torchrun's root-cause report
    text = str(err)
    assert "rank=3" in text and "worker_exit_code=7" in text
    assert "rank=3 boom: simulated failure" in text  # the failing node's log tail
    uid = json.loads((backend.job_dir(ref) / "trainjob.json").read_text())["metadata"]["uid"]
    assert store.marked_processes(uid) == []  # node 0's ranks were stopped too


def test_cancel_torchrun_job_leaves_no_rank_behind(backend: LocalBackend, home: Path) -> None:
    ref = backend.submit(
        {
            "name": "cancelranks",
            "command": ["torchrun", str(SCRIPTS / "sleepy_rank.py"), str(HANG)],  # until cancelled
            "num_nodes": 2,
            "proc_per_node": 2,
        }
    )
    uid = json.loads((backend.job_dir(ref) / "trainjob.json").read_text())["metadata"]["uid"]
    deadline = time.monotonic() + HANG  # torch imports in 2 agents: minutes on a loaded 2-core CI
    pids: list[int] = []
    while time.monotonic() < deadline:  # 2 torchrun agents + 4 ranks
        pids = store.marked_processes(uid)
        # Ranks share their agent's stdout: unbuffered prints may interleave within a line.
        text = "\n".join(line for step in ("node-0", "node-1") for line in backend.logs(ref, step=step))
        ready = len(READY.findall(text))
        if ready == 4 and len(pids) >= 6:
            break
        time.sleep(0.2)
    assert ready == 4 and len(pids) >= 6, (ready, pids)
    assert cli(home, "cancel", "cancelranks").strip() == "cancelled cancelranks"
    assert [p for p in pids if store.pid_alive(p)] == []
    assert store.marked_processes(uid) == []
    with pytest.raises(TrainJobNotFound):
        backend.get(ref)


def test_function_trainer_runs_under_torchrun(backend: LocalBackend) -> None:
    ref = backend.submit(
        {"name": "fn", "function": train_here, "function_kwargs": {"x": 5}, "proc_per_node": 1}
    )
    result = backend.wait(ref, timeout=HANG)
    assert result.state is JobState.COMPLETE and result.metrics == {"x": 5.0}
    out = Path((result.output_uri or "").removeprefix("file://"))
    assert json.loads((out / "fn.json").read_text()) == {"x": 5, "world": "1"}


def test_a_group_sigkill_of_supervisor_and_guard_leaves_no_torchrun_rank_behind(
    backend: LocalBackend,
) -> None:
    """Issue 33: ``kill -KILL -<pgid>`` of the supervisor and its guard; each node's lifeline wrapper stops its
    torchrun agent and the workers it started in their own sessions, with no engine call (bound: 5 s,
    docs/reliability.md 33.2)."""
    ref = backend.submit(
        {
            "name": "groupkill",
            "command": ["torchrun", str(SCRIPTS / "sleepy_rank.py"), str(HANG)],  # until killed
            "num_nodes": 2,
            "proc_per_node": 2,
        }
    )
    job = backend.job_dir(ref)
    uid = json.loads((job / "trainjob.json").read_text())["metadata"]["uid"]
    deadline = time.monotonic() + HANG  # torch imports in 2 agents: minutes on a loaded 2-core CI
    pids: list[int] = []
    while time.monotonic() < deadline:  # 2 wrappers + 2 torchrun agents + 4 ranks
        pids = store.marked_processes(uid)
        text = "\n".join(line for step in ("node-0", "node-1") for line in backend.logs(ref, step=step))
        ready = len(READY.findall(text))
        if ready == 4 and len(pids) >= 8:
            break
        time.sleep(0.2)
    assert ready == 4 and len(pids) >= 8, (ready, pids)
    guard = json.loads((job / store.SPAWN_FILE).read_text())["pid"]
    group = os.getpgid(guard)
    assert all(os.getpgid(p) != group for p in pids)
    os.killpg(group, signal.SIGKILL)
    start = time.monotonic()
    while time.monotonic() - start < 5.0 and any(store.pid_alive(p) for p in pids):
        time.sleep(0.02)
    took, left = time.monotonic() - start, [p for p in pids if store.pid_alive(p)]
    store.kill_marked(uid)  # never leave them behind, even when the test fails
    assert left == [], f"still running 5 s after the group SIGKILL: {left}"
    print(f"{len(pids)} processes of 2 torchrun nodes stopped {took:.2f} s after the group SIGKILL")
    result = backend.get(ref)
    assert result.state is JobState.FAILED and result.reason == "SupervisorLost", result
