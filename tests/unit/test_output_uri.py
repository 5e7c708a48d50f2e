"""Strict output URIs (issue 32): every malformed form is refused before anything runs, naming ``output_uri``, on
every path a request takes (the core's request validation, the KFP step, the CLI; the Airflow operator at DAG
parse in tests/airflow/test_airflow_output_uri.py), and ``storage`` refuses the same forms itself; userinfo never
reaches a message. The table is tests/output_uris.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from output_uris import CANARY, GOOD, MALFORMED
from trainflow.core import InvalidRequest, build_trainjob, local_catalog, storage, storage_errors
from trainflow.core.output_uri import BadOutputURI, check, redact, s3_location
from trainflow.core.runtimes import find_runtime

TORCH = find_runtime(local_catalog(), "torch-distributed")


@pytest.mark.parametrize(("uri", "word"), MALFORMED)
def test_the_core_request_validation_refuses_it_naming_the_field(uri: str, word: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "job", "command": ["true"], "output_uri": uri}, TORCH)
    assert err.value.fields == ["output_uri"], err.value
    assert word in str(err.value) and CANARY not in str(err.value)


@pytest.mark.parametrize("uri", GOOD)
def test_the_plain_forms_are_taken(uri: str) -> None:
    check(uri)
    build_trainjob({"name": "job", "command": ["true"], "output_uri": uri}, TORCH)


def test_the_whole_path_after_the_bucket_is_the_key_prefix() -> None:
    assert s3_location("s3://bkt/models/run 1") == ("bkt", "models/run 1")
    assert s3_location("s3://bkt/%2e%2e") == ("bkt", "%2e%2e")
    for uri, _ in MALFORMED:
        if uri.startswith("s3:"):
            with pytest.raises(storage.StorageError):
                storage.split(uri)
            with pytest.raises(BadOutputURI):
                s3_location(uri)


def test_userinfo_is_stripped_from_every_endpoint_shown() -> None:
    env = {"AWS_ENDPOINT_URL": f"http://user:{CANARY}@127.0.0.1:9"}
    assert storage_errors.endpoint(env) == "http://127.0.0.1:9"
    error = storage_errors.fail(
        "reading", "s3://bkt/run", env, OSError(f"GET http://user:{CANARY}@127.0.0.1:9/bkt")
    )
    assert CANARY not in str(error) and "127.0.0.1:9" in str(error)
    assert redact(f"see https://u:{CANARY}@h/x and s3://k@b/p") == "see https://h/x and s3://b/p"


@pytest.mark.parametrize(("uri", "word"), MALFORMED)
def test_the_kfp_step_refuses_it_before_submitting(
    uri: str, word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainflow.kfp.runner import run_train_job

    params = {
        "runtime": "torch-distributed",
        "command": ["true"],
        "output_uri": uri,
        "idempotency_key": "k",
        "backend": "local",
        "backend_config": {"home": str(tmp_path)},
    }
    with pytest.raises(SystemExit):
        run_train_job(params)
    out = capsys.readouterr().out
    assert "output_uri" in out and "nothing was submitted" in out and CANARY not in out
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize(("uri", "word"), MALFORMED[:4] + MALFORMED[8:10] + MALFORMED[15:16])
def test_the_cli_refuses_it_and_starts_nothing(uri: str, word: str, tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "trainflow"
    proc = subprocess.run(
        [
            str(exe),
            "--backend",
            "local",
            "--home",
            str(tmp_path),
            "submit",
            "--set",
            f"output_uri={uri}",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "output_uri" in proc.stderr and CANARY not in proc.stderr + proc.stdout
    assert not (tmp_path / "jobs").exists() or not any(p.is_dir() for p in (tmp_path / "jobs").rglob("*"))
