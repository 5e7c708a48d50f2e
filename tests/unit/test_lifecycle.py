"""The identity, attempt and adoption rules of ``lifecycle.launch`` (unit level: an in-memory backend).

The same rules on real backends, through Airflow, KFP and the CLI: tests/e2e/test_retry_scenarios.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from trainflow.core.errors import AlreadyExists, OutcomeUnknown, TrainJobConflict
from trainflow.core.lifecycle import decide, launch
from trainflow.core.result import JobRef, JobState
from trainflow.core.runtimes import find_runtime, local_catalog

REQUEST = {
    "runtime": "jax-distributed",
    "idempotency_key": "dag/run/task",
    "command": ["python3", "-c", "pass"],
}
DONE = {"conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted"}]}
FAILED = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs"}]}
RUNNING = {"jobsStatus": [{"name": "node", "active": 1}]}


class MemoryBackend:
    """The launch primitives over a dict; ``create_errors`` are raised by the next creates (after storing, when
    ``lost`` says the answer of a create that happened was lost)."""

    name = "memory"
    namespace = "ns"
    is_local = False

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.creates: list[str] = []
        self.create_errors: list[Exception] = []
        self.lost = False
        self.cancelled: list[str] = []
        self.adopted: list[str] = []

    def get_runtime(
        self, name: str, kind: str = "ClusterTrainingRuntime", namespace: str | None = None
    ) -> Any:
        return find_runtime(local_catalog(), name, kind)

    def schema_picture(self) -> None:
        return None

    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for o in self.jobs.values()
            if all(o["metadata"]["labels"].get(k) == v for k, v in labels.items())
        ]

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.jobs.get(name))

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        self.creates.append(name)
        if self.create_errors and not self.lost:
            raise self.create_errors.pop(0)
        if name in self.jobs:
            raise AlreadyExists(name)
        obj = copy.deepcopy(manifest)
        obj["metadata"]["uid"] = f"uid-{len(self.creates)}"
        obj["status"] = {}
        self.jobs[name] = obj
        if self.create_errors:
            raise self.create_errors.pop(0)
        return copy.deepcopy(obj)

    def adopt(self, obj: Mapping[str, Any]) -> None:
        self.adopted.append(obj["metadata"]["name"])

    def dry_run(self, manifest: dict[str, Any]) -> None:
        pass

    def cancel(self, ref: JobRef | str) -> bool:
        name = ref.name if isinstance(ref, JobRef) else ref
        self.cancelled.append(name)
        return self.jobs.pop(name, None) is not None

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        self.jobs[name]["status"] = copy.deepcopy(status)


def test_retry_sequence_reattach_reuse_deleted_failed() -> None:
    be = MemoryBackend()
    first = launch(be, REQUEST)
    assert (first.adopted, first.attempt, first.state) == (False, 1, JobState.CREATED)
    be.set_status(first.ref.name, RUNNING)
    again = launch(be, REQUEST)
    assert (again.ref.name, again.adopted, again.reused) == (first.ref.name, True, False)
    be.set_status(first.ref.name, DONE)
    reused = launch(be, REQUEST)
    assert (reused.ref.name, reused.reused) == (first.ref.name, True)
    be.cancel(first.ref)  # deleted: the name is free again, attempt 1 is created anew
    recreated = launch(be, REQUEST)
    assert (recreated.ref.name, recreated.attempt, recreated.adopted) == (first.ref.name, 1, False)
    be.set_status(first.ref.name, FAILED)
    second = launch(be, REQUEST)
    assert (second.attempt, second.ref.name) == (2, first.ref.name + "-2")
    assert [line.split(":")[0] for line in second.history()] == ["Earlier attempt 1"]
    assert be.creates == [first.ref.name, first.ref.name, second.ref.name]


def test_a_new_run_of_the_identity_trains_again_but_never_beside_a_running_one() -> None:
    """``reuse_completed=False`` (an Airflow task cleared after it succeeded): a Complete attempt is history and
    the next attempt is created; a running attempt is still reattached, so two never run at once."""
    be = MemoryBackend()
    first = launch(be, REQUEST)
    be.set_status(first.ref.name, DONE)
    assert launch(be, REQUEST).reused  # a retry: the result stands
    rerun = launch(be, REQUEST, reuse_completed=False)
    assert (rerun.attempt, rerun.adopted, rerun.ref.name) == (2, False, first.ref.name + "-2")
    assert [line.split(":")[0] for line in rerun.history()] == ["Earlier attempt 1"]
    be.set_status(rerun.ref.name, RUNNING)
    again = launch(be, REQUEST, reuse_completed=False)
    assert (again.ref.name, again.adopted) == (rerun.ref.name, True)
    be.set_status(rerun.ref.name, DONE)
    named = {**REQUEST, "name": "fixed"}
    be2 = MemoryBackend()
    launch(be2, named)
    be2.set_status("fixed", DONE)
    renamed = launch(be2, named, reuse_completed=False)  # a fixed name makes way for the new run
    assert (renamed.ref.name, renamed.attempt, be2.cancelled) == ("fixed", 2, ["fixed"])


def test_changed_spec_conflicts_while_running_and_starts_a_new_attempt_once_done() -> None:
    be = MemoryBackend()
    first = launch(be, REQUEST)
    be.set_status(first.ref.name, RUNNING)
    changed = {**REQUEST, "command": ["python3", "-c", "print(2)"]}
    with pytest.raises(TrainJobConflict, match=r"still running with a different spec\.trainer"):
        launch(be, changed)
    be.set_status(first.ref.name, DONE)
    fresh = launch(be, changed)  # a completed job of another spec is not this request's result
    assert (fresh.attempt, fresh.adopted) == (2, False)


def test_fixed_name_makes_way_for_the_next_attempt_only_when_it_is_ours() -> None:
    be = MemoryBackend()
    named = {**REQUEST, "name": "fixed"}
    first = launch(be, named)
    be.set_status("fixed", FAILED)
    second = launch(be, named)
    assert (second.ref.name, second.attempt, be.cancelled) == ("fixed", 2, ["fixed"])
    with pytest.raises(TrainJobConflict, match="not this request's"):
        launch(be, {**REQUEST, "idempotency_key": "someone/else", "name": "fixed"})
    assert first.ref.name == "fixed"


@pytest.mark.parametrize("error", [AlreadyExists("x"), OutcomeUnknown("lost")])
def test_create_that_finds_our_job_adopts_it(error: Exception) -> None:
    be = MemoryBackend()
    be.create_errors, be.lost = [error], True  # the create happened, its answer did not arrive
    launched = launch(be, REQUEST)
    assert (launched.adopted, be.adopted, len(be.jobs)) == (True, [launched.ref.name], 1)


def test_lost_create_that_never_happened_is_created_once_more() -> None:
    be = MemoryBackend()
    be.create_errors = [OutcomeUnknown("refused")]
    launched = launch(be, REQUEST)
    assert (launched.adopted, len(be.creates), len(be.jobs)) == (False, 2, 1)


def test_someone_elses_job_at_the_name_is_a_conflict() -> None:
    be = MemoryBackend()
    theirs = launch(be, {**REQUEST, "idempotency_key": "other"})
    be.jobs[theirs.ref.name]["metadata"]["labels"]["trainflow.dev/key"] = "other-team"
    with pytest.raises(TrainJobConflict, match="not this request's"):
        launch(be, {**REQUEST, "idempotency_key": "other"})


def test_dry_run_creates_nothing_and_no_key_means_a_fresh_name() -> None:
    be = MemoryBackend()
    assert launch(be, REQUEST, dry_run=True).dry_run and be.creates == []
    plain = {"runtime": "jax-distributed", "command": ["true"]}
    assert launch(be, plain).ref.name != launch(be, plain).ref.name


def test_decide_takes_the_newest_live_attempt() -> None:
    def job(attempt: int, status: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"j-{attempt}", "labels": {"trainflow.dev/attempt": str(attempt)}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {}, "status": status}

    wanted = {"metadata": {"name": "j-1"}, "spec": {}}
    assert decide([job(1, FAILED), job(2, RUNNING)], wanted, False).kind == "reattach"
    assert decide([job(1, DONE), job(2, FAILED)], wanted, False).kind == "reuse"
    assert decide([job(1, FAILED), job(2, FAILED)], wanted, False).attempt == 3
    assert decide([job(1, RUNNING, deleting=True)], wanted, False).kind == "create"
    assert decide([], wanted, False).attempt == 1


class CountingBackend(MemoryBackend):
    """Counts the launch's requests: lists, reads and creates (the runtime read is the backend's cache's)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    def find(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        self.requests.append("list")
        return super().find(namespace, labels)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests.append("get")
        return super().read(namespace, name)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.requests.append("create")
        return super().create(manifest)


