"""Turn API server errors into trainflow errors that name the request field or the denied permission."""

from __future__ import annotations

import json
import re
from typing import Any

from trainflow.core.errors import (
    AlreadyExists,
    BackendError,
    FieldIssue,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    TrainflowError,
    TrainJobNotFound,
    Transient,
    Unauthorized,
)
from trainflow.core.kube.retry import is_connection_error, status_of

# Manifest path prefix -> TrainJobRequest field (longest prefix wins).
FIELD_MAP: tuple[tuple[str, str], ...] = (
    ("metadata.name", "name"),
    ("metadata.namespace", "namespace"),
    ("metadata.labels", "labels"),
    ("metadata.annotations", "annotations"),
    ("spec.runtimeRef", "runtime"),
    ("spec.trainer.image", "image"),
    ("spec.trainer.command", "command"),
    ("spec.trainer.args", "args"),
    ("spec.trainer.env", "env"),
    ("spec.trainer.numNodes", "num_nodes"),
    ("spec.trainer.numProcPerNode", "proc_per_node"),
    ("spec.trainer.resourcesPerNode", "resources"),
    ("spec.trainer", "image"),
    ("spec.initializer.dataset.secretRef", "dataset_secret"),
    ("spec.initializer.dataset", "dataset_uri"),
    ("spec.initializer.model.secretRef", "model_secret"),
    ("spec.initializer.model", "model_uri"),
    ("spec.runtimePatches", "runtime_patches"),
    ("spec.suspend", "suspend"),
    ("spec.activeDeadlineSeconds", "deadline_seconds"),
    ("spec.managedBy", "runtime_patches"),
)
# Inside runtimePatches, these pod-spec keys come from first-class request fields.
PATCH_KEYS: tuple[tuple[str, str], ...] = (
    ("nodeSelector", "node_selector"),
    ("tolerations", "tolerations"),
    ("serviceAccountName", "service_account"),
    ("imagePullSecrets", "image_pull_secrets"),
    ("volumeMounts", "volumes"),
    ("volumes", "volumes"),
)
_PATH_IN_TEXT = re.compile(r"\b((?:spec|metadata)(?:\.[A-Za-z0-9_]+|\[[^\]]*\])+)")
_ENV_NAMES = re.compile(r"\b(PET_[A-Z_]+|DMLC_[A-Z_]+|OMPI_MCA_[A-Za-z_]+|JAX_[A-Z_]+)\b")


def body_of(exc: BaseException) -> dict[str, Any]:
    """The ``Status`` object the API server sent, or {} when the body is not JSON."""
    raw = getattr(exc, "body", None)
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def server_message(exc: BaseException) -> str:
    body = body_of(exc)
    text = body.get("message") or getattr(exc, "reason", None) or str(exc)
    return str(text)[:1000]


def request_field(path: str) -> str:
    """The TrainJobRequest field behind a manifest path such as ``spec.trainer.env[0].name``."""
    plain = re.sub(r"\[[^\]]*\]", "", path.strip())
    if plain.startswith("spec.runtimePatches"):
        for key, field in PATCH_KEYS:
            if f".{key}" in plain:
                return field
        if ".metadata.labels" in plain:
            return "labels"
        if ".metadata.annotations" in plain:
            return "annotations"
    best = ""
    field = ""
    for prefix, name in FIELD_MAP:
        if (plain == prefix or plain.startswith(prefix + ".")) and len(prefix) > len(best):
            best, field = prefix, name
    return field or plain or "request"


def invalid_from_status(exc: BaseException) -> InvalidRequest:
    """422 Invalid / 400 BadRequest / webhook denial -> InvalidRequest naming each field the server named."""
    body = body_of(exc)
    message = server_message(exc)
    causes = ((body.get("details") or {}).get("causes")) or []
    issues: list[FieldIssue] = []
    for cause in causes:
        if not isinstance(cause, dict):
            continue
        path = str(cause.get("field") or "")
        text = str(cause.get("message") or cause.get("reason") or message)
        if not path or path == "<nil>":
            found = _PATH_IN_TEXT.search(text)
            path = found.group(1) if found else ""
        field = request_field(path) if path else _field_from_text(text)
        where = f" ({path})" if path else ""
        issues.append(FieldIssue(field, f"rejected by the API server{where}: {text[:500]}", _fix_for(field)))
    if not issues:
        found = _PATH_IN_TEXT.search(message)
        field = request_field(found.group(1)) if found else _field_from_text(message)
        issues.append(FieldIssue(field, f"rejected by the API server: {message}", _fix_for(field)))
    return InvalidRequest(issues)


def _field_from_text(text: str) -> str:
    if _ENV_NAMES.search(text):
        return "env"
    lowered = text.lower()
    if "runtime" in lowered:
        return "runtime"
    if "storageuri" in lowered:
        return "dataset_uri"
    return "request"


def _fix_for(field: str) -> str:
    return {
        "env": "remove names the Trainer injects itself (PET_*, DMLC_*, OMPI_MCA_*, JAX_*)",
        "runtime": "use a runtime that exists in the cluster (trainflow runtimes)",
        "name": "use a short RFC 1035 name (lowercase letters, digits, '-', starting with a letter)",
    }.get(field, "fix the field as the server says")


def is_webhook_denial(exc: BaseException) -> bool:
    return "admission webhook" in server_message(exc)


class Gone(BackendError):
    """HTTP 410: the resourceVersion a watch started from is too old; list again."""


def translate(
    exc: Exception, verb: str, resource: str, namespace: str | None, name: str | None = None
) -> Exception:
    """The one mapping of an API failure to a trainflow error; every KubeApi call goes through it.

    404 -> TrainJobNotFound / NotFound, 403 -> PermissionDenied (or InvalidRequest for a webhook denial),
    400/422 -> InvalidRequest naming the request field, 409 -> AlreadyExists, 410 -> Gone, a lost answer
    of a create -> OutcomeUnknown, any other status -> BackendError with the server's message. Anything that
    is neither an API answer nor a transport failure (a programming error) is returned unchanged.
    """
    if isinstance(exc, TrainflowError):
        return exc
    target = f"{resource}/{name}" if name else resource
    where = f" in namespace {namespace!r}" if namespace else ""
    status = status_of(exc)
    if status is None and not is_connection_error(exc):
        return exc
    if status is None or status == 0:  # 0: kubernetes_asyncio's wrapper for a transport failure
        if verb == "create":
            return OutcomeUnknown(f"create {target}{where}: the answer was lost ({exc!r})")
        return Transient(f"{verb} {target}{where}: the API server could not be reached ({exc!r})")
    if status == 404:
        if resource == "trainjobs" and name:
            return TrainJobNotFound(namespace or "", name)
        return NotFound(f"{target} not found{where}")
    if status == 403 and not is_webhook_denial(exc):
        return PermissionDenied(
            f"permission denied: cannot {verb} {target}{where} "
            f"(grant the verb {verb!r} on {resource} to this identity): {server_message(exc)}"
        )
    if status in (400, 422) or (status == 403 and is_webhook_denial(exc)):
        return invalid_from_status(exc)
    if status == 409:
        return AlreadyExists(f"{target}{where} already exists")
    if status == 410:
        return Gone(f"{verb} {target}{where}: {server_message(exc)}")
    if status == 401:
        return Unauthorized(f"unauthorized: the API server rejected the credentials: {server_message(exc)}")
    if status == 429 or status >= 500:
        return Transient(f"{verb} {target}{where} failed: HTTP {status}: {server_message(exc)}")
    return BackendError(f"{verb} {target}{where} failed: HTTP {status}: {server_message(exc)}")
