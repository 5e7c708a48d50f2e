"""The same retry scenario through the CLI, the KFP step and an Airflow task, on the local engine and on the
testbed: every adapter launches through ``lifecycle.launch``, so each gives the same sequence of TrainJobs.

Scenario, one identity, five launches, each in a process of its own (as a retry is):
1. first launch                      -> creates attempt 1 (held running)
2. launch again while it runs        -> reattaches to it; then the job completes
3. launch again                      -> reuses the completed job, creates nothing
4. the job is deleted; launch again  -> creates attempt 1 anew (held); then it fails
5. launch again                      -> creates attempt 2 (held); then it completes
Expected names: [A, A, A, A, A-2] (A-2: A's stable hash with the attempt suffix). A running job is held and released from the test: on the local engine through
a control file the trainer waits for, on the testbed through kwok's stage annotations on the pod (as a node would
finish or fail it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bounds import HANG
from conftest import KWOK_COMPLETE_DELAY, KWOK_FAIL_LABEL, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUNNER = REPO / "tests" / "airflow" / "dag_runner.py"
DAGS = Path(__file__).resolve().parent / "dags"
LOGICAL = "2026-03-01T00:00:00"
IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
SUMMARY = re.compile(
    r"(Submitted TrainJob|Reattaching to running TrainJob|TrainJob) (?P<ns>[a-z0-9-]+)/(?P<name>[a-z0-9-]+)"
    r"( \(attempt (?P<attempt>\d+)\)| already completed)"
)
# The trainer on the local engine: wait for the control file, then exit as it says ("ok" or "fail").
GATE = (
    "import os, sys, time\n"
    "path = os.environ['SCENARIO_CONTROL']\n"
    "while not os.path.exists(path): time.sleep(0.1)\n"
    "sys.exit(0 if open(path).read().strip() == 'ok' else 3)\n"
)


@dataclass
class Step:
    action: str  # "created" | "reattached" | "reused"
    name: str
    attempt: int | None


def parse(text: str) -> Step | None:
    match = SUMMARY.search(text)
    if not match:
        return None
    verb = match.group(1)
    action = {"Submitted TrainJob": "created", "Reattaching to running TrainJob": "reattached"}.get(
        verb, "reused"
    )
    attempt = match.group("attempt")
    return Step(action, match.group("name"), int(attempt) if attempt else None)


class World:
    """One backend for the scenario: the request, how adapters reach the backend, how a job is finished."""

    def __init__(
        self,
        kind: str,
        tmp: Path,
        testbed: Any = None,
        k8s: Any = None,
        namespace: str = "",
        runtime: str = "",
    ) -> None:
        self.kind, self.tmp, self.testbed, self.k8s, self.namespace = kind, tmp, testbed, k8s, namespace
        self.home = tmp / "trainflow"
        self.control = tmp / "control"
        if kind == "local":
            self.request: dict[str, Any] = {
                "runtime": "jax-distributed",
                "num_nodes": 1,
                "command": ["python3", "-c", GATE],
                "env": {"SCENARIO_CONTROL": str(self.control)},
            }
        else:
            self.request = {
                "runtime": runtime,
                "runtime_kind": "TrainingRuntime",
                "num_nodes": 1,
                "image": IMAGE,
                "command": ["torchrun", "train.py"],
                "annotations": {KWOK_COMPLETE_DELAY: "3600s"},
            }

    def backend_args(self) -> list[str]:
        if self.kind == "local":
            return ["--backend", "local", "--home", str(self.home)]
        tb = self.testbed
        return [
            "--backend",
            "kubernetes",
            "--kubeconfig",
            str(tb.kubeconfig),
            "--context",
            tb.context,
            "-n",
            self.namespace,
        ]

    def backend_config(self) -> tuple[str, dict[str, Any]]:
        if self.kind == "local":
            return "local", {"home": str(self.home)}
        return "kubernetes", {"kubeconfig": str(self.testbed.kubeconfig), "context": self.testbed.context}

    def conn_extra(self) -> dict[str, Any]:
        if self.kind == "local":
            return {"backend": "local", "local_home": str(self.home)}
        tb = self.testbed
        return {
            "backend": "kubernetes",
            "kubeconfig_path": str(tb.kubeconfig),
            "context": tb.context,
            "namespace": self.namespace,
        }

    def backend(self) -> Any:
        from trainflow.core import get_backend

        name, config = self.backend_config()
        return get_backend(name, namespace=None if self.kind == "local" else self.namespace, **config)

    def finish(self, name: str, ok: bool) -> None:
        """End the held job: complete it (ok) or fail it."""
        if self.kind == "local":
            self.control.write_text("ok" if ok else "fail")
            return
        core = self.k8s.core
        selector = f"jobset.sigs.k8s.io/jobset-name={name}"
        pods = wait_until(
            lambda: core.list_namespaced_pod(self.namespace, label_selector=selector).items,
            HANG,
            f"pods of {name}",
        )
        pod = pods[0].metadata.name
        if ok:
            patch = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "0s"}}}
        else:
            patch = {"metadata": {"labels": {KWOK_FAIL_LABEL: "true"}}}
        core.patch_namespaced_pod(pod, self.namespace, patch)

    def reset_control(self) -> None:
        self.control.unlink(missing_ok=True)


class Adapter:
    """Runs one launch of the scenario's identity as a process of its own."""

    name = ""

    def __init__(self, world: World) -> None:
        self.world = world
        self.count = 0

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self.count += 1
        log = self.world.tmp / f"{self.name}-{self.count}.log"
        cmd, env = self.command()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, log


def base_env(world: World) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env.update(
        {
            "TRAINFLOW_HOME": str(world.home),
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{BIN}{os.pathsep}{env['PATH']}",
        }
    )
    return env


