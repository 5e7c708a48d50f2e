"""Retry attempts: a new attempt gets a new deterministic name and says which attempt it is."""

from __future__ import annotations

from pathlib import Path

from trainflow.core import get_backend, render, result_from_trainjob

REQUEST = {"idempotency_key": "dag/run/task", "command": ["python3", "-c", "pass"]}


def test_attempts_have_distinct_stable_names_and_labels(tmp_path: Path) -> None:
    backend = get_backend("local", home=tmp_path)
    first = render(backend, REQUEST)
    second = render(backend, REQUEST, attempt=2)
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert second["metadata"]["name"] == render(backend, REQUEST, attempt=2)["metadata"]["name"]
    assert second["metadata"]["name"].endswith("-2")
    assert (
        first["metadata"]["labels"]["trainflow.dev/key"] == second["metadata"]["labels"]["trainflow.dev/key"]
    )
    assert second["metadata"]["labels"]["trainflow.dev/attempt"] == "2"
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_result_reports_labels_and_attempt(tmp_path: Path) -> None:
    manifest = render(get_backend("local", home=tmp_path), REQUEST, attempt=3)
    result = result_from_trainjob(manifest)
    assert result.attempt == 3
    assert result.labels["app.kubernetes.io/managed-by"] == "trainflow"
    assert result.to_dict()["attempt"] == 3