def test_a_first_launch_costs_one_request() -> None:
    """Nothing to adopt: a fixed name, a request without identity, and a key on its first try create at once."""
    for request, first_try in (
        ({**REQUEST, "idempotency_key": None, "name": "fixed"}, False),
        ({**REQUEST, "idempotency_key": None}, False),
        (REQUEST, True),
    ):
        backend = CountingBackend()
        launched = launch(backend, request, first_try=first_try)
        assert (backend.requests, launched.attempt, launched.adopted) == (["create"], 1, False)


def test_a_taken_name_on_a_first_try_goes_down_the_full_rule() -> None:
    backend = CountingBackend()
    first = launch(backend, REQUEST)
    backend.jobs[first.ref.name]["status"] = FAILED
    backend.requests.clear()
    retried = launch(backend, REQUEST, first_try=True)  # e.g. a DAG run recreated under the same run_id
    assert backend.requests == ["create", "list", "create"]
    assert (retried.attempt, retried.adopted) == (2, False)
    backend.jobs[retried.ref.name]["status"] = DONE
    assert launch(backend, REQUEST, first_try=True).reused  # its completed attempt is the result


def test_a_deleted_attempt_one_with_a_later_attempt_running_is_found_by_a_retry() -> None:
    """Attempt 1 failed, attempt 2 runs, then attempt 1 was deleted: a retry (not a first try) lists first and
    reattaches to attempt 2; creating attempt 1 again would run the request twice."""
    backend = CountingBackend()
    first = launch(backend, REQUEST)
    backend.jobs[first.ref.name]["status"] = FAILED
    second = launch(backend, REQUEST)
    backend.jobs[second.ref.name]["status"] = RUNNING
    del backend.jobs[first.ref.name]
    backend.requests.clear()
    again = launch(backend, REQUEST)
    assert backend.requests == ["list"]
    assert (again.ref.name, again.attempt, again.adopted) == (second.ref.name, 2, True)