class Cli(Adapter):
    name = "cli"

    def command(self) -> tuple[list[str], dict[str, str]]:
        req = self.world.request
        args = [
            str(BIN / "trainflow"),
            *self.world.backend_args(),
            "submit",
            "--idempotency-key",
            "scenario/cli",
        ]
        args += ["--set", f"runtime={json.dumps(req['runtime'])}", "--set", f"num_nodes={req['num_nodes']}"]
        for key in ("runtime_kind", "image", "env", "annotations"):
            if key in req:
                args += ["--set", f"{key}={json.dumps(req[key])}"]
        return [*args, "--", *req["command"]], base_env(self.world)


class Kfp(Adapter):
    name = "kfp"

    def command(self) -> tuple[list[str], dict[str, str]]:
        backend, config = self.world.backend_config()
        params = {
            **{k: v for k, v in self.world.request.items() if k not in ("runtime_kind", "annotations")},
            "extra": {
                k: self.world.request[k] for k in ("runtime_kind", "annotations") if k in self.world.request
            },
            "backend": backend,
            "backend_config": config,
            "namespace": self.world.namespace or None,
            "run_id": "run-scenario",
            "task_name": "train-job",
            "stream_logs": False,
        }
        script = (
            "import json, sys\nfrom trainflow.kfp.runner import run_train_job\n"
            "print(run_train_job(json.loads(sys.argv[1])), flush=True)\n"
        )
        return [sys.executable, "-c", script, json.dumps(params)], base_env(self.world)


class Airflow(Adapter):
    name = "airflow"

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = base_env(self.world)
        env.update(
            {
                "AIRFLOW_HOME": str(self.world.tmp / "airflow"),
                "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW_CONN_KUBEFLOW_TRAINER_DEFAULT": json.dumps(
                    {"conn_type": "kubeflow_trainer", "extra": self.world.conn_extra()}
                ),
            }
        )
        conf = json.dumps({"request": self.world.request})
        return [sys.executable, str(RUNNER), "tf_e2e_scenario", LOGICAL, LOGICAL, conf], env


def step(adapter: Adapter, then: Callable[[Step], None] | None = None, *, ends: bool) -> Step:
    """One launch: wait for its summary line, act on it, then let the process end (or kill it when held)."""
    proc, log = adapter.start()
    try:
        seen = wait_until(
            lambda: parse(log.read_text(errors="replace")) or (proc.poll() is not None and "exited"),
            400,
            f"the {adapter.name} launch's summary line",
        )
        assert isinstance(seen, Step), log.read_text(errors="replace")[-4000:]
        if then is not None:
            then(seen)
        if ends:
            proc.wait(timeout=400)
        return seen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a lost worker: nothing is cancelled
            proc.wait()


def run_scenario(adapter: Adapter, world: World) -> list[Step]:
    steps = []
    world.reset_control()
    steps.append(step(adapter, ends=False))  # 1: create, leave it running
    first = steps[0].name
    assert world.backend().get(first).state.value in ("Created", "Running")
    steps.append(step(adapter, lambda s: world.finish(s.name, ok=True), ends=True))  # 2: reattach, complete
    wait_until(lambda: world.backend().get(first).state.value == "Complete", HANG, f"{first} Complete")
    steps.append(step(adapter, ends=True))  # 3: reuse
    assert world.backend().cancel(first)  # 4: deleted -> attempt 1 again, which fails
    wait_until(
        lambda: world.backend().list() == [] or first not in [r.name for r in world.backend().list()],
        HANG,
        f"{first} deleted",
    )
    world.reset_control()
    steps.append(step(adapter, lambda s: world.finish(s.name, ok=False), ends=True))
    wait_until(lambda: world.backend().get(first).state.value == "Failed", HANG, f"{first} Failed")
    world.reset_control()
    steps.append(step(adapter, lambda s: world.finish(s.name, ok=True), ends=True))  # 5: attempt 2
    return steps


def check(steps: list[Step]) -> None:
    first = steps[0].name
    assert [s.action for s in steps] == ["created", "reattached", "reused", "created", "created"], steps
    assert [s.name for s in steps[:4]] == [first] * 4, steps
    # attempt 2: the same stable hash of the key, with the attempt suffix (the readable prefix may shorten)
    assert steps[4].name.endswith(f"-{first.rsplit('-', 1)[1]}-2"), steps
    assert [s.attempt for s in steps] == [1, 1, None, 1, 2], steps


ADAPTERS = {"cli": Cli, "kfp": Kfp, "airflow": Airflow}


@pytest.fixture(scope="module")
def airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated Airflow SQLite database, copied into each scenario's AIRFLOW_HOME."""
    home = tmp_path_factory.mktemp("scenario-airflow")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True, timeout=HANG
    )
    return home


def prepare(world: World, adapter: str, airflow_db: Path) -> Adapter:
    if adapter == "airflow":
        subprocess.run(["cp", "-r", str(airflow_db), str(world.tmp / "airflow")], check=True)
    return ADAPTERS[adapter](world)


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_local_engine(adapter: str, tmp_path: Path, airflow_db: Path) -> None:
    world = World("local", tmp_path)
    check(run_scenario(prepare(world, adapter, airflow_db), world))


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_testbed(
    adapter: str,
    tmp_path: Path,
    airflow_db: Path,
    testbed: Any,
    k8s: Any,
    namespace: str,
    no_retry_runtime: str,
) -> None:
    world = World("kubernetes", tmp_path, testbed, k8s, namespace, no_retry_runtime)
    check(run_scenario(prepare(world, adapter, airflow_db), world))
