"""Faults at the cluster boundary meet a deferred TrainJob task in a real deployment (issue 19).

Each scenario has its own scripted API server on loopback (tests/unit/fake_apiserver.py) and its own
``kubeflow_trainer`` connection to it (an inline kubeconfig whose bearer token is a canary), created over REST;
the ``tf_deploy_faults`` DAG submits on the worker and defers to the real triggerer, whose wait meets the fault
(the worker's submit is left alone: the faults hit only the wait's TrainJob list and watch). All scenarios run
at once. The operator keeps its defaults (``on_kill_action="delete"``, ``stream_logs=True``); its
``execution_timeout`` is 150 s (a false timeout would end it then, deleting the job):

- fatal (403 on the wait's list, 404 of the TrainJob resource type, 401 that re-authentication does not cure):
  the task fails soon, its log naming the cause, and the TrainJob is still there: no DELETE reached the server
  (a false timeout would have deleted it);
- survivable (``ERROR`` events 500 "etcdserver: request timed out" and 429; lines of the wrong shape): the task
  succeeds with the job's real final state, Complete;
- the canary token is in no task log and not in the triggerer's or the scheduler's log.

It runs in ``make e2e-airflow`` (tests/airflow_deploy/run.sh starts and stops the deployment); alone:

    bash tests/airflow_deploy/run.sh --suite deploy -k test_deploy_faults

(or, with a deployment already up from airflow_stack.py, that venv's ``pytest -m e2e`` on this file). Its
scenarios run at once: about 45 s when each ends as it should, 3-4 minutes when fatal faults run into the
execution_timeout.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from airflow_deployment import Deployment
from airflow_rest import Airflow

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DAG_ID = "tf_deploy_faults"
CANARY = "canary-airflow-bearer-8e21"
BOUND = 300.0  # seconds for every scenario's run to end (the task's execution_timeout is 150 s)


def _fake_module() -> Any:
    path = Path(__file__).resolve().parents[1] / "unit" / "fake_apiserver.py"
    if "fake_apiserver" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fake_apiserver", path)
        assert spec and spec.loader, f"{path} is needed for this test"
        module = importlib.util.module_from_spec(spec)
        sys.modules["fake_apiserver"] = module
        spec.loader.exec_module(module)
    return sys.modules["fake_apiserver"]


fa = _fake_module()


def _malformed(fake: Any) -> list[Any]:
    lines = [
        b"null\n",
        b"[]\n",
        fa.event_line({"type": "MODIFIED", "object": "x"}),
        fa.event_line({"type": "SURPRISE"}),
    ]
    return [fake.inject([line], fa.trainjob_watch) for line in lines]  # one per watch, in turn


SCRIPTS: dict[str, Callable[[Any], list[Any]]] = {
    "403": lambda fake: [fake.forbid(fa.wait_reads)],
    "404-crd": lambda fake: [fake.no_crd(fa.wait_reads)],
    "401": lambda fake: [
        fake.answer(401, fa.wait_reads, times=None, reason="Unauthorized", message="Unauthorized")
    ],
    "error-500": lambda fake: [
        fake.inject(
            [fa.error_event(500, "InternalError", "etcdserver: request timed out")], fa.trainjob_watch
        )
    ],
    "error-429": lambda fake: [
        fake.inject([fa.error_event(429, "TooManyRequests", "too many requests")], fa.trainjob_watch)
    ],
    "malformed": _malformed,
}
FATAL = {
    "403": ("PermissionDenied", "trainjobs"),
    "404-crd": ("NotFound", "trainer.kubeflow.org"),
    "401": ("Unauthorized",),
}


@dataclass
class Scenario:
    name: str
    fake: Any
    run_id: str
    rules: list[Any] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    ti: dict[str, Any] = field(default_factory=dict)
    log: str = ""

    def job(self) -> dict[str, Any] | None:
        with self.fake.cond:
            return next(iter(self.fake.store.values()), None)

    def created(self) -> bool:
        with self.fake.cond:
            return any(req.method == "POST" and status == 201 for req, status in self.fake.requests)

    def deletes(self) -> list[str]:
        with self.fake.cond:
            return [req.path for req, _ in self.fake.requests if req.method == "DELETE"]

    def drive(self) -> None:
        """The job runs once created; a survivable scenario's job completes after its faults were met."""
        job = fa.when(lambda: self.job() is not None, timeout=BOUND)
        job.join(BOUND)
        created = self.job()
        if created is None:
            return
        name = created["metadata"]["name"]
        self.fake.set_running(name)
        running = time.monotonic()
        if self.name not in FATAL:
            # no sooner than 10 s after it runs: Airflow fails a deferred task whose trigger fires before the
            # deferring process's exit is processed (docs/airflow.md, "A trigger that fires within seconds")
            fa.when(lambda: all(r.fired for r in self.rules) and time.monotonic() - running >= 10,
                    (self.fake.set_condition, name, "Complete", "Done"), timeout=BOUND)  # fmt: skip


