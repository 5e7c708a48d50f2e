"""Golden tests: every example request renders to the checked-in manifest, which the CRD schema accepts.

Regenerate after an intended change with: TRAINFLOW_UPDATE_GOLDEN=1 pytest tests/unit/test_manifest_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from trainflow.core import TrainJobRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime
from trainflow.core.schema import schema_errors

REPO = Path(__file__).resolve().parents[2]
REQUESTS = sorted((REPO / "dags_examples" / "requests").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"


def render(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    runtime = find_runtime(local_catalog(), data.get("runtime", "torch-distributed"))
    return build_trainjob(data, runtime)


def test_there_are_example_requests() -> None:
    assert len(REQUESTS) >= 8


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.stem)
def test_render_matches_golden(path: Path) -> None:
    manifest = render(path)
    golden = GOLDEN / f"{path.stem}.json"
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    if os.environ.get("TRAINFLOW_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; run with TRAINFLOW_UPDATE_GOLDEN=1"
    assert text == golden.read_text()


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden_is_valid_against_vendored_crd(path: Path) -> None:
    manifest = json.loads(path.read_text())
    assert list(schema_errors(manifest)) == []
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob"


def test_examples_cover_every_request_field() -> None:
    used: set[str] = set()
    for path in REQUESTS:
        used |= set(yaml.safe_load(path.read_text()))
    assert set(TrainJobRequest.model_fields) - used == set()


def test_upstream_examples_are_valid_for_the_schema_check() -> None:
    """Our strict schema check accepts every TrainJob the Trainer project ships as an example."""
    count = 0
    for path in sorted((REPO / "src/trainflow/core/data/runtimes").glob("*.yaml")):
        assert path.read_text().startswith("# Copyright The Kubeflow Authors.")
    upstream = REPO / "tests" / "data" / "upstream_trainer_examples"
    assert upstream.is_dir(), f"vendored upstream examples missing at {upstream}"
    for path in sorted(upstream.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "TrainJob":
                assert list(schema_errors(doc)) == [], path.name
                count += 1
    assert count >= 5


def test_schema_check_rejects_unknown_and_mistyped_fields() -> None:
    bad = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "x"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": "2", "numNode": 1}},
    }
    errors = dict(schema_errors(bad))
    assert "spec.trainer.numNodes" in errors
    # the unknown field is named by its own path, as the API server's strict field validation names it
    assert "unknown field 'numNode'" in errors["spec.trainer.numNode"]
