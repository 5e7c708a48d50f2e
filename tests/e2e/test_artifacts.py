"""Model artifacts you can trust (issue 32, docs/artifacts.md) against the testbed's S3-compatible store (versitygw):
a publish that fails at any step leaves nothing a reader takes for a model, a retrain yields exactly the new file
set, a reader racing a retrain sees the old model or the new one and never a mix, a trainer that fails after
writing publishes nothing. Faults come from a loopback proxy in front of the real store (tests/e2e/s3faults.py):
503 answers and connections cut mid-body, the real client seeing them as it would from a network.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from s3faults import Rule, fault_proxy

from conftest import env_of
from trainflow.core import JobState, artifact, get_backend, storage

pytestmark = pytest.mark.e2e


def model(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def read_all(got: Path) -> dict[str, bytes]:
    return {p.relative_to(got).as_posix(): p.read_bytes() for p in sorted(got.rglob("*")) if p.is_file()}


def keys_under(store: dict[str, str], uri: str) -> list[str]:
    """Every object under the URI's prefix, as the store lists them (the plain escape hatch reads them all)."""
    bucket, prefix = storage.split(uri)
    op = storage.operator(bucket, env_of(store))
    return sorted(
        e.path[len(prefix) + 1 :] for e in op.list(f"{prefix}/", recursive=True) if not e.path.endswith("/")
    )


def fresh(store: dict[str, str], name: str) -> str:
    return f"s3://{store['bucket']}/artifacts/{name}/{time.time_ns()}"


OLD = {"index.json": b'{"shards": 2}', "shard-1.bin": b"1" * 1000, "shard-2.bin": b"2" * 1000}
NEW = {"config.json": b'{"a": 1}', "weights.bin": os.urandom(12 * 1024 * 1024 + 5), "z/tokenizer.json": b"{}"}


class FailingSource(io.BytesIO):
    """A source whose third read fails, as the issue's report had it (a read error on the third chunk)."""

    reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        if self.reads == 3:
            raise OSError("injected read error on the third chunk")
        return super().read(1024 if size is None or size < 0 else min(size, 1024))


def test_a_writer_that_fails_mid_file_commits_no_object(store: dict[str, str]) -> None:
    bucket, prefix = storage.split(fresh(store, "abort"))
    op = storage.operator(bucket, env_of(store))
    with pytest.raises(OSError, match="third chunk"):
        storage.put_stream(op, f"{prefix}/weights.bin", FailingSource(b"w" * 10_000))
    assert [e.path for e in op.list(f"{prefix}/", recursive=True)] == [], "a truncated object was committed"


FAULTS = {  # where the publish of NEW fails: (method, path?query regex, action, bytes of body let through)
    "mid-file": ("PUT", r"/weights\.bin", "cut", 2048),
    "between-files": ("PUT", r"/z/tokenizer\.json", "503", 0),
    "before-the-manifest": ("GET", r"/trainflow-manifest\.json", "503", 0),
    "at-the-manifest": ("PUT", r"/trainflow-manifest\.json", "503", 0),
}


@pytest.mark.parametrize("previous", [False, True], ids=["first-publish", "retrain"])
@pytest.mark.parametrize("step", list(FAULTS))
def test_a_publish_failing_at_any_step_leaves_no_model_a_reader_takes(
    store: dict[str, str], tmp_path: Path, step: str, previous: bool
) -> None:
    uri = fresh(store, f"fault-{step}")
    if previous:
        storage.upload(model(tmp_path / "old", OLD), uri, env_of(store))
    method, path, action, after = FAULTS[step]
    with fault_proxy(store["AWS_ENDPOINT_URL"], Rule(method, path, action, after)) as proxy:
        with pytest.raises(storage.StorageError) as info:
            storage.upload(model(tmp_path / "new", NEW), uri, env_of(store, AWS_ENDPOINT_URL=proxy.endpoint))
        assert proxy.faults >= 1, proxy.seen
    assert uri in str(info.value) and store["AWS_SECRET_ACCESS_KEY"] not in str(info.value)
    if previous:  # a reader sees exactly the previous model
        assert storage.download(uri, tmp_path / "got", env_of(store)) == sorted(OLD)
        assert read_all(tmp_path / "got") == OLD
        attempt = storage.read_manifest(uri, env_of(store))["attempt"]
        leftover = [k for k in keys_under(store, uri) if not k.startswith(f"trainflow-attempts/{attempt}/")]
    else:
        with pytest.raises(storage.StorageError, match="no trainflow manifest"):
            storage.download(uri, tmp_path / "got", env_of(store))
        leftover = keys_under(store, uri)
    assert leftover == ([storage.artifact.MANIFEST] if previous else []), "the failed attempt left objects"


