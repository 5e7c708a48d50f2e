"""Object-store outputs: a trainer's model to an ``s3://`` ``output_uri``, and a later step's read of it.

A trainer writes its model into ``output_dir()`` whatever the output URI. For ``s3://`` that directory is a
private staging directory, and ``publish_output()`` uploads it under the URI (a function trainer's wrapper calls
it on rank 0 once the function returns; other trainers call it themselves). ``download()`` copies the objects
under a URI into a directory: how a downstream Airflow task or KFP step loads the model.

Credentials and endpoint come only from the process env, under the AWS SDK's names: a TrainJob's trainer gets
them from ``secret_env`` (Kubernetes Secret references), never as plain values. Read here:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION or AWS_DEFAULT_REGION, and
AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible store. The client is Apache OpenDAL (extra
``s3``), the library the Trainer's own initializers read objects with, so both ends sign requests alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from trainflow.core.reporting import OUTPUT_ENV, is_rank0, staging_dir

SCHEMES = ("s3",)
CHUNK = 8 * 1024 * 1024
DEFAULT_REGION = "us-east-1"


class StorageError(RuntimeError):
    """An object-store read or write failed; the message names the URI and the endpoint, never a credential."""


def is_object_uri(uri: str | None) -> bool:
    return bool(uri) and urlparse(str(uri)).scheme.lower() in SCHEMES


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at the ends)."""
    parsed = urlparse(uri)
    if parsed.scheme.lower() not in SCHEMES or not parsed.netloc or "@" in parsed.netloc:
        raise StorageError(f"{uri[:120]!r} is not s3://bucket/prefix")
    return parsed.netloc, parsed.path.strip("/")


def _endpoint(env: Mapping[str, str]) -> str | None:
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def _operator(bucket: str, env: Mapping[str, str]) -> Any:
    try:
        import opendal
    except ImportError as e:
        raise StorageError("s3:// outputs need OpenDAL: pip install 'trainflow[s3]'") from e
    config = {"bucket": bucket, "root": "/"}
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    config["region"] = region
    endpoint = _endpoint(env)
    if endpoint:
        config["endpoint"] = endpoint
    for name, key in (
        ("AWS_ACCESS_KEY_ID", "access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
        ("AWS_SESSION_TOKEN", "session_token"),
    ):
        if env.get(name):
            config[key] = env[name]
    return opendal.Operator("s3", **config).layer(opendal.layers.RetryLayer(max_times=3, jitter=True))


def _fail(action: str, uri: str, env: Mapping[str, str], exc: Exception) -> StorageError:
    where = _endpoint(env) or "AWS S3"
    reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return StorageError(f"{action} {uri} at {where} failed: {type(exc).__name__}: {reason}")


def _key(prefix: str, rel: PurePosixPath) -> str:
    return f"{prefix}/{rel}" if prefix else str(rel)


def upload(local: Path, uri: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Every regular file under ``local`` to ``uri``/<relative path>; returns the relative paths.

    Symlinks are refused, not followed: only what the trainer wrote goes out."""
    env = os.environ if env is None else env
    bucket, prefix = split(uri)
    files: list[tuple[Path, PurePosixPath]] = []
    for path in sorted(local.rglob("*")):
        if path.is_symlink():
            raise StorageError(f"{path} is a symlink; output_dir() must hold the files themselves")
        if path.is_file():
            files.append((path, PurePosixPath(path.relative_to(local).as_posix())))
    op = _operator(bucket, env)
    try:
        for path, rel in files:
            with path.open("rb") as src, op.open(_key(prefix, rel), "wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
    except Exception as e:
        raise _fail("writing", uri, env, e) from None
    return [str(rel) for _, rel in files]


def download(uri: str, dest: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """Every object under ``uri`` into ``dest`` (created); returns the relative paths. Raises StorageError when
    there is none: a missing model must not read as an empty one."""
    env = os.environ if env is None else env
    bucket, prefix = split(uri)
    op = _operator(bucket, env)
    got: list[str] = []
    try:
        listing = op.list(f"{prefix}/" if prefix else "", recursive=True)
        for entry in listing:
            if entry.metadata.is_dir:
                continue
            rel = PurePosixPath(entry.path[len(prefix) :].lstrip("/") if prefix else entry.path)
            if not rel.parts or rel.is_absolute() or ".." in rel.parts:
                raise StorageError(f"object {entry.path!r} under {uri} has an unsafe name")
            target = dest.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with op.open(entry.path, "rb") as src, target.open("wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
            got.append(str(rel))
    except StorageError:
        raise
    except Exception as e:
        raise _fail("reading", uri, env, e) from None
    if not got:
        raise StorageError(f"no object under {uri} at {_endpoint(env) or 'AWS S3'}: check the URI")
    return sorted(got)


def publish_output(env: Mapping[str, str] | None = None, directory: Path | None = None) -> list[str]:
    """Upload ``directory`` (default: what ``output_dir()`` staged) to the ``s3://`` output URI, rank 0 only;
    returns the files uploaded. Nothing to do for a local output URI or another rank."""
    env = os.environ if env is None else env
    uri = env.get(OUTPUT_ENV, "")
    if not is_object_uri(uri) or not is_rank0():
        return []
    source = staging_dir(create=False) if directory is None else directory
    if source is None or not source.is_dir():
        where = "trainflow.core.output_dir()" if directory is None else str(directory)
        raise StorageError(f"{where} is missing: nothing to publish to {uri}; write the model there")
    files = upload(source, uri, env)
    if not files:
        raise StorageError(f"{source} is empty: nothing to publish to {uri}")
    print(f"trainflow: published {len(files)} file(s) to {uri}", flush=True)
    return files
