"""Recurring runs of pipelines built from trainflow's components, under kfp.local with its execution cache ON.

kfp.local caches a task when ``local.init(enable_caching=True)`` and the task's caching option is on, keyed on
the component, image, command and arguments, as a KFP backend's cache hit skips a task whose inputs match an
earlier run's. A plain component in the same pipeline is the control: it is served from the cache on the second
run, so the cache was really on. The steps run on the local engine; nothing is installed.

(No ``from __future__ import annotations``: KFP reads the real annotations of pipelines defined here.)
"""

from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, dsl, local

from bounds import HANG
from trainflow.core import JobState, get_backend
from trainflow.kfp import get_train_job, train_job, wait_train_job

IMAGE = "python:3.11"
# it writes a model and reports a metric, as a real trainer does
TRAINER = (
    "from trainflow.core import output_dir, report; "
    "(output_dir() / 'w.txt').write_text('1'); report(metrics={'loss': 0.5})"
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    home, root = tmp_path / "home", tmp_path / "root"
    monkeypatch.delenv("TRAINFLOW_HOME", raising=False)
    for name in ("KFP_RUN_ID", "KFP_TASK_NAME", "KFP_POD_NAME"):
        monkeypatch.delenv(name, raising=False)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        raise_on_error=True,
        enable_caching=True,
    )
    return {"home": home, "root": root, "backend_config": {"home": str(home)}, "marker": tmp_path / "control"}


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def control(marker: str) -> str:
    """A plain component, cached as kfp caches by default: it appends a line each time it really runs."""
    with open(marker, "a") as fh:
        fh.write("ran\n")
    return "prepared"


def job_names(home: Path) -> list[str]:
    base = home / "jobs" / "default"
    return sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) if base.exists() else []


def train_args(env: dict[str, Any]) -> dict[str, Any]:
    return dict(
        runtime="torch-distributed",
        command=["python", "-c", TRAINER],
        num_nodes=1,
        backend="local",
        backend_config=env["backend_config"],
    )


def test_a_recurring_run_with_the_same_arguments_trains_again(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    @dsl.pipeline
    def nightly() -> None:
        ready = control(marker=str(env["marker"]))
        trained = train_job(**train_args(env)).after(ready)
        wait_train_job(
            job_name=trained.outputs["job_name"], backend="local", backend_config=env["backend_config"]
        )

    nightly()
    nightly()  # the next scheduled run: same arguments
    out = capfd.readouterr().out
    assert env["marker"].read_text() == "ran\n"  # the control came from the cache the second time
    names = job_names(env["home"])
    assert len(names) == 2, names  # trained twice
    be = get_backend("local", home=env["home"])
    assert all(be.get(n).state is JobState.COMPLETE for n in names)
    assert out.count("Submitted TrainJob default/") == 2


def test_caching_a_training_step_is_an_explicit_opt_in(
    env: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    @dsl.pipeline
    def cached_on_purpose() -> None:
        train_job(**train_args(env)).set_caching_options(True)

    cached_on_purpose()
    cached_on_purpose()
    assert len(job_names(env["home"])) == 1  # the second run took the first run's outputs from the cache
    assert capfd.readouterr().out.count("Submitted TrainJob default/") == 1


def test_state_steps_never_return_a_cached_state(
    env: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    be = get_backend("local", home=env["home"])
    gate = tmp_path / "gate"
    ref = be.submit(
        {
            "command": [
                "python3",
                "-c",
                f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)",
            ],
            "num_nodes": 1,
            "name": "made-elsewhere",
        }
    )

    @dsl.pipeline
    def look() -> None:
        get_train_job(job_name=ref.name, backend="local", backend_config=env["backend_config"])

    look()
    first = capfd.readouterr().out
    gate.touch()
    be.wait(ref, timeout=HANG)
    look()  # same arguments, the job has changed meanwhile
    second = capfd.readouterr().out
    assert "TrainJob default/made-elsewhere: Complete" not in first
    assert "TrainJob default/made-elsewhere: Complete" in second


def _caching(doc: dict[str, Any]) -> dict[str, Any]:
    """Every container task's caching options in a compiled pipeline, by its path in the DAGs."""
    found: dict[str, Any] = {}

    def walk(dag: dict[str, Any], prefix: str) -> None:
        for name, task in dag["tasks"].items():
            component = doc["components"][task["componentRef"]["name"]]
            if "dag" in component:
                walk(component["dag"], f"{prefix}{name}/")
            else:
                found[prefix + name] = task.get("cachingOptions", {})

    walk(doc["root"]["dag"], "")
    return found


def test_compiled_pipelines_leave_the_cache_off_unless_a_task_opts_in(tmp_path: Path) -> None:
    @dsl.pipeline
    def sub(command: list) -> None:
        train_job(command=command)

    @dsl.pipeline
    def pipeline() -> None:
        trained = train_job(command=["a"])
        wait_train_job(job_name=trained.outputs["job_name"])
        get_train_job(job_name=trained.outputs["job_name"])
        with dsl.ParallelFor(items=[1, 2]):
            train_job(command=["b"])
        sub(command=["c"])
        train_job(command=["d"]).set_caching_options(True)
        control(marker="x")

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    caching = _caching(yaml.safe_load(out.read_text()))
    opted_in = {k for k, v in caching.items() if v.get("enableCache")}
    assert opted_in == {"train-job-3", "control"}, caching  # the opt-in, and kfp's default for the others
    assert {"train-job", "wait-train-job", "get-train-job", "for-loop-2/train-job-2", "sub/train-job"} <= set(
        caching
    )
