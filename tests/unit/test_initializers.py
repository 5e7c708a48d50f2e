"""Issue 11.5: initializer settings and credentials, in the env names the initializer images read.

The env names are those of Trainer v2.3.0 ``pkg/initializers`` (STORAGE_URI, IGNORE_PATTERNS, ENDPOINT,
REGION, ROLE_ARN, ACCESS_TOKEN, ACCESS_KEY_ID, SECRET_ACCESS_KEY); the pods the real Trainer makes
from them are compared with the Kubeflow SDK's in tests/differential.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainflow.core import InvalidRequest, build_trainjob, local_catalog
from trainflow.core.runtimes import find_runtime

TT = "torchtune-llama3.2-1b"


def spec(request: dict[str, Any], runtime: str = TT) -> dict[str, Any]:
    return dict(build_trainjob({"name": "i", **request}, find_runtime(local_catalog(), runtime))["spec"])


def refused(request: dict[str, Any], runtime: str = TT) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        build_trainjob({"name": "i", **request}, find_runtime(local_catalog(), runtime))
    return err.value


def test_s3_settings_are_values_and_credentials_are_secret_references() -> None:
    out = spec(
        {
            "dataset_uri": "s3://bucket/ds",
            "dataset_options": {
                "endpoint": "http://minio:9000",
                "region": "eu-west-1",
                "ignore_patterns": ["*.md", "x/*"],
            },
            "dataset_secret_env": {
                "access_key_id": "minio/id",
                "secret_access_key": {"name": "minio", "key": "secret"},
            },
        }
    )["initializer"]["dataset"]
    assert out == {
        "storageUri": "s3://bucket/ds",
        "env": [
            {"name": "ENDPOINT", "value": "http://minio:9000"},
            {"name": "REGION", "value": "eu-west-1"},
            {"name": "IGNORE_PATTERNS", "value": "*.md,x/*"},
            {"name": "ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "minio", "key": "id"}}},
            {"name": "SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "minio", "key": "secret"}}},
        ],
    }


def test_model_download_skips_duplicate_weight_formats_by_default_as_the_sdk_does() -> None:
    model = spec(
        {"model_uri": "hf://meta-llama/Llama-3.2-1B-Instruct", "model_secret_env": {"access_token": "hf/t"}}
    )
    assert model["initializer"]["model"]["env"] == [
        {"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"},
        {"name": "ACCESS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
    ]
    everything = spec({"model_uri": "hf://org/m", "model_options": {"ignore_patterns": []}})
    assert everything["initializer"]["model"]["env"] == [{"name": "IGNORE_PATTERNS", "value": ""}]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (
            {"model_uri": "hf://o/m", "model_options": {"access_token": "hf_abc"}},
            "model_options.access_token",
        ),
        (
            {"dataset_uri": "s3://b/k", "dataset_options": {"secret_access_key": "x"}},
            "dataset_options.secret_access_key",
        ),
        (
            {"dataset_uri": "hf://o/d", "dataset_options": {"endpoint": "http://x"}},
            "dataset_options.endpoint",
        ),
        ({"dataset_uri": "s3://b/k", "dataset_options": {"region": ["a", "b"]}}, "dataset_options.region"),
        (
            {"dataset_uri": "hf://o/d", "dataset_secret_env": {"access_key_id": "s/k"}},
            "dataset_secret_env.access_key_id",
        ),
        ({"model_options": {"ignore_patterns": ["*.bin"]}}, "model_options"),
        ({"dataset_secret_env": {"access_token": "s/k"}}, "dataset_secret_env"),
        (
            {"model_uri": "hf://o/m", "model_secret_env": {"access_token": "Bad_Name/k"}},
            "model_secret_env.access_token.name",
        ),
    ],
)
def test_bad_settings_name_the_field(request_: dict[str, Any], field: str) -> None:
    err = refused(request_)
    assert err.fields == [field]
    assert "hf_abc" not in str(err)


def test_an_initializer_the_runtime_lacks_is_refused_as_the_trainer_refuses_it() -> None:
    err = refused({"command": ["torchrun", "t.py"], "model_uri": "hf://o/m"}, "torch-distributed")
    assert err.fields == ["model_uri"]
    assert "ignored" not in str(err) and "Trainer refuses" in str(err)


def test_a_runtime_whose_initializer_cannot_get_a_storage_uri_is_refused() -> None:
    """torch-distributed-with-cache: its dataset step reads STORAGE_URI, which nothing can set (v2.3.0)."""
    err = refused({"command": ["torchrun", "t.py"]}, "torch-distributed-with-cache")
    assert err.fields == ["runtime"]
    assert "STORAGE_URI" in str(err)
    err = refused(
        {"command": ["torchrun", "t.py"], "dataset_uri": "cache://s/t"}, "torch-distributed-with-cache"
    )
    assert err.fields == ["dataset_uri"] and "volumeMount" in str(err)


def test_the_runtimes_own_storage_uri_is_enough() -> None:
    out = spec({"args": ["epochs=1"]})
    assert "initializer" not in out
