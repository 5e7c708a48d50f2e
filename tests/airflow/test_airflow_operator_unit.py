"""Unit tests of the operator's mapping onto the core (one function each; no Airflow run, no backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from bounds import HANG
from trainflow.airflow.operators import TrainJobOperator, airflow_labels, idempotency_key


def ctx(
    run_id: str = "scheduled__2026-03-05T00:00:00+00:00", map_index: int = -1, try_number: int = 1
) -> dict:
    ti = SimpleNamespace(
        dag_id="dag.with.dots",
        task_id="group.train",
        run_id=run_id,
        map_index=map_index,
        try_number=try_number,
        start_date=datetime(2026, 3, 5, 1, 0, tzinfo=UTC),
    )
    return {"ti": ti}


def test_arguments_map_onto_request_fields() -> None:
    op = TrainJobOperator(
        task_id="t",
        function="pkg.mod:train",
        job_name="explicit-name",
        resources_per_node={"cpu": 2, "memory": "4Gi"},
        kueue_queue="team-queue",
        num_nodes=2,
        request={"num_nodes": 5, "service_account": "trainer", "runtime": "jax-distributed"},
    )
    fields = op.request_fields()
    assert fields["name"] == "explicit-name"
    assert fields["resources"] == {"cpu": 2, "memory": "4Gi"}
    assert fields["queue"] == "team-queue"
    assert fields["num_nodes"] == 2  # explicit argument wins over request
    assert fields["service_account"] == "trainer"  # request passes any other field through
    assert fields["runtime"] == "jax-distributed"  # the default runtime argument does not override request
    assert "suspend" not in fields and "job_name" not in fields


def test_identity_ignores_try_number_and_labels_are_valid() -> None:
    from trainflow.core.naming import LABEL_VALUE_PATTERN

    op = TrainJobOperator(task_id="t", function="pkg.mod:train")
    first = op.build_request(ctx(try_number=1))
    retry = op.build_request(ctx(try_number=7))
    assert first.idempotency_key == retry.idempotency_key
    assert first.idempotency_key == idempotency_key(
        "dag.with.dots", "group.train", "scheduled__2026-03-05T00:00:00+00:00", -1
    )
    assert op.build_request(ctx(map_index=3)).idempotency_key != first.idempotency_key
    labels = first.labels
    assert "airflow.apache.org/map-index" not in labels
    assert all(LABEL_VALUE_PATTERN.match(v) and len(v) <= 63 for v in labels.values())
    assert labels["airflow.apache.org/dag-id"] == "dag.with.dots"
    assert labels["airflow.apache.org/run-id"] != "scheduled__2026-03-05T00:00:00+00:00"  # sanitised
    assert airflow_labels("d", "t", "r", 4)["airflow.apache.org/map-index"] == "4"
    assert not any("try" in k for k in labels)


def test_bad_request_names_the_field_before_anything_is_submitted() -> None:
    """A rule across fields fails the DAG file when every field is known at parse, else the task's request."""
    from trainflow.core import InvalidRequest

    with pytest.raises(InvalidRequest, match="give either 'function' or 'command'"):
        TrainJobOperator(task_id="t", function="pkg.mod:train", command=["python", "x.py"])
    op = TrainJobOperator(task_id="t", function="pkg.mod:train", request_file="r.yaml")
    op.request_file = "command: [python, x.py]\n"  # as rendered
    with pytest.raises(InvalidRequest, match="give either 'function' or 'command'"):
        op.build_request(ctx())


def test_execution_timeout_becomes_an_absolute_deadline() -> None:
    op = TrainJobOperator(task_id="t", function="m:f", execution_timeout=timedelta(minutes=30))
    assert op._deadline(ctx()) == datetime(2026, 3, 5, 1, 30, tzinfo=UTC).timestamp()
    assert TrainJobOperator(task_id="u", function="m:f")._deadline(ctx()) is None


def test_actions_are_validated_at_dag_parse() -> None:
    with pytest.raises(ValueError, match="on_kill_action"):
        TrainJobOperator(task_id="t", function="m:f", on_kill_action="destroy")
    with pytest.raises(ValueError, match="on_finish_action"):
        TrainJobOperator(task_id="t", function="m:f", on_finish_action="archive")
    with pytest.raises(ValueError, match="log_nodes"):
        TrainJobOperator(task_id="t", function="m:f", log_nodes="rank0")


