"""Object-store outputs: a trainer's model published to an ``s3://`` ``output_uri`` as one transaction, and a later
step's read of exactly what was committed.

A trainer writes its model into ``output_dir()`` whatever the output URI. For ``s3://`` that directory is a
private staging directory, and ``publish_output()`` uploads it (a function trainer's wrapper calls it on rank 0
once the function returns; other trainers call it themselves). A publish writes every file under a sub-prefix
of its own (``<prefix>/trainflow-attempts/<attempt>/``), aborting on any error, then writes the manifest
(``<prefix>/trainflow-manifest.json``: each file's path, size and SHA-256) last: that one PUT is the commit,
and only then is the previous attempt deleted. ``download()`` reads through the manifest and verifies each
file; docs/artifacts.md is the contract (layout, manifest fields, what a reader sees, what a crash leaves).

Credentials and endpoint come only from the process env, under the AWS SDK's names: a TrainJob's trainer gets
them from ``secret_env`` (Kubernetes Secret references), never as plain values. Read here:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION or AWS_DEFAULT_REGION, and
AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible store. The client is Apache OpenDAL (extra
``s3``), the library the Trainer's own initializers read objects with, so both ends sign requests alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import urlparse

from trainflow.core import artifact
from trainflow.core.output_uri import BadOutputURI, redact, s3_location
from trainflow.core.storage_errors import NoManifest as NoManifest
from trainflow.core.storage_errors import StorageError as StorageError
from trainflow.core.storage_errors import endpoint, fail
from trainflow.core.storage_errors import not_found as not_found
from trainflow.core.storage_errors import reason as reason

SCHEMES = ("s3",)
CHUNK = 8 * 1024 * 1024
# multipart parts of 16 MiB, 4 in flight: about boto3's own upload speed (docs/benchmarks.md) for 64 MiB held
UPLOAD_PART, UPLOAD_CONCURRENCY = 16 * 1024 * 1024, 4
DEFAULT_REGION = "us-east-1"
READ_ROUNDS = (
    5  # a reader restarts when a retrain replaced the model under it; more replacements than this fail
)


class _Vanished(Exception):
    """A committed file disappeared while being read: a retrain replaced the model under the reader."""


def is_object_uri(uri: str | None) -> bool:
    return bool(uri) and urlparse(str(uri)).scheme.lower() in SCHEMES


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix exactly as written); StorageError for any other form."""
    try:
        return s3_location(uri)
    except BadOutputURI as e:
        raise StorageError(f"{redact(str(e))} (see docs/artifacts.md)") from None


