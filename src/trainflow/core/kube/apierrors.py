"""Turn API server errors into trainflow errors that name the request field or the denied permission."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
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
from trainflow.core.kube.retry import is_connection_error, status_of, tls_failure

API_OF = {
    "trainjobs": "trainjobs.trainer.kubeflow.org/v1alpha1 (the TrainJob API)",
    "trainingruntimes": "trainingruntimes.trainer.kubeflow.org/v1alpha1",
    "clustertrainingruntimes": "clustertrainingruntimes.trainer.kubeflow.org/v1alpha1",
}
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


def invalid_from_status(exc: BaseException, sent: Mapping[str, Any] | None = None) -> InvalidRequest:
    """422 Invalid / 400 BadRequest / webhook denial -> InvalidRequest naming each field the server named.

    ``sent``: the manifest of the request, so a path resolves to the field as the user wrote it.
    """
    from trainflow.core.fields import (
        request_fields,
    )  # on a rejection only, not by every waiter

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
        fields = request_fields(path, sent, text) if path else [_field_from_text(text)]
        where = f" ({path})" if path else ""
        for field in fields:
            issues.append(
                FieldIssue(field, f"rejected by the API server{where}: {text[:500]}", _fix_for(field))
            )
    if not issues:
        found = _PATH_IN_TEXT.search(message)
        fields = request_fields(found.group(1), sent, message) if found else [_field_from_text(message)]
        for field in fields:
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
    }.get(field.split(".")[0], "fix the field as the server says")


def described(exc: BaseException) -> str:
    """An error's type and message, never its repr: transport errors' reprs carry request headers (credentials)."""
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_webhook_denial(exc: BaseException) -> bool:
    return "admission webhook" in server_message(exc)


class Gone(BackendError):
    """HTTP 410: the resourceVersion a watch started from is too old; list again."""


def translate(
    exc: Exception,
    verb: str,
    resource: str,
    namespace: str | None,
    name: str | None = None,
    *,
    sent: Mapping[str, Any] | None = None,
) -> Exception:
    """The one mapping of an API failure to a trainflow error; every KubeApi call goes through it.

    404 -> TrainJobNotFound / NotFound, 403 -> PermissionDenied (or InvalidRequest for a webhook denial),
    400/422 -> InvalidRequest naming the request field, 409 -> AlreadyExists, 410 -> Gone, a lost answer
    of a create -> OutcomeUnknown, any other status -> BackendError with the server's message. Anything that
    is neither an API answer nor a transport failure (a programming error) is returned unchanged. ``sent``: the
    object a create or patch sent, to name the request field behind each path the server names.
    """
    if isinstance(exc, TrainflowError):
        return exc
    target = f"{resource}/{name}" if name else resource
    where = f" in namespace {namespace!r}" if namespace else ""
    tls = tls_failure(exc)
    if tls is not None:
        return BackendError(
            f"{verb} {target}{where}: the API server's certificate does not verify ({getattr(tls, 'verify_message', None) or tls}); "
            "check the kubeconfig's certificate-authority and tls-server-name"
        )
    status = status_of(exc)
    if status is None and not is_connection_error(exc):
        return exc
    if status is None or status == 0:
        if verb == "create":
            return OutcomeUnknown(f"create {target}{where}: the answer was lost ({described(exc)})")
        return Transient(f"{verb} {target}{where}: the API server could not be reached ({described(exc)})")
    if status == 404:
        if resource == "trainjobs" and name:
            return TrainJobNotFound(namespace or "", name)
        if name is None and resource in API_OF:  # a list or watch: the resource type itself is not served
            return NotFound(
                f"cannot {verb} {resource}{where}: the API server does not serve {API_OF[resource]} "
                "(HTTP 404): is Kubeflow Trainer v2 installed in this cluster?"
            )
        return NotFound(f"{target} not found{where}")
    if status == 403 and not is_webhook_denial(exc):
        return PermissionDenied(
            f"permission denied: cannot {verb} {target}{where} "
            f"(grant the verb {verb!r} on {resource} to this identity): {server_message(exc)}"
        )
    if status in (400, 422) or (status == 403 and is_webhook_denial(exc)):
        return invalid_from_status(exc, sent)
    if status == 409:
        return AlreadyExists(f"{target}{where} already exists")
    if status == 410:
        return Gone(f"{verb} {target}{where}: {server_message(exc)}")
    if status == 401:
        return Unauthorized(f"unauthorized: the API server rejected the credentials: {server_message(exc)}")
    if status == 429 or status >= 500:
        return Transient(f"{verb} {target}{where} failed: HTTP {status}: {server_message(exc)}")
    return BackendError(f"{verb} {target}{where} failed: HTTP {status}: {server_message(exc)}")
