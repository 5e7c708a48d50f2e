"""Reading TrainJob status into TrainJobResult: the Trainer's real condition shapes, tolerant of new fields."""

from __future__ import annotations

import json

from trainflow.core import JobState, result_from_trainjob
from trainflow.core.naming import derive_name, label_value

META = {"name": "j", "namespace": "ns", "uid": "u-1", "creationTimestamp": "2026-11-29T10:00:00Z"}


def job(status: dict, spec: dict | None = None, **meta: object) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {**META, **meta},
        "spec": spec or {"runtimeRef": {"name": "torch-distributed"}},
        "status": status,
    }


def cond(kind: str, status: str, reason: str, message: str = "", at: str = "2026-11-29T10:05:00Z") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def test_fresh_job_is_created() -> None:
    result = result_from_trainjob(job({}))
    assert result.state is JobState.CREATED and not result.state.terminal
    assert result.runtime == "torch-distributed" and result.uid == "u-1"


def test_active_jobs_mean_running() -> None:
    status = {"jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0}]}
    assert result_from_trainjob(job(status)).state is JobState.RUNNING


def test_complete_with_times_and_metrics() -> None:
    status = {
        "conditions": [cond("Complete", "True", "AllJobsCompleted", "jobset completed successfully")],
        "trainerStatus": {
            "progressPercentage": 100,
            "metrics": [{"name": "loss", "value": "0.25"}, {"name": "note", "value": "ok"}],
            "lastUpdatedTime": "2026-11-29T10:04:59Z",
        },
    }
    result = result_from_trainjob(job(status))
    assert result.state is JobState.COMPLETE and result.succeeded
    assert result.reason == "AllJobsCompleted"
    assert result.duration_seconds == 300.0
    assert result.metrics == {"loss": 0.25, "note": "ok"}
    assert result.progress == 100
    assert json.loads(json.dumps(result.to_dict()))["state"] == "Complete"


def test_failed_carries_reason_and_message() -> None:
    status = {
        "conditions": [cond("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline")]
    }
    result = result_from_trainjob(job(status))
    assert result.state is JobState.FAILED
    assert (result.reason, result.message) == ("DeadlineExceeded", "TrainJob exceeded its active deadline")


def test_suspended_is_queued_not_failed() -> None:
    status = {"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended")]}
    assert result_from_trainjob(job(status)).state is JobState.QUEUED


def test_resumed_job_is_not_stuck_in_suspended() -> None:
    """Suspended=False/Resumed stays forever after a resume (Kueue): it must not hide the real state."""
    status = {
        "conditions": [
            cond("Suspended", "False", "Resumed", "TrainJob is resumed", at="2026-11-29T10:01:00Z")
        ],
        "jobsStatus": [{"name": "node", "active": 1}],
    }
    result = result_from_trainjob(job(status))
    assert result.state is JobState.RUNNING
    status["conditions"].append(cond("Complete", "True", "AllJobsCompleted"))
    result = result_from_trainjob(job(status))
    assert result.state is JobState.COMPLETE
    assert result.duration_seconds == 240.0  # timed from the resume, not from creation


def test_suspended_spec_without_conditions_is_queued() -> None:
    result = result_from_trainjob(job({}, spec={"runtimeRef": {"name": "x"}, "suspend": True}))
    assert result.state is JobState.QUEUED


def test_unknown_fields_from_a_newer_server_are_ignored() -> None:
    status = {
        "conditions": [
            cond("Complete", "True", "AllJobsCompleted"),
            {"type": "FutureThing", "status": "True"},
        ],
        "futureStatusField": {"x": 1},
        "trainerStatus": {"metrics": [{"name": "acc", "value": "0.9", "unit": "ratio"}], "newField": 1},
    }
    result = result_from_trainjob(job(status, futureMeta="x"))
    assert result.state is JobState.COMPLETE and result.metrics == {"acc": 0.9}


def test_output_uri_comes_from_the_annotation() -> None:
    obj = job({}, annotations={"trainflow.dev/output-uri": "s3://b/m"})
    assert result_from_trainjob(obj).output_uri == "s3://b/m"


def test_derived_names_are_stable_and_distinct_per_attempt() -> None:
    key = "dag=retrain/run=scheduled__2026-11-29T00:00:00+00:00/task=train/map=-1"
    assert derive_name(key) == derive_name(key)
    assert derive_name(key) != derive_name(key, attempt=2)
    assert derive_name(key, attempt=2).endswith("-2")
    assert derive_name(key) != derive_name(key + "x")
    assert len(derive_name("k" * 1000, attempt=99)) <= 40


def test_label_values_are_sanitised() -> None:
    assert label_value("ok-value") == "ok-value"
    for raw in ["scheduled__2026-11-29T00:00:00+00:00", "x" * 100, "ユニコード", "-a-"]:
        value = label_value(raw)
        assert len(value) <= 63
        assert value == "" or (value[0].isalnum() and value[-1].isalnum())
    assert label_value("a b") != label_value("a-b")
