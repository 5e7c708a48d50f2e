"""trainflow's KFP components under the real kfp.local SubprocessRunner on the real local engine.

(No ``from __future__ import annotations``: KFP reads the real annotations of components defined here.)

Components are built with install_kfp_package=False and no packages, so nothing is downloaded; the
component subprocesses and the trainer processes import trainflow and dags_examples from this checkout.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kfp import local

from bounds import HANG
from browser import chart_points, chromium, record_requests, screenshot
from trainflow.core import JobState, get_backend
from trainflow.kfp import make_train_job_component, make_wait_train_job_component

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "dags_examples"
IMAGE = "python:3.11"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A fresh local-engine home and pipeline root; dags_examples importable by steps and trainers."""
    home = tmp_path / "home"
    root = tmp_path / "root"
    path = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv("TRAINFLOW_HOME", raising=False)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    return {"home": home, "root": root, "backend_config": {"home": str(home)}}


def job_dirs(home: Path) -> list[Path]:
    base = home / "jobs" / "default"
    return sorted(p for p in base.iterdir() if not p.name.startswith(".")) if base.exists() else []


def train_op() -> Any:
    return make_train_job_component(base_image=IMAGE, packages_to_install=(), install_kfp_package=False)


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "kfp_train_pipeline_local", EXAMPLES / "kfp_train_pipeline.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_pipeline_trains_evaluates_and_promotes(
    env: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    pipeline = load_example().build_pipeline(
        backend="local", base_image=IMAGE, install_kfp_package=False, backend_config=env["backend_config"]
    )
    started = time.monotonic()
    pipeline()
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    print(f"example pipeline ran in {elapsed:.1f}s")  # recorded with -s / in the report
    (run_dir,) = list(env["root"].iterdir())

    # one TrainJob, Complete, trained by 2 nodes x 2 procs
    (jobdir,) = job_dirs(env["home"])
    result = get_backend("local", home=env["home"]).get(jobdir.name)
    assert result.state is JobState.COMPLETE
    assert json.loads((jobdir / "output" / "training.json").read_text())["world_size"] == 4
    assert "world_size=4" in out

    # the Model artifact holds the trainer's weights, byte for byte, and they load with torch
    model_dir = run_dir / "train-job" / "model"
    assert (model_dir / "model.pt").read_bytes() == (jobdir / "output" / "model.pt").read_bytes()
    state = torch.load(model_dir / "model.pt", weights_only=True)
    assert torch.allclose(state["weight"], torch.tensor([[3.0, -2.0]]), atol=0.05)

    # Metrics: train_loss from the trainer; mse from the evaluate step that loaded the weights
    train_metrics = json.loads((run_dir / "train-job" / "executor_output.json").read_text())
    logged = train_metrics["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert logged["train_loss"] < 0.01
    model_meta = train_metrics["artifacts"]["model"]["artifacts"][0]["metadata"]
    assert model_meta["job_name"] == jobdir.name and model_meta["runtime"] == "torch-distributed"
    assert model_meta["framework"] == "torch" and "model.pt" in model_meta["files"]
    assert f"evaluate: loaded {model_dir / 'model.pt'} from TrainJob {jobdir.name}" in out
    eval_out = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())
    mse = eval_out["parameterValues"]["Output"]
    assert 0 <= mse < 0.01

    # dsl.If took the promote branch and registered the model
    registrations = list(run_dir.rglob("registration"))
    assert len(registrations) == 1
    record = json.loads(registrations[0].read_text())
    assert record["stage"] == "production" and record["job_name"] == jobdir.name and record["mse"] == mse
    assert "promote: registered" in out and "reject:" not in out

    # the HTML report: every report the trainer made (its own record) drawn, as Chromium parses the charts
    reports = [json.loads(line) for line in (jobdir / "reports.jsonl").read_text().splitlines()]
    expected = {"progress": sum("progressPercentage" in r for r in reports)}
    for name in ("loss", "train_loss", "world_size"):
        expected[name] = sum(name in r["metrics"] for r in reports)
    assert expected["loss"] >= 10 and expected["progress"] == len(reports)  # the acceptance floor
    running = [r for r in reports if r["progressPercentage"] < 100]
    assert all("estimatedRemainingSeconds" in r for r in running[1:])  # an ETA while it ran
    page_file = run_dir / "train-job" / "report"
    html = page_file.with_suffix(".html")  # KFP serves it as text/html; a file:// URL needs the suffix
    html.write_bytes(page_file.read_bytes())
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        fetched = record_requests(page)
        page.goto(html.as_uri())
        assert fetched == [html.as_uri()]  # self-contained: nothing else is fetched
        assert chart_points(page) == expected
        assert page.locator("#tf-state").inner_text() == "Complete (AllJobsCompleted)"
        assert jobdir.name in page.title()
        screenshot(page, "kfp-train-job-report", run_dir)


