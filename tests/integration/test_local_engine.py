"""Local engine, real processes (no torch here; see test_local_engine_torch.py): lifecycle, cross-process
access, kill -9 of the submitter, dead supervisor, cancel without orphans, deadline, suspend/resume,
idempotent submit, secrets, initializers, output URIs and the ML-policy env contracts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import (
    InvalidRequest,
    JobState,
    TrainJobConflict,
    TrainJobFailed,
    TrainJobNotFound,
    WaitTimeout,
    get_backend,
    result_from_trainjob,
)
from trainflow.core.local import store
from trainflow.core.local.engine import LocalBackend

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

SCRIPTS = Path(__file__).parent / "scripts"
WORKER = str(SCRIPTS / "worker.py")


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
    for job in be.list():  # never leave a test's processes behind
        be.cancel(job.name)


def worker(*args: str) -> list[str]:
    return ["python3", WORKER, *args]


def other_process(home: Path, code: str, timeout: float = HANG) -> object:
    """Run ``code`` in a fresh interpreter that knows the job only by name; it prints one JSON value last."""
    prelude = (
        "import json, sys\n"
        "from trainflow.core import get_backend\n"
        f"backend = get_backend('local', home={str(home)!r}, namespace='tests')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wait_for(predicate, timeout: float = HANG, interval: float = 0.05):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def job_pids(backend: LocalBackend, name: str) -> list[int]:
    """Every live process of the job: recorded node leaders plus everything carrying the job marker."""
    job = store.JobDir(backend.job_dir(name))
    uid = job.read()["metadata"]["uid"]  # type: ignore[index]
    nodes = store.read_json(job.nodes) or []
    pids = {int(n["pid"]) for n in nodes if store.pid_alive(int(n["pid"]))}
    return sorted(pids | set(store.marked_processes(uid)))


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if store.pid_alive(p)]


# --- lifecycle and cross-process access --------------------------------------------------------------


def test_job_completes_and_is_read_from_another_process(backend: LocalBackend, home: Path) -> None:
    cwd, environ = os.getcwd(), dict(os.environ)
    ref = backend.submit(
        {
            "name": "basic",
            "command": worker("--lines", "3", "--report", "--dump-env"),
            "num_nodes": 2,
            "env": {"PLAIN": "plain-value"},
        }
    )
    result = backend.wait(ref, timeout=HANG)
    assert result.state is JobState.COMPLETE and result.reason == "AllJobsCompleted"
    assert result.metrics == {"loss": 0.25, "node_seen": 0.0}  # last values, rank 0 only
    assert result.progress == 100
    assert os.getcwd() == cwd and dict(os.environ) == environ  # the caller's process is untouched

    seen = other_process(
        home,
        """
        r = backend.get("basic")
        logs = {s: list(backend.logs("basic", step=s)) for s in ("node-0", "node-1")}
        print(json.dumps({"result": r.to_dict(), "logs": logs, "tail": list(backend.logs("basic", tail_lines=1))}))
        """,
    )
    assert isinstance(seen, dict)
    assert seen["result"]["state"] == "Complete" and seen["result"]["metrics"] == {
        "loss": 0.25,
        "node_seen": 0.0,
    }
    assert seen["logs"]["node-0"][:3] == ["node=0 line=0", "node=0 line=1", "node=0 line=2"]
    assert seen["logs"]["node-1"][-1] == "node=1 done"
    assert seen["tail"] == ["node=0 done"]
    out = Path(seen["result"]["output_uri"].removeprefix("file://"))
    assert out == backend.job_dir("basic") / "output"
    env0 = json.loads((out / "env-0.json").read_text())
    assert env0["TRAINFLOW_OUTPUT_URI"] == out.as_uri()
    assert env0["PLAIN"] == "plain-value" and env0["HOME"] == os.environ.get("HOME")  # never an empty env
    assert env0["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env0["cwd"] == cwd


def test_status_file_has_the_trainers_shape(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "shape", "command": worker("--report"), "num_nodes": 2})
    backend.wait(ref, timeout=HANG)
    obj = json.loads((backend.job_dir(ref) / "trainjob.json").read_text())
    assert obj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and obj["kind"] == "TrainJob"
    status = obj["status"]
    (complete,) = [c for c in status["conditions"] if c["type"] == "Complete"]
    assert complete["status"] == "True" and complete["lastTransitionTime"].endswith("Z")
    assert status["jobsStatus"] == [
        {"name": "node", "active": 0, "ready": 0, "succeeded": 2, "failed": 0, "suspended": 0}
    ]
    assert {"name": "loss", "value": "0.25"} in status["trainerStatus"]["metrics"]
    assert status["trainerStatus"]["progressPercentage"] == 100
    assert result_from_trainjob(obj).metrics["loss"] == 0.25  # the shared parser reads it unchanged


def test_follow_logs_until_terminal_and_wait_async(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "follow", "command": worker("--lines", "5", "--line-sleep", "0.2")})
    lines = list(backend.logs(ref, follow=True))
    assert [line for line in lines if line.startswith("node=0 line=")] == [
        f"node=0 line={i}" for i in range(5)
    ]
    assert lines[-1] == "node=0 done"
    result = asyncio.run(backend.wait_async(ref, timeout=HANG))
    assert result.state is JobState.COMPLETE


def test_wait_timeout_leaves_the_job_running(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "slow", "command": worker("--sleep", str(HANG))})  # runs until cancelled
    start = time.monotonic()
    with pytest.raises(WaitTimeout):
        backend.wait(ref, timeout=0.5)
    assert time.monotonic() - start < HANG  # returned at its timeout, not with the job
    assert backend.get(ref).state in (JobState.CREATED, JobState.RUNNING)


def test_submitter_killed_with_sigkill_job_runs_to_completion(home: Path) -> None:
    code = textwrap.dedent(
        f"""
        from trainflow.core import get_backend
        b = get_backend("local", home={str(home)!r}, namespace="tests")
        ref = b.submit({{"name": "orphaned", "command": ["python3", {WORKER!r}, "--sleep", "2", "--report"]}})
        print("submitted", flush=True)
        b.wait(ref, timeout={HANG})
        """
    )
    submitter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert submitter.stdout is not None
    assert submitter.stdout.readline().strip() == "submitted"
    os.kill(submitter.pid, signal.SIGKILL)
    submitter.wait()
    backend = get_backend("local", home=home, namespace="tests")
    assert backend.get("orphaned").state in (JobState.CREATED, JobState.RUNNING)
    result = backend.wait("orphaned", timeout=HANG)
    assert result.state is JobState.COMPLETE and result.metrics["loss"] == 0.25


# --- failure, dead supervisor, cancel, deadline --------------------------------------------------------


def test_failing_node_fails_the_job_and_stops_the_others(backend: LocalBackend) -> None:
    ref = backend.submit(
        {
            "name": "fails",
            "command": worker("--exit-code", "4", "--fail-node", "1", "--sleep", "0.3"),
            "num_nodes": 3,
        }
    )
    with pytest.raises(TrainJobFailed) as info:
        backend.wait(ref, timeout=HANG)
    err = info.value
    assert err.result.reason == "NodeFailed"
    assert "node 1" in err.result.message and "code 4" in err.result.message
    assert err.diagnostics.failed_ranks[0]["node"] == 1 and err.diagnostics.failed_ranks[0]["exit_code"] == 4
    text = str(err)
    assert "exit_code=4" in text and "node=1 exiting with 4" in text  # rank, code and its log tail


def test_a_command_that_cannot_start_fails_clearly(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "nocmd", "command": ["no-such-trainer-xyz", "--flag"]})
    with pytest.raises(TrainJobFailed, match="no-such-trainer-xyz") as info:
        backend.wait(ref, timeout=HANG)
    assert info.value.result.reason == "StartError"
    assert "on PATH" in (info.value.result.message or "")


def test_dead_supervisor_is_reported_failed_and_its_nodes_stopped(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "lost", "command": worker("--sleep", "60"), "num_nodes": 2})
    wait_for(lambda: backend.get(ref).state is JobState.RUNNING)
    pids = wait_for(lambda: len(job_pids(backend, "lost")) >= 2 and job_pids(backend, "lost"))
    sup = json.loads((backend.job_dir(ref) / "supervisor.json").read_text())
    os.kill(sup["pid"], signal.SIGKILL)
    wait_for(lambda: not store.pid_alive(sup["pid"]))
    # The main thread can be a zombie while the supervisor's other threads still exit, holding its liveness
    # lock (and so its files) for a moment: the job turns Failed once the lock is free.
    result = wait_for(lambda: (r := backend.get(ref)).state is JobState.FAILED and r)
    assert result.reason == "SupervisorLost"
    wait_for(lambda: not alive(pids))
    with pytest.raises(TrainJobFailed, match="SupervisorLost"):
        backend.wait(ref, timeout=HANG)


def test_cancel_stops_every_process_and_deletes_the_job(backend: LocalBackend, home: Path) -> None:
    ref = backend.submit({"name": "cancelme", "command": worker("--sleep", "60"), "num_nodes": 2})
    pids = wait_for(lambda: len(job_pids(backend, "cancelme")) >= 2 and job_pids(backend, "cancelme"))
    sup = json.loads((backend.job_dir(ref) / "supervisor.json").read_text())
    assert other_process(home, 'print(json.dumps(backend.cancel("cancelme")))') is True
    assert not alive([*pids, sup["pid"]])
    with pytest.raises(TrainJobNotFound):
        backend.get(ref)
    assert backend.cancel(ref) is False  # idempotent
    assert not backend.job_dir(ref).exists()


def test_deadline_exceeded(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "late", "command": worker("--sleep", str(HANG)), "deadline_seconds": 1})
    start = time.monotonic()
    result = backend.wait(ref, timeout=HANG, raise_on_failure=False)
    assert result.state is JobState.FAILED and result.reason == "DeadlineExceeded"
    assert time.monotonic() - start < HANG  # ended at its deadline, not with the job
    assert not job_pids(backend, "late")


def test_suspend_queues_until_resume(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "queued", "command": worker("--report"), "suspend": True})
    wait_for(lambda: backend.get(ref).reason == "Suspended")
    time.sleep(0.3)
    assert backend.get(ref).state is JobState.QUEUED
    assert not (backend.job_dir(ref) / "nodes.json").exists()  # nothing was started
    backend.resume(ref)
    result = backend.wait(ref, timeout=HANG)
    assert result.state is JobState.COMPLETE
    obj = json.loads((backend.job_dir(ref) / "trainjob.json").read_text())
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "False" and conditions["Suspended"]["reason"] == "Resumed"


def test_suspend_a_running_job_stops_its_nodes_and_resume_restarts_them(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "pausing", "command": worker("--sleep", "2", "--report")})
    wait_for(lambda: "node=0 line=0" in list(backend.logs(ref)))
    pids = job_pids(backend, "pausing")
    assert pids
    backend.suspend(ref)
    wait_for(lambda: backend.get(ref).state is JobState.QUEUED)
    wait_for(lambda: not alive(pids))
    backend.resume(ref)
    states: list[JobState] = []
    result = backend.wait(ref, timeout=HANG, on_update=lambda r: states.append(r.state))
    assert result.state is JobState.COMPLETE and states[-1] is JobState.COMPLETE
    assert JobState.RUNNING in states
    assert [line for line in backend.logs(ref) if line == "node=0 line=0"] == [
        "node=0 line=0"
    ] * 2  # ran twice


def test_concurrent_submits_of_one_key_make_one_job(home: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys, json
        from trainflow.core import get_backend
        b = get_backend("local", home={str(home)!r}, namespace="tests")
        ref = b.submit({{"idempotency_key": "race/1", "command": ["python3", {WORKER!r}]}})
        print(json.dumps([ref.name, ref.uid]))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    # a hang detector: four interpreters importing trainflow took over 60 s at load ~20
    outs = [json.loads(p.communicate(timeout=HANG)[0].strip().splitlines()[-1]) for p in procs]
    assert len({tuple(o) for o in outs}) == 1
    backend = get_backend("local", home=home, namespace="tests")
    assert [r.name for r in backend.list()] == [outs[0][0]]
    assert backend.wait(outs[0][0], timeout=HANG).state is JobState.COMPLETE
    staging = [p for p in (home / "jobs" / "tests").iterdir() if p.name.startswith(".")]
    assert staging == []


def test_resubmit_starts_a_job_whose_submitter_died_before_starting_it(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = {"idempotency_key": "crash/before/spawn", "command": worker("--report")}
    with monkeypatch.context() as patch:  # simulate a crash between publishing the job and spawning it
        patch.setattr(LocalBackend, "_spawn", lambda self, job: None)
        ref = backend.submit(request)
    assert backend.get(ref).state is JobState.CREATED  # within the start-up grace, not yet "lost"
    assert backend.submit(request).uid == ref.uid  # the retry adopts it ... and starts it
    assert backend.wait(ref, timeout=HANG).state is JobState.COMPLETE


def test_logs_of_an_unknown_step_name_the_choices(backend: LocalBackend) -> None:
    ref = backend.submit({"name": "steps", "command": worker(), "num_nodes": 2})
    with pytest.raises(InvalidRequest, match="node-0, node-1") as info:
        list(backend.logs(ref, step="node-5"))
    assert info.value.fields == ["step"]


# --- submit semantics --------------------------------------------------------------------------------


def test_submit_is_idempotent_and_detects_conflicts(backend: LocalBackend) -> None:
    request = {"idempotency_key": "dag/run-1/task", "command": worker()}
    first = backend.submit(request)
    again = backend.submit(request)
    assert first.uid and first == again
    with pytest.raises(TrainJobConflict, match="already exists"):
        backend.submit({"name": first.name, "command": worker()})
    # running for the whole test (a job that ended may be replaced under its name: that is not a conflict)
    held = worker("--sleep", "3600")
    named = backend.submit({"name": "named", "command": held})
    assert backend.submit({"name": "named", "command": held}).uid == named.uid
    with pytest.raises(TrainJobConflict, match=r"spec\.trainer"):
        backend.submit({"name": "named", "command": [*held, "--lines", "2"]})
    assert sorted(r.name for r in backend.list()) == sorted([first.name, "named"])


def test_dry_run_and_render_start_nothing(backend: LocalBackend) -> None:
    manifest = backend.render({"name": "dry", "command": worker(), "num_nodes": 2})
    assert manifest["spec"]["trainer"]["numNodes"] == 2 and manifest["metadata"]["namespace"] == "tests"
    ref = backend.submit({"name": "dry", "command": worker()}, dry_run=True)
    assert ref.name == "dry"
    with pytest.raises(TrainJobNotFound):
        backend.get("dry")


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"output_uri": "gs://bucket/model"}, "output_uri"),  # s3:// is published; gs:// is not written
        ({"num_nodes": 0}, "num_nodes"),
        ({"env": {"PET_NNODES": "3"}}, "env.PET_NNODES"),
        ({"runtime": "nope"}, "runtime"),
    ],
)
def test_bad_requests_fail_at_submit_naming_the_field(
    backend: LocalBackend, request_: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        backend.submit({"name": "bad", "command": worker(), **request_})
    assert field in info.value.fields
    assert not (backend.home / "jobs" / "tests" / "bad").exists()


def test_mpi_runtime_without_mpirun_is_a_clear_error(
    backend: LocalBackend, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpirun anywhere (nor next to this interpreter)
    with pytest.raises(InvalidRequest, match="mpirun") as info:
        backend.submit({"name": "mpi", "runtime": "deepspeed-distributed", "function": "json:dumps"})
    assert info.value.fields == ["runtime"]


# --- secrets, initializers, outputs ------------------------------------------------------------------


def test_secret_values_reach_only_the_child_env(backend: LocalBackend, home: Path) -> None:
    canary = "canary-9f8e7d6c5b4a-secret"
    with pytest.raises(InvalidRequest) as info:
        backend.submit({"name": "sec", "command": worker(), "secret_env": {"API_TOKEN": "creds/token"}})
    assert info.value.fields == ["secret_env.API_TOKEN"]
    assert str(home / "secrets" / "creds" / "token") in str(info.value)
    (home / "secrets" / "creds").mkdir(parents=True)
    (home / "secrets" / "creds" / "token").write_text(canary + "\n")
    ref = backend.submit(
        {
            "name": "sec",
            "command": worker("--secret-var", "API_TOKEN", "--exit-code", "2"),
            "secret_env": {"API_TOKEN": "creds/token"},
        }
    )
    with pytest.raises(TrainJobFailed) as failed:
        backend.wait(ref, timeout=HANG)
    assert canary not in str(failed.value)
    out = backend.job_dir(ref) / "output"
    import hashlib

    assert (out / "secret-0.sha256").read_text() == hashlib.sha256(canary.encode()).hexdigest()
    leaks = [
        str(p)
        for p in home.rglob("*")
        if p.is_file() and "secrets" not in p.relative_to(home).parts and canary.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert canary not in json.dumps(backend.get(ref).to_dict())


def test_file_dataset_is_linked_and_cluster_only_uris_are_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.txt").write_text("hello dataset")
    target = tmp_path / "models" / "run1"
    ref = backend.submit(
        {
            "name": "init",
            "command": worker("--read-dataset"),
            "dataset_uri": data.as_uri(),
            "output_uri": str(target),
        }
    )
    result = backend.wait(ref, timeout=HANG)
    assert result.output_uri == target.as_uri()
    assert (target / "dataset-copy.txt").read_text() == "hello dataset"
    assert (
        (backend.job_dir(ref) / "logs" / "dataset-initializer.log")
        .read_text()
        .startswith("dataset-initializer")
    )
    assert "dataset-initializer" in next(iter(backend.logs(ref, step="dataset-initializer")))
    with pytest.raises(InvalidRequest, match="only on a cluster") as info:
        backend.submit({"name": "tune", "runtime": "torchtune-llama3.2-1b", "args": ["epochs=1"]})
    assert info.value.fields == ["runtime"]
    with pytest.raises(InvalidRequest) as missing:
        backend.submit({"name": "gone", "command": worker(), "dataset_uri": (tmp_path / "nothing").as_uri()})
    assert missing.value.fields == ["dataset_uri"]


# --- ML-policy env contracts -------------------------------------------------------------------------


def _envs(backend: LocalBackend, name: str, nodes: int) -> list[dict[str, str]]:
    out = backend.job_dir(name) / "output"
    return [json.loads((out / f"env-{i}.json").read_text()) for i in range(nodes)]


def test_torch_env_contract(backend: LocalBackend) -> None:
    ref = backend.submit(
        {"name": "torchenv", "command": worker("--dump-env"), "num_nodes": 2, "resources": {"cpu": 3}}
    )
    backend.wait(ref, timeout=HANG)
    envs = _envs(backend, "torchenv", 2)
    assert [e["PET_NODE_RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert (
            env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "3"
        )  # auto = CPU count from resources
        assert env["PET_MASTER_ADDR"] == "127.0.0.1" and int(env["PET_MASTER_PORT"]) > 0
    assert envs[0]["PET_MASTER_PORT"] == envs[1]["PET_MASTER_PORT"]


def test_jax_and_xgboost_env_contracts(backend: LocalBackend) -> None:
    jax = backend.submit(
        {"name": "jaxenv", "runtime": "jax-distributed", "command": worker("--dump-env"), "num_nodes": 2}
    )
    xgb = backend.submit(
        {"name": "xgbenv", "runtime": "xgboost-distributed", "command": worker("--dump-env"), "num_nodes": 3}
    )
    backend.wait(jax, timeout=HANG)
    backend.wait(xgb, timeout=HANG)
    jenv = _envs(backend, "jaxenv", 2)
    assert [(e["JAX_NUM_PROCESSES"], e["JAX_PROCESS_ID"]) for e in jenv] == [("2", "0"), ("2", "1")]
    assert jenv[0]["JAX_COORDINATOR_ADDRESS"].startswith("127.0.0.1:") and jenv[0]["PET_NNODES"] is None
    xenv = _envs(backend, "xgbenv", 3)
    assert [e["DMLC_TASK_ID"] for e in xenv] == ["0", "1", "2"]
    assert {(e["DMLC_NUM_WORKER"], e["DMLC_TRACKER_URI"]) for e in xenv} == {("3", "127.0.0.1")}
    assert int(xenv[0]["DMLC_TRACKER_PORT"]) > 0
