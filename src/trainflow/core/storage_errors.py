"""What an object-store failure tells a user: the error types, the S3 call, status and code behind an OpenDAL error,
and the endpoint without its userinfo, so no message or log carries a credential."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from trainflow.core.output_uri import redact


class StorageError(RuntimeError):
    """An object-store read or write failed; the message names the URI and the endpoint, never a credential."""


class NoManifest(StorageError):
    """No committed manifest at the URI: the output is incomplete, still being published, or not trainflow's."""


def endpoint(env: Mapping[str, str]) -> str | None:
    """The endpoint without userinfo: SigV4 never uses it, and it must not reach a message or a log."""
    raw = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    if not raw:
        return None
    parts = urlsplit(raw)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


_OPENDAL_ERROR = re.compile(
    r"^(?P<kind>\w+ \((?:persistent|temporary)\) at \w+)(?:, context: \{(?P<context>.*)\})?"
)
_S3_CODE = re.compile(r'S3Error \{ code: "(?P<code>[^"]*)", message: "(?P<message>[^"]*)"')


def reason(exc: BaseException) -> str:
    """What an OpenDAL error says a user can act on: its kind, the S3 call, the HTTP status and the store's
    error code and message (``507 InsufficientStorage``, ``403 SignatureDoesNotMatch``), without the headers,
    request IDs and upload IDs that fill its first 300 characters; other errors' first line."""
    text = str(exc)
    if not text:
        return type(exc).__name__
    match = _OPENDAL_ERROR.match(text)
    if not match:
        return text.splitlines()[0][:300]
    parts = [match["kind"]]
    context = match["context"] or ""
    call = re.search(r"service_operation: (\w+)", context)
    status = re.search(r"status: (\d{3})", context)
    if call:
        parts.append(call[1])
    if status:
        parts.append(f"HTTP {status[1]}")
    s3 = _S3_CODE.search(text)
    if s3:
        parts.append(f"{s3['code']}: {s3['message'][:200]}")
    elif " => " in text:
        parts.append(text.rpartition(" => ")[2].splitlines()[0][:200])
    return ", ".join(parts)


def fail(action: str, uri: str, env: Mapping[str, str], exc: BaseException) -> StorageError:
    where = endpoint(env) or "AWS S3"
    reason_ = reason(exc)
    return StorageError(redact(f"{action} {uri} at {where} failed: {type(exc).__name__}: {reason_}"))


def not_found(exc: BaseException) -> bool:
    """OpenDAL's NotFound: its own exception, or an OSError naming it when a streaming read finds the object gone."""
    return type(exc).__name__ == "NotFound" or (isinstance(exc, OSError) and str(exc).startswith("NotFound"))
