"""Delete / Suspend / Resume operators against the real local engine (execute() called directly)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.airflow.operators import (
    DeleteTrainJobOperator,
    ResumeTrainJobOperator,
    SuspendTrainJobOperator,
)


def sleeper(seconds: float = 60.0) -> None:
    import time

    time.sleep(seconds)


def test_suspend_resume_and_delete(trainflow_home: Path, local_backend) -> None:
    from airflow.sdk.exceptions import AirflowException

    from trainflow.core import TrainJobNotFound, TrainJobRequest

    ref = local_backend.submit(
        TrainJobRequest(
            runtime="jax-distributed", name="act-job", function=sleeper, function_kwargs={"seconds": 60}
        )
    )
    common = {"job_name": "act-job", "backend": "local", "local_home": str(trainflow_home), "conn_id": None}

    suspended = SuspendTrainJobOperator(task_id="suspend", **common).execute({})
    # the supervisor stops the nodes and marks the job Suspended on its own time, as the Trainer does: the
    # operator returns what the job says at once (Queued, or still Running when the nodes were up; at load
    # 10-13 they were)
    assert suspended["state"] in ("Queued", "Running")
    end = time.time() + HANG
    while local_backend.get(ref).state.value != "Queued" and time.time() < end:
        time.sleep(0.2)
    assert local_backend.get(ref).state.value == "Queued"

    resumed = ResumeTrainJobOperator(task_id="resume", **common).execute({})
    # resuming is as asynchronous as suspending: the job may still say Queued; that it runs again is the check
    assert resumed["state"] in ("Queued", "Created", "Running")
    end = time.time() + HANG
    while local_backend.get(ref).state.value != "Running" and time.time() < end:
        time.sleep(0.2)
    assert local_backend.get(ref).state.value == "Running"

    assert DeleteTrainJobOperator(task_id="delete", **common).execute({}) is True
    with pytest.raises(TrainJobNotFound):
        local_backend.get(ref)
    assert DeleteTrainJobOperator(task_id="again", **common).execute({}) is False
    with pytest.raises(AirflowException, match="does not exist"):
        DeleteTrainJobOperator(task_id="strict", fail_if_missing=True, **common).execute({})
