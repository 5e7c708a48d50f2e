"""The artifact manifest (docs/artifacts.md): a reader refuses a malformed or hostile one before reading a byte
of the files, and the nodes of one run derive the same attempt name from their env."""

from __future__ import annotations

import json

import pytest

from trainflow.core import artifact, publish

SHA = "a" * 64


def manifest(**over: object) -> bytes:
    data = {
        "format": artifact.FORMAT,
        "uri": "s3://b/m",
        "attempt": "20261205T000000000000Z-0123456789ab",
        "files": [{"path": "config.json", "size": 2, "sha256": SHA}],
        "job": {},
        "created": "2026-12-05T00:00:00.000Z",
    }
    data.update(over)
    return json.dumps(data).encode()


def test_a_manifest_built_is_read_back() -> None:
    raw = artifact.build("s3://b/m", "a-1", [{"path": "x/y.bin", "size": 3, "sha256": SHA}], {"name": "j"})
    data = artifact.parse_manifest(raw, "s3://b/m")
    assert data["files"] == [{"path": "x/y.bin", "size": 3, "sha256": SHA}] and data["job"] == {"name": "j"}
    assert artifact.named_attempt(raw) == "a-1"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "not JSON"),
        (manifest(format="other/v1"), "format"),
        (manifest(attempt="../x"), "attempt"),
        (manifest(files=[]), "no files"),
        (manifest(files=[{"path": "../etc/passwd", "size": 1, "sha256": SHA}]), "unsafe"),
        (manifest(files=[{"path": "/abs", "size": 1, "sha256": SHA}]), "unsafe"),
        (manifest(files=[{"path": "a//b", "size": 1, "sha256": SHA}]), "unsafe"),
        (manifest(files=[{"path": "a\\b", "size": 1, "sha256": SHA}]), "unsafe"),
        (manifest(files=[{"path": "a", "size": -1, "sha256": SHA}]), "size"),
        (manifest(files=[{"path": "a", "size": True, "sha256": SHA}]), "size"),
        (manifest(files=[{"path": "a", "size": 1, "sha256": "zz"}]), "sha256"),
        (manifest(files=[{"path": "a", "size": 1, "sha256": SHA}] * 2), "twice"),
        (
            manifest(
                files=[{"path": "a", "size": 1, "sha256": SHA}, {"path": "a/b", "size": 1, "sha256": SHA}]
            ),
            "both a file and a directory",
        ),
    ],
)
def test_a_malformed_or_hostile_manifest_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(artifact.ManifestError, match=why):
        artifact.parse_manifest(raw, "s3://b/m")


def test_the_nodes_of_one_run_share_an_attempt_and_a_relaunch_gets_another() -> None:
    kube = {
        "TRAINFLOW_JOB_NAME": "train-abc",
        "TRAINFLOW_JOB_ATTEMPT": "0",
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
    }
    assert publish.job_attempt(kube) == "train-abc-0"
    assert publish.job_attempt({**kube, "TRAINFLOW_JOB_ATTEMPT": "1"}) == "train-abc-1"
    local = {"TRAINFLOW_JOB_UID": "5f1c/uid", "TRAINFLOW_JOB_ATTEMPT": "9a8b", "TRAINFLOW_JOB_NAME": "j"}
    assert publish.job_attempt(local) == "5f1c-uid-9a8b"
    assert publish.job_attempt({}) is None
    assert publish.node_position(kube) == (1, 2)
    assert publish.node_position({"PET_NODE_RANK": "2", "PET_NNODES": "2"}) == (0, 1)
    assert publish.node_position({"PET_NODE_RANK": "x"}) == (0, 1)
    assert publish.is_local_rank0({"LOCAL_RANK": "0"}) and not publish.is_local_rank0({"LOCAL_RANK": "1"})
