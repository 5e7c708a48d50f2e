"""s3:// outputs against the testbed's S3-compatible store (versitygw, which checks every SigV4 signature), no pods:
``trainflow.core.storage`` (upload, download, its errors) and the local engine, which publishes an ``s3://``
output_uri from the job's own directory and refuses ``s3://`` inputs with the fix. The pods suite
(tests/e2e_pods/test_objstore_pods.py, test_airflow_pods.py) runs the same contract in real containers.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from conftest import env_of
from trainflow.core import InvalidRequest, JobState, get_backend, storage

pytestmark = pytest.mark.e2e


def test_upload_and_download_round_trip_every_file(store: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    blob = os.urandom(20 * 1024 * 1024 + 7)  # more than two upload chunks
    (src / "sub" / "weights.bin").write_bytes(blob)
    uri = f"s3://{store['bucket']}/round-trip/{time.time_ns()}"
    assert storage.upload(src, uri, env_of(store)) == ["config.json", "sub/weights.bin"]
    got = storage.download(uri, tmp_path / "got", env_of(store))
    assert got == ["config.json", "sub/weights.bin"]
    assert (tmp_path / "got" / "sub" / "weights.bin").read_bytes() == blob


def test_store_faults_are_clear_errors_without_the_credential(store: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.json").write_text("{}")
    uri = f"s3://{store['bucket']}/faults/{time.time_ns()}"
    storage.upload(src, uri, env_of(store))
    wrong = "X" * 40
    with pytest.raises(storage.StorageError) as info:
        storage.download(uri, tmp_path / "a", env_of(store, AWS_SECRET_ACCESS_KEY=wrong))
    assert "SignatureDoesNotMatch" in str(info.value) and uri in str(info.value)
    assert wrong not in str(info.value) and store["AWS_SECRET_ACCESS_KEY"] not in str(info.value)
    with pytest.raises(
        storage.StorageError, match=r"no trainflow manifest at .*-missing/trainflow-manifest.json"
    ):
        storage.download(f"{uri}-missing", tmp_path / "b", env_of(store))
    t0 = time.monotonic()
    with pytest.raises(storage.StorageError, match=r"127\.0\.0\.1:9"):
        storage.download(uri, tmp_path / "c", env_of(store, AWS_ENDPOINT_URL="http://127.0.0.1:9"))
    assert time.monotonic() - t0 < 60  # a refused connection is retried a bounded number of times
    with pytest.raises(storage.StorageError, match="use s3://bucket/prefix"):
        storage.download("s3://", tmp_path / "d", env_of(store))


def test_a_symlink_in_the_output_is_refused_not_followed(store: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "secret.txt").write_text("not for upload")
    (src / "link").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(storage.StorageError, match="is a symlink"):
        storage.upload(src, f"s3://{store['bucket']}/links", env_of(store))


def train(scale: float) -> dict:
    """A local function trainer: its model to output_dir(), which the engine stages in the job's directory."""
    import json

    from trainflow.core import output_dir

    out = output_dir()
    (out / "weights.json").write_text(json.dumps({"w": 2 * scale}))
    return {"staged_in": str(out)}


def test_the_local_engine_publishes_an_s3_output_and_refuses_s3_inputs(
    store: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    secrets = home / "secrets" / "store"
    secrets.mkdir(parents=True)
    (secrets / "access_key_id").write_text(store["AWS_ACCESS_KEY_ID"])
    (secrets / "secret_access_key").write_text(store["AWS_SECRET_ACCESS_KEY"])
    backend = get_backend("local", home=home, namespace="s3")
    uri = f"s3://{store['bucket']}/local/{time.time_ns()}"
    request = {
        "name": "s3-out",
        "function": train,
        "function_kwargs": {"scale": 1.5},
        "output_uri": uri,
        "env": {"AWS_ENDPOINT_URL": store["AWS_ENDPOINT_URL"], "AWS_REGION": store["AWS_REGION"]},
        "secret_env": {
            "AWS_ACCESS_KEY_ID": "store/access_key_id",
            "AWS_SECRET_ACCESS_KEY": "store/secret_access_key",
        },
    }
    result = backend.wait(backend.submit(request), timeout=180)
    assert result.state == JobState.COMPLETE and result.output_uri == uri
    staged = Path(result.return_value["staged_in"])
    assert staged.name == "output-staging" and home in staged.parents
    assert stat.S_IMODE(staged.stat().st_mode) == 0o700
    assert storage.download(uri, tmp_path / "got", env_of(store)) == ["weights.json"]
    assert json.loads((tmp_path / "got" / "weights.json").read_text()) == {"w": 3.0}
    # no local runtime runs an initializer: an s3:// input is refused before anything starts, naming the field
    with pytest.raises(InvalidRequest) as info:
        backend.submit(
            {
                "name": "s3-in",
                "runtime": "torch-distributed-with-cache",
                "command": ["true"],
                "dataset_uri": f"s3://{store['bucket']}/data",
            }
        )
    assert info.value.fields == ["dataset_uri"], info.value
    assert backend.list() == [r for r in backend.list() if r.name == "s3-out"]