@pytest.fixture(scope="module")
def scenarios(deployment: Deployment) -> Iterator[dict[str, Scenario]]:
    """Every scenario triggered at once; each ends (or the bound passes) before the tests look."""
    import threading

    api = deployment.api
    out: dict[str, Scenario] = {}
    for name, script in SCRIPTS.items():
        fake = fa.FakeApiServer()
        conn_id = f"tf_fault_{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
        extra = {
            "backend": "kubernetes",
            "kubeconfig": json.dumps(fa.kubeconfig(fake.url, CANARY)),
            "namespace": "ns",
        }
        api.create_connection(conn_id, "kubeflow_trainer", extra)
        s = Scenario(name, fake, f"fault-{name}-{uuid.uuid4().hex[:6]}")
        s.rules = script(fake)
        threading.Thread(target=s.drive, daemon=True).start()
        api.trigger(DAG_ID, s.run_id, {"conn_id": conn_id})
        out[name] = s
    end = time.monotonic() + BOUND
    for s in out.values():
        try:
            s.run = api.wait_run(DAG_ID, s.run_id, timeout=max(1.0, end - time.monotonic()))
        except AssertionError as exc:  # the bound passed: the test of that scenario says so
            s.run = {"state": f"not finished within {BOUND:.0f}s ({exc})"}
        s.ti = api.ti(DAG_ID, s.run_id, "train")
        s.log = task_log(api, s)
    yield out
    for s in out.values():
        s.fake.close()


def task_log(api: Airflow, s: Scenario) -> str:
    try:
        return api.log(DAG_ID, s.run_id, "train", max(1, int(s.ti.get("try_number") or 1)))
    except AssertionError as exc:
        return f"(no log: {exc})"


@pytest.mark.parametrize("name", sorted(FATAL))
def test_a_fatal_fault_fails_the_deferred_task_and_keeps_the_job(
    scenarios: dict[str, Scenario], name: str
) -> None:
    s = scenarios[name]
    assert s.created(), f"the worker never created the TrainJob: {s.ti}\n{s.log[-3000:]}"
    assert s.fake.statuses(fa.wait_reads), "the triggerer never waited on the scripted server"
    assert not s.deletes(), (
        f"the TrainJob was deleted ({s.deletes()}): a fault must not fire on_kill_action\n{s.log[-3000:]}"
    )
    assert s.job() is not None, "the TrainJob is gone"
    assert s.run["state"] == "failed", f"run: {s.run['state']}\n{s.log[-3000:]}"
    for word in FATAL[name]:
        assert word in s.log, f"the task log does not name {word!r}:\n{s.log[-3000:]}"
    assert "still unknown" not in s.log and "timed out" not in s.log.lower(), (
        f"a false timeout:\n{s.log[-3000:]}"
    )
    assert CANARY not in s.log


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - set(FATAL)))
def test_a_survivable_fault_ends_the_deferred_task_complete(
    scenarios: dict[str, Scenario], api: Airflow, name: str
) -> None:
    s = scenarios[name]
    assert s.run["state"] == "success", f"run: {s.run['state']}\n{s.log[-3000:]}"
    assert [r.fired for r in s.rules] == [1] * len(s.rules), "every scripted fault was met once"
    result = api.xcom(DAG_ID, s.run_id, "train")
    assert result["state"] == "Complete", result
    assert not s.deletes(), s.deletes()
    assert CANARY not in s.log


def test_the_token_is_in_no_airflow_log(scenarios: dict[str, Scenario], deployment: Deployment) -> None:
    for component in ("triggerer", "scheduler"):
        assert CANARY not in deployment.log(component), f"the bearer token is in the {component} log"
    for s in scenarios.values():
        assert CANARY not in s.log, f"the bearer token is in the task log of {s.name}"
