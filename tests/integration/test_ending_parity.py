"""One ending, read alike: the same scripted outcomes through the local engine (real jobs) and the cluster engine
(the loopback API server, tests/unit/fake_apiserver.py) give equal ``Ending``s, and every adapter answers them
alike: the Airflow operator on a worker (its sync wait) and deferred (the real ``TrainJobTrigger``'s event),
the KFP step and the CLI's exit code.

Outcomes: complete, failed with a crashed rank (exit code 3, its log tail), an update callback that raises,
the deadline, the queue budget, a job that does not exist, a job deleted while waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bounds import HANG
from trainflow.core.ending import Ending, EndKind
from trainflow.core.naming import MAX_QUEUE_ANNOTATION
from trainflow.core.result import JobState

_HELPER = Path(__file__).resolve().parents[1] / "unit" / "fake_apiserver.py"
_spec = importlib.util.spec_from_file_location("_fake_apiserver_for_parity", _HELPER)
assert _spec is not None and _spec.loader is not None
fake_apiserver = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fake_apiserver
_spec.loader.exec_module(fake_apiserver)

NS = "ns"
OUTCOMES = ["complete", "failed", "callback-raises", "deadline", "queue-budget", "not-found", "deleted"]
DEADLINE = 1.0  # the deadline outcome's timeout: the job runs on, the wait ends
PY = "python"


def _raise(_: Any) -> None:
    raise RuntimeError("the update callback broke")


class Local:
    """The outcomes on the local engine: real jobs (a crashed rank is a process that exits 3)."""

    name = "local"

    def __init__(self, tmp: Path) -> None:
        from trainflow.core import get_backend

        self.home = tmp / "home"
        self.backend = get_backend("local", home=self.home, namespace=NS)

    def cli_args(self) -> list[str]:
        return ["--backend", "local", "--home", str(self.home), "-n", NS]

    def hook_params(self) -> dict[str, Any]:
        return {"backend": "local", "local_home": str(self.home), "namespace": NS}

    def _submit(self, name: str, code: str, **fields: Any) -> str:
        self.backend.submit({"name": name, "command": [PY, "-c", code], "num_nodes": 1, **fields})
        return name

    def _running(self, name: str) -> None:
        end = time.monotonic() + HANG
        while self.backend.get(name).state is not JobState.RUNNING:
            assert time.monotonic() < end, f"{name} did not start"
            time.sleep(0.05)

    def prepare(self, outcome: str, way: str) -> str:
        """The job of ``outcome`` ready to be waited on (``way`` names a job each way needs its own)."""
        if outcome in ("complete", "callback-raises"):
            return self._submit(outcome, "print('done')")
        if outcome == "failed":
            return self._submit(outcome, "import sys; print('ValueError: bad lr', flush=True); sys.exit(3)")
        if outcome == "deadline":
            name = self._submit(outcome, "import time; time.sleep(3600)")
            self._running(name)
            return name
        if outcome == "queue-budget":
            return self._submit(outcome, "print('never')", suspend=True, max_queue_seconds=1)
        if outcome == "not-found":
            return "ghost"
        name = self._submit(f"deleted-{way}", "import time; time.sleep(3600)")
        self._running(name)
        return name

    def delete_soon(self, name: str) -> Callable[[], None]:
        """What deletes ``name`` once a wait has started (from another thread, as a user's delete would)."""
        return lambda: self.backend.cancel(name)

    def close(self) -> None:
        for job in self.backend.list():
            self.backend.cancel(job.name)


class Cluster:
    """The outcomes on the cluster engine against the loopback API server: the Trainer's conditions, a crashed
    pod with its log, a suspended job past its queue budget, a DELETED event."""

    name = "cluster"

    def __init__(self, tmp: Path) -> None:
        from trainflow.core.kube.backend import KubernetesBackend

        self.fake = fake_apiserver.FakeApiServer()
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(fake_apiserver.kubeconfig(self.fake.url, namespace=NS)))
        self.backend = KubernetesBackend(kubeconfig=str(self.kubeconfig), namespace=NS)
        self.made: set[str] = set()

    def cli_args(self) -> list[str]:
        return ["--backend", "kubernetes", "--kubeconfig", str(self.kubeconfig), "-n", NS]

    def hook_params(self) -> dict[str, Any]:
        return {"backend": "kubernetes", "kubeconfig": str(self.kubeconfig), "namespace": NS}

    def prepare(self, outcome: str, way: str) -> str:
        fake = self.fake
        name = f"deleted-{way}" if outcome == "deleted" else outcome
        if outcome == "not-found":
            return "ghost"
        if name in self.made:
            return name  # ended already: every way reads the same terminal object
        self.made.add(name)
        fake.add(name, NS)
        if outcome in ("complete", "callback-raises"):
            fake.set_running(name, NS)
            fake.set_condition(name, "Complete", "JobsCompleted", NS)
        elif outcome == "failed":
            fake.set_running(name, NS)
            fake.log_lines = [(time.time(), "ValueError: bad lr")]
            fake.put_pod(_crashed_pod(name, 3))  # kept: each way's wait reads it, as the first would
            fake.set_condition(name, "Failed", "FailedJobs", NS)
        elif outcome == "deadline" or outcome == "deleted":
            fake.set_running(name, NS)
        elif outcome == "queue-budget":
            suspended = {"type": "Suspended", "status": "True", "reason": "Suspended"}
            suspended["lastTransitionTime"] = "2026-11-29T10:00:00Z"
            fake.set_object(
                name,
                annotations={MAX_QUEUE_ANNOTATION: "1"},
                spec={"suspend": True},
                status={"conditions": [suspended]},
                namespace=NS,
            )
        return name

    def delete_soon(self, name: str) -> Callable[[], None]:
        return lambda: self.fake.delete(name, NS)

    def close(self) -> None:
        self.backend.close()
        self.fake.close()