def test_a_recorded_running_trainjob_is_reattached_by_name_without_a_list() -> None:
    """Airflow 3.3's task state store names the earlier try's TrainJob: one read, no LIST, the same reattach."""
    be = CountingBackend()
    first = launch(be, REQUEST, first_try=True)
    be.set_status(first.ref.name, RUNNING)
    again = launch(be, REQUEST, recorded=first.ref)
    assert (again.ref, again.adopted, again.recorded, again.attempt) == (first.ref, True, True, 1)
    assert be.requests == ["create", "get"], be.requests
    assert again.summary.endswith("(attempt 1, as an earlier try recorded it)"), again.summary


@pytest.mark.parametrize(
    "change",
    ["completed", "failed", "deleted", "replaced", "other identity"],
)
def test_a_recorded_trainjob_the_rule_would_not_reattach_goes_to_the_full_rule(change: str) -> None:
    """Whatever happened to the recorded TrainJob, launching with the record decides as launching without it:
    the same TrainJob, attempt and adoption, found by the LIST the record would have saved."""
    outcomes = []
    for use_record in (False, True):
        be = CountingBackend()
        first = launch(be, REQUEST, first_try=True)
        name = first.ref.name
        if change == "completed":
            be.set_status(name, DONE)
        elif change == "failed":
            be.set_status(name, FAILED)
        elif change == "deleted":
            be.cancel(first.ref)
        elif change == "replaced":  # deleted and created again (by another try or a user): a new uid
            be.cancel(first.ref)
            launch(be, REQUEST, first_try=True)
            be.set_status(name, RUNNING)
        else:  # the name now holds a TrainJob of another identity: never adopted through the record
            be.jobs[name]["metadata"]["labels"]["trainflow.dev/key"] = "someone-else"
            be.set_status(name, RUNNING)
        lists = be.requests.count("list")
        try:
            out = launch(be, REQUEST, recorded=first.ref if use_record else None)
        except TrainJobConflict as exc:
            outcomes.append(("conflict", str(exc)))
            continue
        assert not out.recorded and be.requests.count("list") == lists + 1, (change, out)
        outcomes.append((out.ref.name, out.attempt, out.adopted, out.reused, tuple(be.creates)))
    assert outcomes[0] == outcomes[1], (change, outcomes)