def test_a_step_with_the_same_idempotency_key_reuses_its_trainjob(env: dict[str, Any]) -> None:
    """Each single-step kfp.local call is a run of its own (its own output folder): only an explicit key makes two
    calls the same step; run_id/task_name do not (they label the key)."""
    op = train_op()
    kwargs = dict(
        runtime="torch-distributed",
        command=["python3", "-c", "import time; time.sleep(1); print('trained')"],
        num_nodes=1,
        backend="local",
        backend_config=env["backend_config"],
        idempotency_key="nightly-2026-12-01",
    )
    first = op(**kwargs)
    second = op(**kwargs)  # the same step again: same key and arguments
    assert first.outputs["job_name"] == second.outputs["job_name"]
    assert second.outputs["state"] == "Complete"
    assert [d.name for d in job_dirs(env["home"])] == [first.outputs["job_name"]]
    other = op(**{**kwargs, "idempotency_key": "nightly-2026-12-02"})  # another key is another job
    assert other.outputs["job_name"] != first.outputs["job_name"]
    assert len(job_dirs(env["home"])) == 2
    paired = {k: v for k, v in kwargs.items() if k != "idempotency_key"}
    labelled = op(**paired, run_id="run-123", task_name="train-job")
    again = op(**paired, run_id="run-123", task_name="train-job")  # another call: another output folder
    assert labelled.outputs["job_name"] != again.outputs["job_name"]
    assert len(job_dirs(env["home"])) == 4


def test_failed_trainjob_fails_the_step_with_reason(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    op = train_op()
    kwargs = dict(
        runtime="torch-distributed",
        command=["python3", "-c", "import sys; print('bad batch', flush=True); sys.exit(3)"],
        num_nodes=1,
        backend="local",
        backend_config=env["backend_config"],
        idempotency_key="run-fail/train-job",  # the second call below is a retry of this step
    )
    with pytest.raises(RuntimeError, match="FAILURE"):
        op(**kwargs)
    out = capfd.readouterr().out
    assert "[trainflow] ERROR: TrainJob default/" in out and "failed" in out
    assert (
        "exit" in out and "3" in out and "bad batch" in out
    )  # reason, exit code and log tail in the step log
    (jobdir,) = job_dirs(env["home"])
    assert get_backend("local", home=env["home"]).get(jobdir.name).state is JobState.FAILED

    # a retry of the failed step trains again (new attempt), it does not re-read the old failure
    with pytest.raises(RuntimeError, match="FAILURE"):
        op(**kwargs)
    out = capfd.readouterr().out
    assert f"Earlier attempt 1: TrainJob default/{jobdir.name} Failed" in out
    assert "Submitted TrainJob default/" in out and "(attempt 2)" in out
    assert len(job_dirs(env["home"])) == 2


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"num_nodes": -2}, "num_nodes"),
        ({"secret_env": {"API_KEY": "not-a-ref"}}, "secret_env.API_KEY"),
        ({"env": {"DB_PASSWORD": "hunter2"}}, "env.DB_PASSWORD"),
        ({"runtime": "no-such-runtime"}, "runtime"),
        ({"on_cancel": "explode"}, "on_cancel"),
    ],
)
def test_bad_input_fails_before_any_job_exists(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str], bad: dict[str, Any], field: str
) -> None:
    kwargs = dict(
        runtime="torch-distributed",
        command=["python3", "-c", "print(1)"],
        backend="local",
        backend_config=env["backend_config"],
        run_id="run-bad",
        task_name="train-job",
    )
    with pytest.raises(RuntimeError, match="FAILURE"):
        train_op()(**{**kwargs, **bad})
    out = capfd.readouterr().out
    assert "invalid TrainJob request" in out and f"{field}:" in out and "nothing was submitted" in out
    errors = [line for line in out.splitlines() if "[trainflow] ERROR" in line]
    assert errors and not any("hunter2" in line for line in errors)  # the value is not echoed in the error
    assert job_dirs(env["home"]) == []


def test_wait_train_job_for_a_job_created_elsewhere(env: dict[str, Any]) -> None:
    be = get_backend("local", home=env["home"])
    ref = be.submit(
        {"command": ["python3", "-c", "print('elsewhere')"], "num_nodes": 1, "name": "made-elsewhere"}
    )
    op = make_wait_train_job_component(base_image=IMAGE, packages_to_install=(), install_kfp_package=False)
    task = op(job_name=ref.name, backend="local", backend_config=env["backend_config"], timeout=HANG)
    assert task.outputs["state"] == "Complete"
    assert json.loads(task.outputs["result"])["name"] == "made-elsewhere"
    summary = Path(task.outputs["summary"].path).read_text()
    assert summary.startswith("## TrainJob `default/made-elsewhere`: Complete")


STEP_SCRIPT = """
import json
import signal
import sys
from kfp import local

# Like a launcher that outlives its command: keep streaming the step's log after SIGTERM (a Python handler,
# unlike SIG_IGN, is not inherited by the step process).
signal.signal(signal.SIGTERM, lambda *_: None)
from trainflow.kfp import make_train_job_component

local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1])
op = make_train_job_component(base_image="python:3.11", packages_to_install=(), install_kfp_package=False)
op(**json.loads(sys.argv[2]))
"""


