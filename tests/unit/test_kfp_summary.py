"""The KFP step's Markdown summary and the dashboard link template it shares with the Airflow extra link."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from trainflow.core import JobState, TrainJobResult
from trainflow.core.links import dashboard_url
from trainflow.kfp import summary


def result(**kw: object) -> TrainJobResult:
    base: dict[str, object] = dict(
        name="train-job-3f2a-1a2b3c4d5e",
        namespace="ml",
        state=JobState.COMPLETE,
        uid="u-1",
        reason="AllJobsCompleted",
        runtime="torch-distributed",
        duration_seconds=12.34,
        metrics={"loss": 0.001234567, "note": "a|b <i>", "epochs": 3},
        output_uri="s3://bucket/models/run-1",
        attempt=2,
    )
    base.update(kw)
    return TrainJobResult(**base)  # type: ignore[arg-type]


def test_dashboard_url_fills_the_template_or_gives_nothing() -> None:
    assert (
        dashboard_url("https://dash/{namespace}/{name}?u={uid}", "a", "ml", "u-1")
        == "https://dash/ml/a?u=u-1"
    )
    assert dashboard_url("https://dash/{nope}", "a", "ml") == ""  # a bad template costs the link only
    assert dashboard_url("https://dash/{0}", "a", "ml") == ""
    assert dashboard_url("", "a", "ml") == "" and dashboard_url("https://d/{name}", None, "ml") == ""


def test_summary_lists_job_state_metrics_model_and_link() -> None:
    text = summary.render(
        result(),
        link="https://dash/ml/train job (1)",
        launched="Reattaching to running TrainJob ml/x (attempt 2)",
        framework="torch",
        model={"model_uri": "s3://bucket/models/run-1"},
    )
    lines = text.splitlines()
    assert lines[0] == "## TrainJob `ml/train-job-3f2a-1a2b3c4d5e`: Complete"
    assert "| TrainJob | [`ml/train-job-3f2a-1a2b3c4d5e`](https://dash/ml/train%20job%20%281%29) |" in lines
    assert "| state | Complete (AllJobsCompleted) |" in lines
    assert "| runtime | `torch-distributed` (torch) |" in lines
    assert "| attempt | 2 |" in lines and "| duration | 12.3 s |" in lines
    assert "| launch | Reattaching to running TrainJob ml/x (attempt 2) |" in lines
    assert "| trainer output | `s3://bucket/models/run-1` |" in lines
    assert "| Model artifact | metadata only (the files stay at the trainer output) |" in lines
    # one row per metric, sorted; table cells cannot break the table or inject HTML
    metrics = lines[lines.index("### Metrics") + 4 :]
    assert metrics == ["| epochs | 3 |", "| loss | 0.00123457 |", "| note | a\\|b &lt;i&gt; |"]


def test_summary_of_copied_files_and_of_no_link() -> None:
    files = [f"shard-{i:02d}.pt" for i in range(summary.MAX_FILES_LISTED + 3)]
    text = summary.render(result(metrics={}), model={"files": files})
    assert "| TrainJob | `ml/train-job-3f2a-1a2b3c4d5e` |" in text
    assert f"| Model artifact | {len(files)} file(s): `shard-00.pt`, " in text and " and 3 more |" in text
    assert "### Metrics" not in text
    assert "| Model artifact | empty: the trainer wrote no files |" in summary.render(
        result(), model={"files": []}
    )


def test_dashboard_template_from_the_parameter_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(summary.DASHBOARD_ENV, raising=False)
    assert summary.dashboard_template(None) == ""
    monkeypatch.setenv(summary.DASHBOARD_ENV, "https://env/{name}")
    assert summary.dashboard_template(None) == "https://env/{name}"
    assert summary.dashboard_template("https://param/{name}") == "https://param/{name}"
    assert summary.dashboard_template("{{$.inputs.parameters['x']}}") == "https://env/{name}"


def test_write_creates_the_artifact_file(tmp_path: Path) -> None:
    path = f"{tmp_path}/nested/summary"
    summary.write(SimpleNamespace(path=path), "# hi\n")
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == "# hi\n"
