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

from bounds import HANG
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


def kill_step_once_trainer_runs(
    root: Path, pids: Path, killed: list[int], capfd: pytest.CaptureFixture[str], seen: list[str]
) -> threading.Thread:
    """Lose the step's pod: SIGKILL the step's processes once the trainer is up; the TrainJob keeps running.

    The trainer then waits for a gate file, which opens once the retried step has said it reattached: however
    slow the retry is to start under load, the job is still running when it looks. What the steps print is
    gathered in ``seen``.
    """

    def run() -> None:
        deadline = time.monotonic() + HANG
        while not list(pids.glob("pid-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in step_processes(root):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        deadline = time.monotonic() + HANG
        while "Reattaching to running TrainJob" not in "".join(seen) and time.monotonic() < deadline:
            seen.append(capfd.readouterr().out)
            time.sleep(0.1)
        (pids / "gate").touch()

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
        f"open(os.path.join({str(pids)!r}, 'pid-%d' % os.getpid()), 'w').close(); "
        f"gate = {str(pids / 'gate')!r}; [time.sleep(0.1) for _ in range({int(HANG * 10)}) if not os.path.exists(gate)]; "
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
    seen: list[str] = []
    killer = kill_step_once_trainer_runs(env["root"], pids, killed, capfd, seen)
    no_boilerplate()
    killer.join(timeout=5)
    out = "".join(seen) + capfd.readouterr().out
    assert killed, "the first try of the step was never killed"
    (name,) = job_names(env["home"])  # one TrainJob for both tries
    assert len(list(pids.glob("pid-*"))) == 1  # its trainer ran once
    assert f"Submitted TrainJob default/{name} (attempt 1)" in out
    assert f"Reattaching to running TrainJob default/{name} (attempt 1)" in out
    assert get_backend("local", home=env["home"]).get(name).state is JobState.COMPLETE

    (step,) = env["root"].glob("no-boilerplate-*/train-job")
    outputs = json.loads((step / "executor_output.json").read_text())
    written = outputs["parameterValues"]
    assert {k: written[k] for k in ("job_name", "namespace", "state")} == {
        "job_name": name,
        "namespace": "default",
        "state": "Complete",
    }
    assert json.loads(written["result"])["metrics"] == {"loss": 0.25}
    assert (step / "model" / "model.txt").read_text() == "w=1"
    text = (step / "summary").read_text()
    assert text.startswith(f"## TrainJob `default/{name}`: Complete\n")
    assert f"| TrainJob | [`default/{name}`](https://dash.example/default/{name}) |" in text
    assert f"| launch | Reattaching to running TrainJob default/{name} (attempt 1) |" in text
    assert "| loss | 0.25 |" in text and "| Model artifact | 1 file(s): `model.txt` |" in text


PAIR = {"run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER, "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER}


def same_step(env: dict[str, Any], identity: dict[str, str]) -> Any:
    """A train_job task whose arguments are the same wherever it is used."""
    return train_job(
        runtime="torch-distributed",
        command=["python", "-c", "print('same arguments')"],
        num_nodes=1,
        backend="local",
        backend_config=env["backend_config"],
        **identity,
    )


@pytest.mark.parametrize("identity", [{}, PAIR], ids=["no-identity-arguments", "run-id-and-task-name"])
def test_parallel_for_iterations_with_identical_arguments_get_their_own_trainjobs(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str], identity: dict[str, str]
) -> None:
    @dsl.pipeline
    def fan_out() -> None:
        with dsl.ParallelFor(items=[1, 2]):
            same_step(env, identity)

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
    if identity:  # kfp.local resolves the placeholders: both iterations have one run id and task name
        (run,) = {k.split("/")[1] for k in keys}
        assert run.isdigit()
    be = get_backend("local", home=env["home"])
    assert all(be.get(n).state is JobState.COMPLETE for n in names)


def test_a_sub_pipeline_used_twice_gets_two_trainjobs(env: dict[str, Any]) -> None:
    @dsl.pipeline
    def train_once(tag: str) -> None:
        same_step(env, PAIR)

    @dsl.pipeline
    def twice() -> None:
        train_once(tag="a")
        train_once(tag="b")  # the tag is not a train_job argument: the steps' arguments are identical

    twice()
    assert len(job_names(env["home"])) == 2


TRAINER_MODULE = """
import time

from trainflow.core import output_dir, report


def train(seconds: float) -> dict:
    time.sleep(seconds)
    (output_dir() / "model.txt").write_text("w=3")
    report(metrics={"loss": 0.125, "accuracy": 0.75})
    return {"best_epoch": 7, "classes": ["a", "b"]}
"""


def test_a_step_retried_after_its_trainjob_completed_publishes_what_a_fresh_run_does(
    env: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The first try gives up waiting (timeout) while the trainer runs; kfp.local's retry finds the TrainJob
    Complete and reuses it. Its outputs (result with metrics and return value, Metrics, Model, summary) are
    those of a fresh run of the same step."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "reuse_trainer.py").write_text(TRAINER_MODULE)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")]))
    )
    args = dict(
        runtime="torch-distributed",
        function="reuse_trainer:train",
        function_kwargs={"seconds": 4},
        num_nodes=1,
        backend="local",
        backend_config=env["backend_config"],
    )

    @dsl.pipeline
    def retried() -> None:
        # a try gives up after 2 s; the next one starts 15 s later (30 s for a third), when the job is done
        train_job(**args, timeout=2.0).set_retry(num_retries=2, backoff_duration="15s")

    @dsl.pipeline
    def fresh() -> None:
        train_job(**args)

    retried()
    out = capfd.readouterr().out
    (name,) = job_names(env["home"])
    assert "timeout=2.0s" in out and f"TrainJob default/{name} already completed" in out
    fresh()

    def outputs(pipeline: str) -> dict[str, Any]:
        (step,) = env["root"].glob(f"{pipeline}-*/train-job")
        written = json.loads((step / "executor_output.json").read_text())
        result = json.loads(written["parameterValues"]["result"])
        model = written["artifacts"]["model"]["artifacts"][0]["metadata"]
        summary = (step / "summary").read_text()
        return {
            "state": result["state"],
            "metrics": result["metrics"],
            "return_value": result["return_value"],
            "Metrics": written["artifacts"]["metrics"]["artifacts"][0]["metadata"],
            "Model": {k: model[k] for k in ("metrics", "files", "state", "runtime", "framework")},
            "model.txt": (step / "model" / "model.txt").read_text(),
            "summary metrics": summary[summary.index("### Metrics") :],
        }

    reused, new = outputs("retried"), outputs("fresh")
    assert reused == new
    assert reused["return_value"] == {"best_epoch": 7, "classes": ["a", "b"]}
    assert reused["metrics"] == reused["Metrics"] == {"loss": 0.125, "accuracy": 0.75}
