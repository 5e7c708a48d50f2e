"""Step parameters -> TrainJobRequest fields (the TrainJob's identity is ``trainflow.kfp.identity``).

Which parameters are request fields is read from ``TrainJobRequest.model_fields``: a field added to the request
reaches the step as soon as the component has a parameter of that name (or through ``extra``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_UNRESOLVED = "{{$"
NUMERIC_ZERO_UNSET = (
    "num_nodes",
    "proc_per_node",
    "max_queue_seconds",
    "deadline_seconds",
)  # KFP int inputs: 0 means unset
STRUCT_FIELDS = ("function_kwargs", "env", "resources")
IDENTITY_PARAMS = ("idempotency_key", "run_id", "task_name")


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