def _crashed_pod(job: str, exit_code: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job}-node-0-0-x1",
            "namespace": NS,
            "uid": f"pod-{job}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": job,
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "node", "restartCount": 0, "state": {"terminated": {"exitCode": exit_code}}}
            ],
        },
    }


@pytest.fixture(params=["local", "cluster"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Local | Cluster]:
    made = Local(tmp_path) if request.param == "local" else Cluster(tmp_path)
    yield made
    made.close()


# --- the ways a wait is driven -----------------------------------------------------------------------


def _timeout(outcome: str) -> float:
    return DEADLINE if outcome == "deadline" else HANG


def _callback(outcome: str, on_first: Callable[[], None] | None) -> Callable[[Any], None] | None:
    """The update callback of one wait: raising for that outcome; deleting the job at the first update (the
    wait has started) for the deleted outcome."""
    if outcome == "callback-raises":
        return _raise
    if on_first is None:
        return None
    fired = threading.Event()

    def first(_: Any) -> None:
        if not fired.is_set():
            fired.set()
            threading.Thread(target=on_first, daemon=True).start()

    return first


def sync_ending(engine: Local | Cluster, outcome: str) -> Ending:
    name = engine.prepare(outcome, "sync")
    deleting = engine.delete_soon(name) if outcome == "deleted" else None
    on_update = _callback(outcome, deleting)
    return engine.backend.wait_ending(name, _timeout(outcome), on_update=on_update)


def trigger_event(engine: Local | Cluster, outcome: str) -> dict[str, Any]:
    """The real TrainJobTrigger's one event (the deferred task's wait)."""
    from trainflow.airflow import triggers

    name = engine.prepare(outcome, "deferred")
    deleting = engine.delete_soon(name) if outcome == "deleted" else None
    trigger = triggers.TrainJobTrigger(
        name=name,
        namespace=NS,
        hook_params=engine.hook_params(),
        deadline=time.time() + _timeout(outcome),
        on_kill_action="keep",
        on_update_callback=f"{__name__}._raise" if outcome == "callback-raises" else None,
    )

    async def run() -> dict[str, Any]:
        if deleting is not None:  # deleted once the trigger's wait has looked at the job
            asyncio.get_running_loop().call_later(0.5, deleting)
        events = [event.payload async for event in trigger.run()]
        assert len(events) == 1
        return events[0]

    payload = asyncio.run(run())
    return json.loads(json.dumps(payload))  # what the triggerer stores and the task reads back


def cli_answer(engine: Local | Cluster, outcome: str) -> tuple[int, str]:
    """``trainflow wait``: its exit code and the first line of its error."""
    from trainflow.core import cli

    name = engine.prepare(outcome, "cli")
    argv = [*engine.cli_args(), "wait", name, "--timeout", str(_timeout(outcome))]
    timer = None
    if outcome == "deleted":
        timer = threading.Timer(1.0, engine.delete_soon(name))
        timer.start()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    if timer is not None:
        timer.join()
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    return code, errors[0] if errors else ""


# --- the adapters' answers ---------------------------------------------------------------------------


def _ctx() -> dict[str, Any]:
    from types import SimpleNamespace

    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1, try_number=1, start_date=None)
    return {"ti": ti}


