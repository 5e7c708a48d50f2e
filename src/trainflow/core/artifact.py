"""The artifact contract of an output URI: where a publish puts its files and the manifest that commits them.

Under an output prefix, each publish (attempt) writes its files below ``trainflow-attempts/<attempt>/`` and then
``trainflow-manifest.json``, which names the attempt and each file's relative path, size and SHA-256, the
TrainJob that published and the time. A reader trusts only what the manifest names. docs/artifacts.md is the
contract; ``storage`` applies it to an object store.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "trainflow-manifest.json"
ATTEMPTS = "trainflow-attempts"
FORMAT = "trainflow.artifact/v1"
ATTEMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
JOB_ENV = {
    "namespace": "TRAINFLOW_JOB_NAMESPACE",
    "name": "TRAINFLOW_JOB_NAME",
    "uid": "TRAINFLOW_JOB_UID",
    "attempt": "TRAINFLOW_JOB_ATTEMPT",
}
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ManifestError(ValueError):
    """A manifest that is malformed or names an unsafe path: the output cannot be trusted."""


def new_attempt() -> str:
    """A publish's own sub-prefix name: its UTC time (sorts by age) and 48 random bits."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(6)}"


def job_identity(env: Mapping[str, str]) -> dict[str, str | None]:
    """The TrainJob that published (namespace, name, uid, attempt) as far as the process env tells."""
    ident: dict[str, str | None] = {k: env.get(v) or None for k, v in JOB_ENV.items()}
    if ident["uid"] is None:
        ident["uid"] = env.get("TRAINFLOW_LOCAL_JOB_UID") or None
    if ident["namespace"] is None:
        with contextlib.suppress(OSError):
            ident["namespace"] = SA_NAMESPACE.read_text().strip() or None
    return ident


def manifest_key(prefix: str) -> str:
    """The manifest's key (or path) under an output prefix."""
    return f"{prefix}/{MANIFEST}"


def file_key(prefix: str, attempt: str, rel: str) -> str:
    """Where a committed file lives: under its attempt's own sub-prefix."""
    return f"{prefix}/{ATTEMPTS}/{attempt}/{rel}"


def safe_rel(path: Any) -> bool:
    """A relative path that stays under the directory it is joined to (no absolute, empty, . or .. part)."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def parse_manifest(raw: bytes, uri: str) -> dict[str, Any]:
    """A manifest's content, checked: a malformed or hostile one (unsafe paths, bad sizes) is an error."""
    bad = f"the manifest {uri}/{MANIFEST} is not a valid {FORMAT} manifest"
    try:
        data = json.loads(raw)
    except ValueError:
        raise ManifestError(f"{bad}: not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestError(f"{bad}: format is not {FORMAT!r}")
    attempt = data.get("attempt")
    if not isinstance(attempt, str) or not ATTEMPT_ID.match(attempt):
        raise ManifestError(f"{bad}: attempt {str(attempt)[:80]!r}")
    files = data.get("files")
    if not isinstance(files, list) or not files:
        raise ManifestError(f"{bad}: no files")
    seen: set[str] = set()
    for item in files:
        if not isinstance(item, dict) or not safe_rel(item.get("path")):
            raise ManifestError(f"{bad}: unsafe file entry {str(item)[:120]}")
        size, sha = item.get("size"), item.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{bad}: {item['path']!r} has size {size!r}")
        if not isinstance(sha, str) or not SHA256.match(sha):
            raise ManifestError(f"{bad}: {item['path']!r} has sha256 {str(sha)[:80]!r}")
        seen.add(item["path"])
    if len(seen) != len(files):
        raise ManifestError(f"{bad}: a path is listed twice")
    for path in seen:  # a file may not also be a directory of another (a and a/b)
        parent = PurePosixPath(path).parent
        while str(parent) != ".":
            if str(parent) in seen:
                raise ManifestError(f"{bad}: {str(parent)!r} is both a file and a directory")
            parent = parent.parent
    return data


def build(uri: str, attempt: str, files: Sequence[Mapping[str, Any]], job: Mapping[str, Any]) -> bytes:
    """A manifest committing ``files`` (path, size, sha256) of ``attempt`` at ``uri``."""
    data = {
        "format": FORMAT,
        "uri": uri,
        "attempt": attempt,
        "files": [dict(f) for f in files],
        "job": dict(job),
        "created": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    return json.dumps(data, indent=1).encode()


def named_attempt(raw: bytes) -> str | None:
    """The attempt a manifest names, or None when it is not readable as one."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    attempt = data.get("attempt") if isinstance(data, dict) else None
    return attempt if isinstance(attempt, str) and ATTEMPT_ID.match(attempt) else None