@pytest.mark.parametrize(
    ("operators", "trainflow", "expected"),
    [(None, None, False), ("True", None, True), ("True", "False", False), ("False", "True", True)],
)
def test_deferrable_defaults_as_cncf_kubernetes_operators_do(
    monkeypatch: pytest.MonkeyPatch, operators: str | None, trainflow: str | None, expected: bool
) -> None:
    """``deferrable=None``: ``[trainflow] default_deferrable`` if set, else Airflow's own switch (False)."""
    from trainflow.airflow import TrainJobSensor

    for name, value in (("OPERATORS", operators), ("TRAINFLOW", trainflow)):
        if value is None:
            monkeypatch.delenv(f"AIRFLOW__{name}__DEFAULT_DEFERRABLE", raising=False)
        else:
            monkeypatch.setenv(f"AIRFLOW__{name}__DEFAULT_DEFERRABLE", value)
    assert TrainJobOperator(task_id="t", function="m:f").deferrable is expected
    assert TrainJobOperator(task_id="t", function="m:f", deferrable=not expected).deferrable is not expected
    assert TrainJobSensor(task_id="s", job_name="j").deferrable is expected


def test_on_kill_deletes_even_when_the_interrupted_thread_holds_the_log_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Airflow runs on_kill in its SIGTERM handler, on whichever thread the signal interrupted; if that
    thread was inside a (non-reentrant) logger write, on_kill must neither log nor wait on that lock."""
    import threading

    write_lock = threading.Lock()
    lines: list[str] = []
    cancelled: list[str] = []

    class Log:
        def info(self, msg: str, *args: object) -> None:
            with write_lock:
                lines.append(msg % args)

        exception = info

    class Backend:
        namespace = "ns"

        def cancel(self, ref: object) -> bool:
            cancelled.append(ref.name)  # type: ignore[attr-defined]
            return True

    monkeypatch.setattr(TrainJobOperator, "log", Log())
    op = TrainJobOperator(task_id="t", function="m:f")
    op._hook = SimpleNamespace(get_conn=Backend)  # type: ignore[attr-defined]
    op._trainjob_ref = {"name": "job-1", "namespace": "ns"}

    def interrupted_thread() -> None:
        with write_lock:  # the signal arrived mid-write
            op.on_kill()

    handler = threading.Thread(target=interrupted_thread, daemon=True)
    handler.start()
    handler.join(timeout=HANG)
    assert not handler.is_alive(), "on_kill blocked on a lock held by the thread it interrupted"
    assert cancelled == ["job-1"]
    for _ in range(int(HANG / 0.05)):  # the log line follows once the interrupted write released its lock
        if lines:
            break
        threading.Event().wait(0.05)
    assert lines == ["Task killed: deleted TrainJob ns/job-1: True"]


def test_resuming_builds_a_backend_only_to_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    """``execute_complete`` returns the trigger's result without a backend (building a kubernetes one cost
    2-3 CPU-s per resumed task); ``on_finish_action="delete"`` builds it, to delete."""
    from trainflow.core.result import JobState, TrainJobResult

    built: list[str] = []
    deleted: list[str] = []

    def get_backend(self: TrainJobOperator) -> SimpleNamespace:
        built.append(self.task_id)
        return SimpleNamespace(cancel=lambda ref: deleted.append(ref.name) or True)

    monkeypatch.setattr(TrainJobOperator, "get_backend", get_backend)
    result = TrainJobResult(name="job", namespace="ns", state=JobState.COMPLETE).to_dict()
    event = {"status": "success", "name": "job", "namespace": "ns", "result": result}
    kept = TrainJobOperator(task_id="keep", function="m:f")
    assert kept.execute_complete(ctx(), event)["name"] == "job"  # type: ignore[arg-type]
    assert built == [] and deleted == []
    gone = TrainJobOperator(task_id="delete", function="m:f", on_finish_action="delete")
    assert gone.execute_complete(ctx(), event)["state"] == "Complete"  # type: ignore[arg-type]
    assert built == ["delete"] and deleted == ["job"]
