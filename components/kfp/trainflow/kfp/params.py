"""Step parameters -> TrainJobRequest fields, and the retry-stable identity of a step's TrainJob.

Which parameters are request fields is read from ``TrainJobRequest.model_fields``: a field added to the request
reaches the step as soon as the component has a parameter of that name (or through ``extra``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

_UNRESOLVED = "{{$"
NUMERIC_ZERO_UNSET = ("num_nodes", "proc_per_node", "deadline_seconds")  # KFP int inputs: 0 means unset
STRUCT_FIELDS = ("function_kwargs", "env", "resources")
IDENTITY_PARAMS = ("idempotency_key", "run_id", "task_name")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def invalid(field: str, problem: str, fix: str = "") -> Exception:
    from trainflow.core import InvalidRequest

    return InvalidRequest.one(field, problem, fix)


def clean(value: Any) -> Any:
    """KFP passes unset optional parameters as None, sometimes as empty text/collections: treat them alike."""
    if value is None:
        return None
    if isinstance(value, str) and (not value.strip() or value.startswith(_UNRESOLVED)):
        return None
    if isinstance(value, dict | list) and not value:
        return None
    return value


def resolved(value: str | None) -> str | None:
    """A KFP placeholder that the backend did not substitute arrives verbatim: treat it as missing."""
    cleaned = clean(value)
    return str(cleaned) if cleaned is not None else None


def task_root(artifact_uri: str | None) -> str | None:
    """The folder KFP gives this step's outputs: unique per run and task, the same on every retry.

    The KFP backend's driver provisions ``<root>/<pipeline>/<run id>/<task>/<uuid>/<artifact>`` once per task
    execution (a ``ParallelFor`` iteration is an execution of its own) and every retry of the step's pod gets
    that same executor input; kfp.local uses ``<root>/<pipeline>-<time>/[<loop>-iteration-<i>/]<task>/<artifact>``.
    """
    uri = resolved(artifact_uri)
    if not uri:
        return None
    parent = uri.rstrip("/").rpartition("/")[0]
    return None if not parent.strip("/") or parent.endswith(":/") else parent


def _task_label(root: str) -> str:
    """A readable name for the key: the task's folder, above the driver's per-execution uuid."""
    parts = [p for p in root.split("/") if p]
    if len(parts) > 1 and _UUID.match(parts[-1]):
        return parts[-2]
    return parts[-1] if parts else "kfp"


def identity_key(
    *,
    idempotency_key: str | None,
    run_id: str | None,
    task_name: str | None,
    params: Mapping[str, Any],
    artifact_uri: str | None = None,
) -> str | None:
    """Stable identity of this step's TrainJob, in this order: an explicit key; the KFP run id + task name
    (parameters or ``KFP_RUN_ID``/``KFP_TASK_NAME``); else the folder of the step's output artifacts.

    A parameter digest is part of the last two: it separates ParallelFor iterations that share a run and task
    name (and, on KFP backends before 2.4, one output folder), while a retry of the same step (same run, task,
    folder and arguments) gets the same key and therefore reattaches.
    """
    explicit = resolved(idempotency_key)
    if explicit:
        return explicit
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]
    run = resolved(run_id) or resolved(os.environ.get("KFP_RUN_ID"))
    task = resolved(task_name) or resolved(os.environ.get("KFP_TASK_NAME"))
    if run and task:
        return f"{task}/{run}/{digest}"
    root = task_root(artifact_uri)
    if root is None:
        return None
    where = hashlib.sha256(f"{root} {digest}".encode()).hexdigest()[:12]
    return f"{_task_label(root)}/{where}"


def integral_numbers(value: Any) -> Any:
    """KFP dict/list parameters travel as protobuf Struct, where every number is a double: 60 arrives as 60.0.

    Turn integral floats back into ints so ``range(epochs)`` in the trainer works as written.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_numbers(v) for v in value]
    return value


def build_request_fields(params: Mapping[str, Any]) -> dict[str, Any]:
    """Step parameters -> TrainJobRequest fields (unset parameters dropped so runtime defaults apply)."""
    from trainflow.core.request import TrainJobRequest

    fields: dict[str, Any] = {}
    for key in TrainJobRequest.model_fields:
        value = clean(params.get(key))
        if value is not None and key not in IDENTITY_PARAMS:
            fields[key] = value
    for key in STRUCT_FIELDS:
        if fields.get(key) is not None:
            fields[key] = integral_numbers(fields[key])
    for key in NUMERIC_ZERO_UNSET:
        if fields.get(key) == 0 and not isinstance(fields.get(key), bool):
            fields.pop(key)
    for key, value in integral_numbers(params.get("extra") or {}).items():
        if key in fields:
            raise invalid(f"extra.{key}", "is also given as a step parameter", "set it in one place")
        fields[key] = value
    return fields