def _answer(call: Callable[[], Any]) -> tuple[str, str]:
    """(what the call gave: a returned result's state, or the exception's type; the kind of its text)."""
    try:
        value = call()
    except BaseException as exc:
        return type(exc).__name__, _gist(str(exc))
    state = value.get("state") if isinstance(value, dict) else getattr(value, "state", value)
    return "returned", str(getattr(state, "value", state))


def _gist(text: str) -> str:
    """What an error text says, without the engine's own words (names, reasons, timings)."""
    for word in ("still Running", "queue budget", "not found", "deleted while", "failed", "state is unknown"):
        if word in text:
            return word
    return text[:80]


def airflow_answer(ending: Ending, deferred: bool) -> tuple[str, str]:
    from trainflow.airflow.operators import TrainJobOperator

    op = TrainJobOperator(task_id="t", function="m:f", on_kill_action="keep")
    if deferred:
        return _answer(lambda: op.execute_complete(_ctx(), ending.to_event()))  # type: ignore[arg-type]
    return _answer(lambda: op._end(_ctx(), ending))  # type: ignore[arg-type]


def kfp_answer(ending: Ending) -> tuple[str, str]:
    """The step's answer: its result's state, or how it failed and the gist of its one failure line."""
    from trainflow.kfp import runner

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        given = _answer(lambda: runner._answer(ending, DEADLINE, lambda: None, lambda: None))
    errors = [line for line in out.getvalue().splitlines() if "ERROR:" in line]
    return (given[0], _gist(errors[0])) if errors else given


# --- the test ----------------------------------------------------------------------------------------

EXPECTED: dict[str, tuple[EndKind, JobState | None, tuple[str, str], tuple[str, str], int]] = {
    # outcome: (kind, result state, Airflow's answer, the KFP step's, the CLI's exit code)
    "complete": (EndKind.COMPLETE, JobState.COMPLETE, ("returned", "Complete"), ("returned", "Complete"), 0),
    "failed": (EndKind.FAILED, JobState.FAILED, ("AirflowException", "failed"), ("SystemExit", "failed"), 1),
    "callback-raises": (
        EndKind.COMPLETE,
        JobState.COMPLETE,
        ("returned", "Complete"),
        ("returned", "Complete"),
        0,
    ),
    "deadline": (
        EndKind.TIMED_OUT,
        None,
        ("AirflowTaskTimeout", "still Running"),
        ("SystemExit", "still Running"),
        1,
    ),
    "queue-budget": (
        EndKind.QUEUE_BUDGET,
        JobState.FAILED,  # as the budget's failure reports it; the job itself stays queued
        ("AirflowException", "queue budget"),
        ("SystemExit", "queue budget"),
        1,
    ),
    "not-found": (
        EndKind.NOT_FOUND,
        None,
        ("AirflowException", "deleted while"),
        ("SystemExit", "not found"),
        1,
    ),
    "deleted": (
        EndKind.NOT_FOUND,
        None,
        ("AirflowException", "deleted while"),
        ("SystemExit", "not found"),
        1,
    ),
}


def _shape(ending: Ending) -> tuple[Any, ...]:
    """What must be equal across engines and ways: the kind, the job, its state, a crash's exit code and
    log line."""
    state = ending.result.state if ending.result is not None else None
    diag = ending.diagnostics
    codes = sorted(int(r["exit_code"]) for r in diag.failed_ranks if "exit_code" in r) if diag else []
    tail = "ValueError: bad lr" in diag.log_tail if diag else False
    return (ending.kind, ending.namespace, state, ending.state, codes, tail)


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_every_engine_and_adapter_answers_an_outcome_alike(engine: Local | Cluster, outcome: str) -> None:
    kind, state, airflow, kfp, exit_code = EXPECTED[outcome]
    ending = sync_ending(engine, outcome)
    deferred = Ending.from_event(trigger_event(engine, outcome))
    assert _shape(ending) == _shape(deferred), (engine.name, outcome, ending, deferred)
    assert ending.kind is kind and (ending.result.state if ending.result else None) is state, ending
    if outcome == "failed":
        assert _shape(ending)[-2:] == ([3], True), ending.diagnostics
    if outcome == "deadline":
        assert ending.state == "Running", ending
    assert airflow_answer(ending, deferred=False) == airflow_answer(deferred, deferred=True) == airflow
    assert kfp_answer(ending) == kfp_answer(deferred) == kfp
    code, error = cli_answer(engine, outcome)
    assert code == exit_code, (code, error)
    assert (error == "") == (exit_code == 0), error