def test_a_retrain_into_the_same_uri_yields_exactly_the_new_file_set(
    store: dict[str, str], tmp_path: Path
) -> None:
    uri = fresh(store, "retrain")
    run2 = {"index.json": b'{"shards": 0}', "model.safetensors": b"s" * 2000}
    for i, files in enumerate((OLD, run2, OLD)):
        storage.upload(model(tmp_path / f"run{i}", files), uri, env_of(store))
        got = tmp_path / f"got{i}"
        assert storage.download(uri, got, env_of(store)) == sorted(files)
        assert read_all(got) == files
        manifest = storage.read_manifest(uri, env_of(store))
        # the store holds the manifest and this attempt's files, nothing of the earlier runs
        expected = sorted(
            [storage.artifact.MANIFEST, *(f"trainflow-attempts/{manifest['attempt']}/{f}" for f in files)]
        )
        assert keys_under(store, uri) == expected
    assert [f["path"] for f in manifest["files"]] == sorted(OLD)
    assert all(len(f["sha256"]) == 64 and f["size"] == len(OLD[f["path"]]) for f in manifest["files"])


def test_a_reader_racing_retrains_sees_the_old_model_or_the_new_never_a_mix(
    store: dict[str, str], tmp_path: Path
) -> None:
    uri = fresh(store, "race")
    versions = [  # each file holds its version's tag, and the two file sets differ
        {"index.json": b"A" * 10, "shard-1.bin": b"A" * 300_000, "shard-2.bin": b"A" * 300_000},
        {"index.json": b"B" * 10, "model.safetensors": b"B" * 500_000},
    ]
    sources = [model(tmp_path / f"v{i}", files) for i, files in enumerate(versions)]
    storage.upload(sources[0], uri, env_of(store))
    stop, published, errors = threading.Event(), [0], []

    def publisher() -> None:
        try:
            i = 1
            while not stop.is_set() and published[0] < 40:
                storage.upload(sources[i % 2], uri, env_of(store))
                published[0] += 1
                i += 1
        except Exception as e:  # reported by the test below
            errors.append(e)
        finally:
            stop.set()

    thread = threading.Thread(target=publisher)
    thread.start()
    seen: dict[int, int] = {0: 0, 1: 0}
    reads = 0
    try:
        while not stop.is_set():
            got = tmp_path / f"read-{reads}"
            storage.download(uri, got, env_of(store))
            files = read_all(got)
            assert files in versions, {k: v[:1] for k, v in files.items()}
            seen[versions.index(files)] += 1
            reads += 1
    finally:
        stop.set()
        thread.join(timeout=600)
    assert errors == []
    print(f"race: {published[0]} publishes, {reads} reads, old/new seen {seen}")
    assert published[0] >= 10 and reads >= 10 and seen[0] and seen[1]


def trains_then_fails() -> None:
    from trainflow.core import output_dir

    (output_dir() / "weights.json").write_text("{}")
    raise RuntimeError("diverged after writing")


def trains(scale: float) -> dict[str, Any]:
    import json as _json

    from trainflow.core import output_dir

    (output_dir() / "weights.json").write_text(_json.dumps({"w": 2 * scale}))
    return {"ok": True}


def local_request(
    store: dict[str, str], home: Path, name: str, fn: Any, uri: str, **extra: Any
) -> dict[str, Any]:
    secrets = home / "secrets" / "store"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "access_key_id").write_text(store["AWS_ACCESS_KEY_ID"])
    (secrets / "secret_access_key").write_text(store["AWS_SECRET_ACCESS_KEY"])
    return {
        "name": name,
        "function": fn,
        "output_uri": uri,
        "env": {"AWS_ENDPOINT_URL": store["AWS_ENDPOINT_URL"], "AWS_REGION": store["AWS_REGION"]},
        "secret_env": {
            "AWS_ACCESS_KEY_ID": "store/access_key_id",
            "AWS_SECRET_ACCESS_KEY": "store/secret_access_key",
        },
        **extra,
    }


