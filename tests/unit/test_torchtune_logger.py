"""trainflow.core.torchtune_logger.TrainflowLogger, one function at a time: what a recipe's log calls become as reports
(the local engine's job state is the sink here), and when close() publishes. The whole path (a real recipe,
the Trainer's status server, the store) is tests/e2e_pods/test_torchtune_pods.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainflow.core import storage
from trainflow.core.torchtune_logger import TrainflowLogger


class Scalar:
    """A 0-d tensor stand-in: TorchTune logs grad_norm as one."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


@pytest.fixture
def jobdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("KUBEFLOW_TRAINER_SERVER_URL", "RANK", "TRAINFLOW_OUTPUT_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINFLOW_LOCAL_JOB_DIR", str(tmp_path))
    return tmp_path


def reports(jobdir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (jobdir / "reports.jsonl").read_text().splitlines()]


def test_each_logged_step_is_a_report_with_progress_from_the_step_budget(jobdir: Path) -> None:
    logger = TrainflowLogger()
    logger.log_config({"epochs": 2, "max_steps_per_epoch": 4, "output_dir": "/workspace/output"})
    logger.log_dict(
        {"loss": 11.5, "lr": 3e-4, "grad_norm": Scalar(0.25), "note": "text", "bad": float("nan")}, 1
    )
    logger.log("loss", 10.0, 8)
    seen = reports(jobdir)
    assert seen[0]["metrics"] == {"loss": 11.5, "lr": 3e-4, "grad_norm": 0.25}
    assert seen[0]["progressPercentage"] == 12  # 1 of 8 steps
    assert seen[1]["progressPercentage"] == 99  # the last step: 100 % only once the recipe closes
    logger.close()
    assert reports(jobdir)[-1]["progressPercentage"] == 100
    assert reports(jobdir)[-1]["metrics"] == {"loss": 10.0, "lr": 3e-4, "grad_norm": 0.25}


def test_no_progress_without_a_step_budget(jobdir: Path) -> None:
    logger = TrainflowLogger()
    logger.log_config({"epochs": 1, "max_steps_per_epoch": None, "output_dir": "/workspace/output"})
    logger.log_dict({"loss": 2.0}, 5)
    assert "progressPercentage" not in reports(jobdir)[0]


def test_close_publishes_nothing_for_a_local_output(jobdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", str(jobdir / "model"))
    logger = TrainflowLogger()
    logger.log_config({"output_dir": str(jobdir / "missing")})
    logger.close()  # a local output_uri: the recipe's output_dir is the user's to copy


def test_close_refuses_an_empty_or_missing_output_for_an_object_store(
    jobdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", "s3://bucket/adapters/run-1")
    logger = TrainflowLogger()
    logger.log_config({"output_dir": str(jobdir / "missing")})
    with pytest.raises(storage.StorageError, match="missing: nothing to publish"):
        logger.close()
    (jobdir / "empty").mkdir()
    logger.log_config({"output_dir": str(jobdir / "empty")})
    with pytest.raises(storage.StorageError, match="empty: nothing to publish"):
        logger.close()


def test_only_rank_zero_publishes(jobdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFLOW_OUTPUT_URI", "s3://bucket/adapters/run-1")
    monkeypatch.setenv("RANK", "1")
    logger = TrainflowLogger()
    logger.log_config({"output_dir": str(jobdir / "missing")})
    logger.close()  # another rank: neither a report nor an upload
    assert not (jobdir / "reports.jsonl").exists()
