"""The default ``train_job`` component with no identity arguments, run by the real kfp.local orchestrator.

kfp.local is the oracle for what a step sees: it lays out output artifacts per run, task and ParallelFor
iteration, and it retries a failed task (``set_retry``) with the same executor input, as the KFP backend does.
The steps run on the local engine; nothing is installed (SubprocessRunner without a venv).

(No ``from __future__ import annotations``: KFP reads the real annotations of pipelines defined here.)
"""

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl, local

from trainflow.core import JobState, get_backend
from trainflow.kfp import train_job


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    home, root = tmp_path / "home", tmp_path / "root"
    monkeypatch.delenv("TRAINFLOW_HOME", raising=False)
    for name in ("KFP_RUN_ID", "KFP_TASK_NAME"):
        monkeypatch.delenv(name, raising=False)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    return {"home": home, "root": root, "backend_config": {"home": str(home)}}


def job_names(home: Path) -> list[str]:
    base = home / "jobs" / "default"
    return sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) if base.exists() else []


def step_processes(root: Path) -> list[int]:
    """The running step of this pipeline root: the kfp executor (and its sh wrapper), found by command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kfp.dsl.executor_main" in cmdline and str(root).encode() in cmdline:
            found.append(int(proc.name))
    return found


def kill_step_once_trainer_runs(root: Path, pids: Path, killed: list[int]) -> threading.Thread:
    """Lose the step's pod: SIGKILL the step's processes once the trainer is up; the TrainJob keeps running."""

    def run() -> None:
        deadline = time.monotonic() + 120
        while not list(pids.glob("pid-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in step_processes(root):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_retried_step_without_identity_arguments_reattaches(
    env: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINFLOW_DASHBOARD_URL_TEMPLATE", "https://dash.example/{namespace}/{name}")
    pids = tmp_path / "pids"
    pids.mkdir()
    trainer = (
        "import os, time; from trainflow.core import output_dir, report; "
        f"open(os.path.join({str(pids)!r}, 'pid-%d' % os.getpid()), 'w').close(); time.sleep(8); "
        "(output_dir() / 'model.txt').write_text('w=1'); report(metrics={'loss': 0.25})"
    )

    @dsl.pipeline
    def no_boilerplate() -> None:
        train_job(
            runtime="torch-distributed",
            command=["python", "-c", trainer],  # "python": kfp.local rewrites 'python3' in arguments
            num_nodes=1,
            backend="local",
            backend_config=env["backend_config"],
        ).set_retry(num_retries=1)

    killed: list[int] = []
    killer = kill_step_once_trainer_runs(env["root"], pids, killed)
    no_boilerplate()
    killer.join(timeout=5)
    out = capfd.readouterr().out
    assert killed, "the first try of the step was never killed"
    (name,) = job_names(env["home"])  # one TrainJob for both tries
    assert len(list(pids.glob("pid-*"))) == 1  # its trainer ran once
    assert f"Submitted TrainJob default/{name} (attempt 1)" in out
    assert f"Reattaching to running TrainJob default/{name} (attempt 1)" in out
    assert get_backend("local", home=env["home"]).get(name).state is JobState.COMPLETE

    (step,) = env["root"].glob("no-boilerplate-*/train-job")
    outputs = json.loads((step / "executor_output.json").read_text())
    assert outputs["parameterValues"] == {"job_name": name, "namespace": "default", "state": "Complete"}
    assert (step / "model" / "model.txt").read_text() == "w=1"
    text = (step / "summary").read_text()
    assert text.startswith(f"## TrainJob `default/{name}`: Complete\n")
    assert f"| TrainJob | [`default/{name}`](https://dash.example/default/{name}) |" in text
    assert f"| launch | Reattaching to running TrainJob default/{name} (attempt 1) |" in text
    assert "| loss | 0.25 |" in text and "| Model artifact | 1 file(s): `model.txt` |" in text


def test_parallel_for_iterations_with_identical_arguments_get_their_own_trainjobs(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    @dsl.pipeline
    def fan_out() -> None:
        with dsl.ParallelFor(items=[1, 2]):
            train_job(
                runtime="torch-distributed",
                command=["python", "-c", "print('same arguments')"],
                num_nodes=1,
                backend="local",
                backend_config=env["backend_config"],
            )

    fan_out()
    out = capfd.readouterr().out
    names = job_names(env["home"])
    assert len(names) == 2
    steps = sorted(env["root"].glob("fan-out-*/for-loop-*-iteration-*/train-job"))
    assert [s.parent.name.rsplit("-", 1)[1] for s in steps] == ["0", "1"]
    produced = sorted(
        json.loads((s / "executor_output.json").read_text())["parameterValues"]["job_name"] for s in steps
    )
    assert produced == names
    keys = {
        line.rsplit("key ", 1)[1].rstrip(")") for line in out.splitlines() if "Submitted TrainJob" in line
    }
    assert len(keys) == 2 and all(k.startswith("train-job/") for k in keys), keys
    be = get_backend("local", home=env["home"])
    assert all(be.get(n).state is JobState.COMPLETE for n in names)