def test_a_trainer_that_fails_after_writing_publishes_nothing(store: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    backend = get_backend("local", home=home, namespace="art")
    uri = fresh(store, "trainer-fails")
    ref = backend.submit(local_request(store, home, "fails", trains_then_fails, uri))
    result = backend.wait(ref, timeout=300, raise_on_failure=False)
    assert result.state == JobState.FAILED
    assert keys_under(store, uri) == []
    with pytest.raises(storage.StorageError, match="no trainflow manifest"):
        storage.download(uri, tmp_path / "got", env_of(store))
    # the same URI then trained successfully: the manifest names the job that published
    request = local_request(store, home, "works", trains, uri, function_kwargs={"scale": 2.0})
    result = backend.wait(backend.submit(request), timeout=300)
    assert result.state == JobState.COMPLETE
    assert storage.download(uri, tmp_path / "got", env_of(store)) == ["weights.json"]
    job = storage.read_manifest(uri, env_of(store))["job"]
    assert job["namespace"] == "art" and job["name"] == "works" and job["uid"], job


def writes_a_shard(tag: str) -> dict[str, Any]:
    """Each rank writes its own shard, as torch DCP saves one file per rank (rank 0 also the metadata)."""
    import os as _os

    from trainflow.core import output_dir

    rank = int(_os.environ["RANK"])
    (output_dir() / f"__{rank}_0.distcp").write_bytes(f"{tag}:{rank}".encode() * 1000)
    if rank == 0:
        (output_dir() / ".metadata").write_text(tag)
    return {"rank": rank}


def test_every_node_shards_of_a_two_node_job_are_published_as_one_model(
    store: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    backend = get_backend("local", home=home, namespace="art")
    uri = fresh(store, "two-nodes")
    for tag in ("run1", "run2"):  # the second run replaces the first, shard for shard
        request = local_request(
            store, home, f"shards-{tag}", writes_a_shard, uri, function_kwargs={"tag": tag}, num_nodes=2
        )
        result = backend.wait(backend.submit(request), timeout=300)
        assert result.state == JobState.COMPLETE, (
            result.message,
            list(backend.logs(result.name, step="node-1")),
        )
        got = tmp_path / f"got-{tag}"
        assert storage.download(uri, got, env_of(store)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert read_all(got) == {
            ".metadata": tag.encode(),
            "__0_0.distcp": f"{tag}:0".encode() * 1000,
            "__1_0.distcp": f"{tag}:1".encode() * 1000,
        }
        manifest = storage.read_manifest(uri, env_of(store))
        assert manifest["job"]["name"] == f"shards-{tag}"
        # the parts the nodes wrote are gone once node 0 committed; no earlier attempt remains
        assert {k.split("/")[0] for k in keys_under(store, uri)} == {
            "trainflow-attempts",
            "trainflow-manifest.json",
        }


def test_the_kfp_model_artifact_records_what_the_manifest_committed(
    store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kfp's own ``dsl.Model`` filled by the step's publish: a committed output names its files and the prefix
    holding exactly them; an output whose publish never committed fails the step, naming the URI."""
    from kfp import dsl

    from trainflow.kfp import artifacts

    for key, value in env_of(store).items():  # the step's own credentials (its process env)
        monkeypatch.setenv(key, value)
    result = type("Result", (), {"name": "j", "namespace": "ns", "state": JobState.COMPLETE, "runtime": "torch",
                                 "metrics": {}, "duration_seconds": 1.0, "output_uri": None})()  # fmt: skip
    uri = fresh(store, "kfp-model")
    storage.upload(model(tmp_path / "old", OLD), uri, env_of(store))
    storage.upload(model(tmp_path / "new", NEW), uri, env_of(store))
    got = dsl.Model(name="model", uri=uri)
    artifacts.publish(result, None, uri, got, None)
    assert got.uri == uri and got.metadata["manifest"] == "verified", got.metadata
    assert sorted(got.metadata["files"]) == sorted(NEW)
    committed = got.metadata["committed_uri"]
    assert keys_under(store, committed) == sorted(NEW), (
        "the committed prefix holds exactly the manifest's files"
    )
    assert {f["path"]: f["size"] for f in got.metadata["manifest_files"]} == {
        k: len(v) for k, v in NEW.items()
    }

    torn = fresh(store, "kfp-uncommitted")
    bucket, prefix = storage.split(torn)
    storage.put_files(  # the files of a publish that stopped before its manifest
        storage.operator(bucket, env_of(store)), torn, prefix, artifact.new_attempt(),
        storage.local_files(tmp_path / "new"), env_of(store),
    )  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit):
        artifacts.publish(result, None, torn, dsl.Model(name="model", uri=torn), None)
    assert f"never committed: no trainflow manifest at {torn}/" in capsys.readouterr().err