def step_kwargs(home: Path, pids: Path, on_cancel: str, sleep: float) -> dict[str, Any]:
    """A 2-node job whose trainers record their pids, then sleep ``sleep`` seconds or until the file ``release``
    appears in ``pids``."""
    code = (
        "import os, time; "
        f"open(os.path.join({str(pids)!r}, 'pid-%d' % os.getpid()), 'w').write(str(os.getpid())); "
        f"end = time.monotonic() + {sleep}\n"
        f"while time.monotonic() < end and not os.path.exists(os.path.join({str(pids)!r}, 'release')):\n"
        "    time.sleep(0.2)"
    )
    return dict(
        runtime="torch-distributed",
        command=["python3", "-c", code],
        num_nodes=2,
        backend="local",
        backend_config={"home": str(home)},
        idempotency_key="run-term/train-job",  # a restarted step (another kfp.local call) is the same step
        on_cancel=on_cancel,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _start_step(
    tmp_path: Path, home: Path, on_cancel: str, sleep: float = 600
) -> tuple[subprocess.Popen[bytes], Path, Path, dict[str, Any]]:
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent(STEP_SCRIPT))
    log = tmp_path / "step.log"
    kwargs = step_kwargs(home, pids, on_cancel, sleep)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "root"), json.dumps(kwargs)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, like a step container signalled as a whole
    )
    started, deadline = time.monotonic(), time.monotonic() + HANG
    while len(list(pids.glob("pid-*"))) < 2:  # both trainer nodes are running
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    (pids / "started-in").write_text(str(time.monotonic() - started))  # the step's measured start-up
    return proc, pids, log, kwargs


def test_sigterm_deletes_the_trainjob_and_stops_its_processes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc, pids, log, _ = _start_step(tmp_path, home, "delete")
    trainer_pids = [int(p.read_text()) for p in pids.glob("pid-*")]
    assert all(_alive(pid) for pid in trainer_pids)
    os.killpg(proc.pid, signal.SIGTERM)  # pipeline run terminated: the step's processes get SIGTERM
    proc.wait(timeout=HANG)
    deadline = time.monotonic() + HANG
    while any(_alive(pid) for pid in trainer_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    text = log.read_text()
    assert proc.returncode != 0, text
    assert "received signal 15" in text and "deleted" in text, text
    assert "FAILURE" in text, text  # the step failed (exit 143), it did not go green
    assert not any(_alive(pid) for pid in trainer_pids), "trainer processes survived the cancel"
    assert job_dirs(home) == [], "the TrainJob still exists after SIGTERM"
    assert get_backend("local", home=home).list() == []


def test_sigterm_with_on_cancel_keep_leaves_the_job_running(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc, pids, log, _ = _start_step(tmp_path, home, "keep")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=HANG)
    assert "on_cancel=keep" in log.read_text()
    assert all(_alive(int(p.read_text())) for p in pids.glob("pid-*"))
    be = get_backend("local", home=home)
    (job,) = be.list()
    assert job.state in (JobState.RUNNING, JobState.CREATED)
    assert be.cancel(job.name)  # clean up what we kept


def test_restarted_step_reattaches_to_the_running_trainjob(
    env: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    home = env["home"]
    proc, pids, _log, kwargs = _start_step(tmp_path, home, "delete")
    # the trainers run until released: 4x the first step's measured start-up after the restarted one begins,
    # so that one (kfp.local start-up, as slow on a loaded machine) finds them running
    release_after = 4 * float((pids / "started-in").read_text()) + 5
    timer = threading.Timer(release_after, (pids / "release").touch)
    timer.daemon = True
    timer.start()
    os.killpg(proc.pid, signal.SIGKILL)  # the step's pod is lost: no chance to cancel anything
    proc.wait(timeout=HANG)
    (jobdir,) = job_dirs(home)
    assert get_backend("local", home=home).get(jobdir.name).state is JobState.RUNNING
    task = train_op()(**kwargs)  # the restarted step, same key and arguments
    assert task.outputs["job_name"] == jobdir.name and task.outputs["state"] == "Complete"
    assert f"Reattaching to running TrainJob default/{jobdir.name} (attempt 1)" in capfd.readouterr().out
    assert job_dirs(home) == [jobdir]
    assert len(list(pids.glob("pid-*"))) == 2  # the trainers ran once, not twice


def test_dataset_artifact_reaches_the_trainer(env: dict[str, Any], capfd: pytest.CaptureFixture[str]) -> None:
    from kfp import dsl

    @dsl.component(base_image=IMAGE, install_kfp_package=False)
    def make_data(data: dsl.Output[dsl.Dataset]) -> None:
        with open(data.path, "w") as fh:
            fh.write("x,y\n1,2\n")

    op = train_op()

    @dsl.pipeline
    def with_dataset() -> None:
        data = make_data()
        op(
            runtime="torch-distributed",
            command=[
                "python3",
                "-c",
                "import os; print('rows', open(os.environ['TRAINFLOW_DATASET_PATH']).read().count('\\n'))",
            ],
            num_nodes=1,
            backend="local",
            backend_config=env["backend_config"],
            run_id="run-data",
            task_name="train-job",
            dataset=data.outputs["data"],
        )

    with_dataset()
    assert "[node-0] rows 2" in capfd.readouterr().out