def operator(bucket: str, env: Mapping[str, str]) -> Any:
    try:
        import opendal
    except ImportError as e:
        raise StorageError("s3:// outputs need OpenDAL: pip install 'trainflow[s3]'") from e
    config = {"bucket": bucket, "root": "/"}
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    config["region"] = region
    url = endpoint(env)
    if url:
        config["endpoint"] = url
    for name, key in (
        ("AWS_ACCESS_KEY_ID", "access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
        ("AWS_SESSION_TOKEN", "session_token"),
    ):
        if env.get(name):
            config[key] = env[name]
    return opendal.Operator("s3", **config).layer(opendal.layers.RetryLayer(max_times=3, jitter=True))


def local_files(local: Path) -> list[tuple[Path, str]]:
    """Every regular file under ``local`` with its relative path; symlinks are refused, not followed."""
    files: list[tuple[Path, str]] = []
    for path in sorted(local.rglob("*")):
        if path.is_symlink():
            raise StorageError(f"{path} is a symlink; output_dir() must hold the files themselves")
        if path.is_file():
            files.append((path, PurePosixPath(path.relative_to(local).as_posix()).as_posix()))
    return files


def put_stream(op: Any, key: str, src: BinaryIO) -> tuple[int, str]:
    """Copy ``src`` to the object ``key``; returns (size, SHA-256). On any error the writer is dropped without
    being closed, so the store never commits the object (a multipart upload is never completed)."""
    digest, size = hashlib.sha256(), 0
    writer = op.open(key, "wb", chunk=UPLOAD_PART, concurrent=UPLOAD_CONCURRENCY)
    try:
        while chunk := src.read(CHUNK):
            writer.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        writer.close()
    except BaseException:
        del writer  # not closed: closing is what commits the object
        raise
    return size, digest.hexdigest()


def _read_manifest(op: Any, uri: str, prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    try:
        raw = bytes(op.read(artifact.manifest_key(prefix)))
    except Exception as e:
        if not_found(e):
            raise NoManifest(
                f"no trainflow manifest at {uri}/{artifact.MANIFEST} ({endpoint(env) or 'AWS S3'}): the output is "
                "incomplete (its publish failed or is still running) or was not written by trainflow; "
                "to read a plain prefix written by someone else use download(..., plain=True)"
            ) from None
        raise fail("reading the manifest of", uri, env, e) from None
    try:
        return artifact.parse_manifest(raw, uri)
    except artifact.ManifestError as e:
        raise NoManifest(str(e)) from None


def _committed_attempt(op: Any, prefix: str) -> str | None:
    """The attempt the current manifest names, None when there is none (or it is unreadable as one)."""
    try:
        return artifact.named_attempt(bytes(op.read(artifact.manifest_key(prefix))))
    except Exception as e:
        if not_found(e):
            return None
        raise


def delete_quietly(op: Any, keys: list[str]) -> None:
    for key in keys:  # best effort: an uncommitted or replaced attempt's objects are never read
        with contextlib.suppress(Exception):
            op.delete(key)


def attempt_keys(op: Any, prefix: str, attempt: str) -> list[str]:
    try:
        return [
            e.path
            for e in op.list(f"{prefix}/{artifact.ATTEMPTS}/{attempt}/", recursive=True)
            if not e.path.endswith("/")
        ]
    except Exception:
        return []


def put_files(
    op: Any, uri: str, prefix: str, attempt: str, files: list[tuple[Path, str]], env: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Write ``files`` under the attempt's sub-prefix; their manifest entries (path, size, sha256). On any error
    what was written is deleted and StorageError names the URI."""
    written: list[str] = []
    entries: list[dict[str, Any]] = []
    try:
        for path, rel in files:
            key = artifact.file_key(prefix, attempt, rel)
            written.append(key)
            with path.open("rb") as src:
                size, sha = put_stream(op, key, src)
            entries.append({"path": rel, "size": size, "sha256": sha})
    except Exception as e:
        delete_quietly(op, written)
        raise fail("publishing", uri, env, e) from None
    return entries


def commit(
    op: Any,
    uri: str,
    prefix: str,
    attempt: str,
    entries: list[dict[str, Any]],
    env: Mapping[str, str],
    job: Mapping[str, str | None] | None = None,
) -> None:
    """Write the manifest naming ``entries`` of ``attempt`` (the commit), then delete the attempt it replaced.
    On an error this attempt's objects are deleted (unless the manifest may have landed) and StorageError
    names the URI: a reader still sees the previous model, or none."""
    try:
        previous = _committed_attempt(op, prefix)
    except Exception as e:
        delete_quietly(op, attempt_keys(op, prefix, attempt))
        raise fail("publishing", uri, env, e) from None
    manifest = artifact.build(uri, attempt, entries, job if job is not None else artifact.job_identity(env))
    try:
        op.write(artifact.manifest_key(prefix), manifest)
    except Exception as e:
        error = fail("committing the manifest of", uri, env, e)
        try:  # the PUT may have landed with its answer lost: then this attempt is the model
            committed = _committed_attempt(op, prefix)
        except Exception:
            raise error from None  # unknown: keep the files, an orphan is never read
        if committed != attempt:
            delete_quietly(op, attempt_keys(op, prefix, attempt))
            raise error from None
    if previous and previous != attempt:
        delete_quietly(op, attempt_keys(op, prefix, previous))


def upload(
    local: Path,
    uri: str,
    env: Mapping[str, str] | None = None,
    *,
    job: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Publish every regular file under ``local`` to ``uri`` as one transaction; returns the relative paths.

    The files go under the attempt's own sub-prefix, the manifest naming them is written last (the commit), and
    the previous attempt is deleted only after it. On any error before the commit this attempt's objects are
    deleted and StorageError names the URI: a reader still sees the previous model, or none."""
    env = os.environ if env is None else env
    bucket, prefix = split(uri)
    files = local_files(local)
    if not files:
        raise StorageError(f"{local} is empty: nothing to publish to {uri}")
    op = operator(bucket, env)
    attempt = artifact.new_attempt()
    entries = put_files(op, uri, prefix, attempt, files, env)
    commit(op, uri, prefix, attempt, entries, env, job)
    return [e["path"] for e in entries]


def read_manifest(uri: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The committed manifest at ``uri`` (checked); StorageError when there is none."""
    env = os.environ if env is None else env
    bucket, prefix = split(uri)
    return _read_manifest(operator(bucket, env), uri, prefix, env)


def committed_uri(uri: str, env: Mapping[str, str] | None = None) -> str:
    """The prefix holding exactly the committed files (``<uri>/trainflow-attempts/<attempt>``), for a reader that
    copies a plain prefix (the Trainer's initializers, the AWS CLI). It never changes, and is deleted when a
    later publish to ``uri`` commits."""
    return attempt_uri(uri, read_manifest(uri, env)["attempt"])


def attempt_uri(uri: str, attempt: str) -> str:
    """The prefix of one publish's files under ``uri`` (the layout of docs/artifacts.md)."""
    return f"{uri}/{artifact.ATTEMPTS}/{attempt}"


def _fetch(op: Any, key: str, target: Path, item: Mapping[str, Any], uri: str) -> None:
    digest, size = hashlib.sha256(), 0
    try:
        src = op.open(key, "rb")
    except Exception as e:
        if not_found(e):
            raise _Vanished(key) from None
        raise
    try:
        with target.open("xb") as out:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > item["size"]:
                    break
                digest.update(chunk)
                out.write(chunk)
    except Exception as e:
        if not_found(e):
            raise _Vanished(key) from None
        raise
    finally:
        src.close()
    if size != item["size"]:
        raise StorageError(
            f"{uri}: {item['path']} is not the committed file: size differs from the manifest's {item['size']}"
        )
    if digest.hexdigest() != item["sha256"]:
        raise StorageError(
            f"{uri}: {item['path']} is not the committed file: its SHA-256 differs from the manifest's"
        )


def _clear(dest: Path) -> None:
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _empty_dest(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise StorageError(f"{dest} is not empty: download into a new directory, so no other file mixes in")


def download(uri: str, dest: Path, env: Mapping[str, str] | None = None, *, plain: bool = False) -> list[str]:
    """The model committed at ``uri`` into ``dest`` (created, must be empty); returns the relative paths.

    Reads the manifest and exactly the files it names, each checked against its size and SHA-256; a retrain
    committing meanwhile restarts the read, so ``dest`` holds the old model or the new one, never a mix.
    ``plain=True`` is the escape hatch for a prefix trainflow did not write: every object under it, unchecked."""
    env = os.environ if env is None else env
    bucket, prefix = split(uri)
    _empty_dest(dest)
    op = operator(bucket, env)
    if plain:
        return _download_plain(op, uri, prefix, dest, env)
    for _ in range(READ_ROUNDS):
        manifest = _read_manifest(op, uri, prefix, env)
        try:
            for item in manifest["files"]:
                target = dest.joinpath(*item["path"].split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                _fetch(op, artifact.file_key(prefix, manifest["attempt"], item["path"]), target, item, uri)
        except _Vanished:
            _clear(dest)  # replaced under us: read the new manifest
            continue
        except StorageError:
            _clear(dest)
            raise
        except Exception as e:
            _clear(dest)
            raise fail("reading", uri, env, e) from None
        return sorted(item["path"] for item in manifest["files"])
    raise StorageError(f"{uri} was replaced {READ_ROUNDS} times while being read: try again")


def _download_plain(op: Any, uri: str, prefix: str, dest: Path, env: Mapping[str, str]) -> list[str]:
    got: list[str] = []
    try:
        for entry in op.list(f"{prefix}/", recursive=True):
            if entry.path.endswith("/"):
                continue
            rel = entry.path[len(prefix) + 1 :]
            if not artifact.safe_rel(rel):
                raise StorageError(f"object {entry.path!r} under {uri} has an unsafe name")
            target = dest.joinpath(*rel.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            with op.open(entry.path, "rb") as src, target.open("xb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
            got.append(rel)
    except StorageError:
        raise
    except Exception as e:
        raise fail("reading", uri, env, e) from None
    if not got:
        raise StorageError(f"no object under {uri} at {endpoint(env) or 'AWS S3'}: check the URI")
    return sorted(got)
