"""The strict form of an ``output_uri``, and endpoints shown without their userinfo.

An output URI names one place, literally: for ``s3://bucket/prefix`` the whole path after the bucket is the
key prefix, so a query string, a fragment, an empty, ``.`` or ``..`` segment (which a store or a policy could
read two ways) and the bucket root are refused, as are the same forms in a local path. See docs/artifacts.md.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# A bucket name as S3 and S3-compatible stores spell one (the store judges the finer rules); never a port, a user
# or ".." in it.
S3_BUCKET = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
MAX_PREFIX_BYTES = 900  # S3 keys are at most 1,024 bytes: room for trainflow's names under the prefix
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
URI_CREDENTIALS = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@")
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")


class BadOutputURI(ValueError):
    """An output URI in a form trainflow refuses: ``problem`` (naming the URI, without any credential in it)
    and ``fix``."""

    def __init__(self, uri: str, problem: str, fix: str) -> None:
        self.problem, self.fix = f"{redact(uri)[:100]!r} {problem}", fix
        super().__init__(f"{self.problem}; {fix}")


def _path_problem(path: str) -> tuple[str, str] | None:
    segments = path.split("/")
    if any(s == "" for s in segments):
        return (
            "has an empty path segment (// or a trailing /)",
            "write each segment once, without a trailing /",
        )
    if any(s in (".", "..") for s in segments):
        return (
            "has a '.' or '..' segment",
            "name the directory itself: the path is used literally, not resolved",
        )
    return None


def s3_location(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix), the prefix exactly as written; raises BadOutputURI."""
    if _CONTROL.search(uri):
        raise BadOutputURI(uri, "holds a control character", "remove it")
    scheme, sep, rest = uri.partition("://")
    if scheme.lower() != "s3" or not sep:
        raise BadOutputURI(uri, "is not an s3:// URI", "use s3://bucket/prefix")
    if "?" in rest:
        raise BadOutputURI(
            uri, "has a query string (?...)", "the whole path after the bucket is the key prefix: remove it"
        )
    if "#" in rest:
        raise BadOutputURI(
            uri, "has a fragment (#...)", "the whole path after the bucket is the key prefix: remove it"
        )
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        raise BadOutputURI(
            uri, "holds credentials (user@)", "give the trainer credentials through secret_env"
        )
    if not S3_BUCKET.match(bucket) or ".." in bucket:
        raise BadOutputURI(uri, f"has no valid bucket name ({bucket[:70]!r})", "use s3://bucket/prefix")
    if not prefix:
        raise BadOutputURI(uri, "names the bucket root", "write under a prefix: s3://bucket/models/run1")
    problem = _path_problem(prefix)
    if problem:
        raise BadOutputURI(uri, *problem)
    if len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise BadOutputURI(uri, f"has a key prefix over {MAX_PREFIX_BYTES} bytes", "use a shorter prefix")
    return bucket, prefix


def check(uri: str) -> None:
    """Raise BadOutputURI for an output URI trainflow refuses: credentials in it, neither a URI nor an absolute
    path, or (any scheme) a form that could name two places."""
    if URI_CREDENTIALS.match(uri):
        raise BadOutputURI(
            uri,
            "holds credentials (user:password@); they would be stored in the TrainJob in plain text",
            "remove them; give the trainer credentials through secret_env",
        )
    if _CONTROL.search(uri):
        raise BadOutputURI(uri, "holds a control character", "remove it")
    if not (URI.match(uri) or uri.startswith("/")):
        raise BadOutputURI(
            uri,
            "is neither a URI nor an absolute path",
            "e.g. s3://bucket/models/run1, pvc://claim/path or /mnt/models/run1",
        )
    if uri.startswith("/"):
        path = uri
    else:
        parts = urlsplit(uri)
        if parts.scheme.lower() == "s3":
            s3_location(uri)
            return
        if "?" in uri:
            raise BadOutputURI(uri, "has a query string (?...)", "the path is used literally: remove it")
        if "#" in uri:
            raise BadOutputURI(uri, "has a fragment (#...)", "the path is used literally: remove it")
        path = parts.path
        if parts.scheme.lower() != "file":
            path = path.lstrip("/")
            if not path:
                return  # another scheme's authority-only form (pvc://claim) is for its backend to judge
    if path == "/":
        raise BadOutputURI(uri, "names the root directory", "write under a directory: /mnt/models/run1")
    problem = _path_problem(path[1:] if path.startswith("/") else path)
    if problem:
        raise BadOutputURI(uri, *problem)


def redact(text: str) -> str:
    """``text`` with the userinfo (``user:password@``) of every URL in it removed."""
    return _USERINFO.sub(r"\1", text)
